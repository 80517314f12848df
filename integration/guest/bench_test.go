//go:build guest

package guest

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

const benchSize = 4 << 20

var flagBenchSample = flag.Bool("guest.bench-sample", true, "TestBench: sample lvm processes from /proc to show where the time goes")

// TestBench measures, in the guest, what the agent adds to lvmd:
//
//	(a) raw lvmd CreateLV / RemoveLV through lvmbackend.Topolvm,
//	(b) end to end through the agent: request written -> created / deleted seen,
//	(c) a burst of creates: all requests written -> all created,
//
// with the goals (b)/(a) <= 1.10 and (c)/(n x a) <= 1.05. Whatever the
// result, it prints the table and where the time goes: which lvm commands
// lvmd ran per request (sampled from /proc), the informer latency, and the
// agent's own view of its operations (its /metrics).
func TestBench(t *testing.T) {
	n, burst := *flagBenchN, *flagBenchBurst
	ctx := context.Background()
	const dc = "thick"
	vg := volumeGroup{spec: topolvmVG, vg: topolvmVG}
	t.Cleanup(func() { _, _ = lvm("lvremove", "-y", "-S", `lv_name=~"^bench-"`, topolvmVG) })
	r := &report{}

	// (a) lvmd alone.
	b, err := lvmbackend.NewTopolvm(env.socket)
	require.NoError(t, err)
	defer b.Close()
	_, err = b.ListVolumes(ctx, dc) // connect, warm lvm's caches
	require.NoError(t, err)
	var list, create, remove []time.Duration
	var lvmA []lvmRun
	raw := func(i int) {
		name := fmt.Sprintf("bench-raw-%02d", i)
		sm := startSampler()
		t0 := time.Now()
		_, err := b.ListVolumes(ctx, dc)
		require.NoError(t, err)
		list = append(list, time.Since(t0))
		t0 = time.Now()
		_, err = b.CreateVolume(ctx, lvmbackend.CreateRequest{DeviceClass: dc, Name: name, SizeBytes: benchSize, Tags: []string{"bench"}})
		require.NoError(t, err)
		create = append(create, time.Since(t0))
		t0 = time.Now()
		require.NoError(t, b.RemoveVolume(ctx, dc, name))
		remove = append(remove, time.Since(t0))
		lvmA = append(lvmA, sm.stop()...)
	}

	// Informer latency: a patch, until a watch started before it shows it.
	s := newTopolvmStack(t)
	s.node, s.short, s.metrics = "bench-node", "bench", "127.0.0.1:19812"
	ns := "bench"
	ping := harness.PVC(t, env.cp.Client, ns, "bench-ping", "nobody")
	var lat []time.Duration
	w, err := env.cp.Client.CoreV1().PersistentVolumeClaims(ns).Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", ping.Name).String(), ResourceVersion: ping.ResourceVersion})
	require.NoError(t, err)
	for i := 0; i < n; i++ {
		v := strconv.Itoa(i)
		t0 := time.Now()
		_, err := kube.UpdatePvcWithAnnotations(ctx, clientset.Wrap(env.cp.Client), ns, ping.Name, "", kube.Set(map[string]string{"bench/ping": v}), nil)
		require.NoError(t, err)
		for ev := range w.ResultChan() {
			if o, ok := ev.Object.(*corev1.PersistentVolumeClaim); ok && ev.Type == watch.Modified && o.Annotations["bench/ping"] == v {
				break
			}
		}
		lat = append(lat, time.Since(t0))
	}
	w.Stop()
	watchLat := median(lat)

	// (b) through the agent, one request at a time, each sample right
	// after one of (a): the guest's speed follows the host's load, so (a)
	// and (b) are taken side by side, not minutes apart. The agent is idle
	// during (a) but for its capacity poll, as it is between requests.
	// -v=2: the agent logs each delete's steps (agent-bench-node.log).
	s.args = append(s.args, "-v=2")
	s.startAgent(t, true)
	m0 := scrape(t, s.metrics)
	var e2eCreate, e2eDelete []time.Duration
	var lvmB []lvmRun
	var delSpans []span
	for i := 0; i < n; i++ {
		raw(i)
		name := fmt.Sprintf("bench-e2e-%02d", i)
		pvc := harness.PVC(t, env.cp.Client, ns, name, s.node)
		pv := harness.PV(t, env.cp.Client, name, s.node, kube.DefaultDriver, pvc)
		sm := startSampler()
		var t0 time.Time
		written := func(state, _ string) {
			if state == kube.StateCreating || state == kube.StateDeleting {
				t0 = time.Now()
			}
		}
		cctx, cancel := context.WithTimeout(ctx, requestTimeout)
		err := kube.CreateVolumeWithAnnotations(cctx, clientset.Wrap(env.cp.Client), ns, name, kube.CreateSpec{VolumeGroup: vg.spec, Name: name, Size: benchSize}, written)
		cancel()
		require.NoError(t, err)
		e2eCreate = append(e2eCreate, time.Since(t0))
		harness.DeleteClaim(t, env.cp.Client, pvc) // released first, as in a cluster; not timed
		cctx, cancel = context.WithTimeout(ctx, requestTimeout)
		err = kube.DeleteVolumeWithAnnotations(cctx, clientset.Wrap(env.cp.Client), pv.Name, vg.spec, name, written)
		cancel()
		require.NoError(t, err)
		e2eDelete = append(e2eDelete, time.Since(t0))
		runs := sm.stop()
		lvmB = append(lvmB, runs...)
		sp := spanOf(runs, t0, time.Now())
		delSpans = append(delSpans, sp)
		logf("bench (b) delete %s: written %s; lvm %s; deleted seen +%s", name, t0.Format("15:04:05.000"), sp.lvm, fmtDur(sp.total))
	}
	m1 := scrape(t, s.metrics)
	aCreate, aRemove, aList := median(create), median(remove), median(list)
	bCreate, bDelete := median(e2eCreate), median(e2eDelete)
	logf("bench (a) and (b) done: CreateLV %v, RemoveLV %v, GetLVList %v; agent create %v, delete %v", aCreate, aRemove, aList, bCreate, bDelete)

	// (c) a burst: every request written at once.
	pvcs := make([]*corev1.PersistentVolumeClaim, burst)
	for i := range pvcs {
		pvcs[i] = harness.PVC(t, env.cp.Client, ns, fmt.Sprintf("bench-burst-%02d", i), s.node)
	}
	sm := startSampler()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, burst)
	last := make([]time.Duration, burst)
	for i, pvc := range pvcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
			defer cancel()
			errs[i] = kube.CreateVolumeWithAnnotations(cctx, clientset.Wrap(env.cp.Client), ns, pvc.Name,
				kube.CreateSpec{VolumeGroup: vg.spec, Name: pvc.Name, Size: benchSize}, nil)
			last[i] = time.Since(start)
		}()
	}
	wg.Wait()
	cTotal := time.Since(start)
	lvmC := sm.stop()
	m2 := scrape(t, s.metrics)
	for i, err := range errs {
		require.NoError(t, err, "burst create %d", i)
	}
	require.Len(t, names(t, topolvmVG, "bench-burst-"), burst)
	logf("bench (c) done: %d creates in %v", burst, cTotal)

	// The table.
	r.row("(a) lvmd CreateLV, thick 4 MiB", aCreate, n, "")
	r.row("(a) lvmd RemoveLV", aRemove, n, "")
	r.row("    lvmd GetLVList (the agent's pre-check)", aList, n, "")
	r.row("(b) agent create: written -> created", bCreate, n, r.ratio("(b)/(a)", bCreate, aCreate, 1.10))
	r.row("(b) agent delete: written -> deleted", bDelete, n, r.ratio("(b)/(a)", bDelete, aRemove, 1.10))
	r.row(fmt.Sprintf("(c) burst of %d creates -> all created", burst), cTotal, 1, r.ratio(fmt.Sprintf("(c)/(%dxa)", burst), cTotal, time.Duration(burst)*aCreate, 1.05))
	r.row("    informer latency: patch -> watch event", watchLat, n, "")
	r.line("")
	r.line("Where the time goes:")
	mc := m1.sub(m0)
	r.line("  agent-side create, mean (its operation metric): %s over %d",
		fmtDur(mc.mean(`lvm_agent_operation_duration_seconds`, `kind="create",result="created"`)), int(mc[`lvm_agent_operation_duration_seconds_count{kind="create",result="created"}`]))
	r.line("  agent-side delete, mean (its operation metric): %s over %d",
		fmtDur(mc.mean(`lvm_agent_operation_duration_seconds`, `kind="delete",result="deleted"`)), int(mc[`lvm_agent_operation_duration_seconds_count{kind="delete",result="deleted"}`]))
	r.line("  agent work queue wait, mean: (b) %s, (c) %s",
		fmtDur(mc.mean(`lvm_agent_workqueue_wait_seconds`, `name="lvm-agent"`)), fmtDur(m2.sub(m1).mean(`lvm_agent_workqueue_wait_seconds`, `name="lvm-agent"`)))
	r.line("  (b)-(a): create +%s, delete +%s; of that, two informer hops (request -> agent, answer -> provisioner) ~ %s",
		fmtDur(bCreate-aCreate), fmtDur(bDelete-aRemove), fmtDur(2*watchLat))
	// The agent's own API round trips: in a delete, the claim check (a Get
	// of the PVC) and the answer (a patch of the PV); in a create, a Get of
	// the PVC before and after lvcreate (so three PVC gets per create and
	// delete of (b)).
	r.line("  agent's API requests during (b), mean (its request metric): PVC get %s over %d, PV patch %s over %d",
		fmtDur(mc.mean(`lvm_agent_kube_request_duration_seconds`, `resource="persistentvolumeclaims",verb="get"`)),
		int(mc[`lvm_agent_kube_request_duration_seconds_count{resource="persistentvolumeclaims",verb="get"}`]),
		fmtDur(mc.mean(`lvm_agent_kube_request_duration_seconds`, `resource="persistentvolumes",verb="patch"`)),
		int(mc[`lvm_agent_kube_request_duration_seconds_count{resource="persistentvolumes",verb="patch"}`]))
	if *flagBenchSample {
		r.line("  (b) delete, from written (medians, /proc sampled every 50 ms): first lvm process seen +%s, last one gone +%s, deleted seen +%s",
			fmtDur(median(spanField(delSpans, func(s span) time.Duration { return s.firstLVM }))),
			fmtDur(median(spanField(delSpans, func(s span) time.Duration { return s.lastLVM }))),
			fmtDur(median(spanField(delSpans, func(s span) time.Duration { return s.total }))))
	}
	r.line("  (the agent creates first and lists only when CreateLV fails; a delete lists first: + one GetLVList ~ %s)", fmtDur(aList))
	// With --lvm-metadata=auto the pre-check reads the on-disk metadata;
	// a fallback would put the GetLVList back into every delete.
	r.line("  agent's LVM reads: lvm_agent_lvm_metadata_direct %v at the end of (b), fallbacks to lvmd during (b) %v",
		m1[`lvm_agent_lvm_metadata_direct`], mc.sum(`lvm_agent_lvm_metadata_fallbacks_total`))
	r.line("  burst: first answer after %s, last after %s; agent retries %d",
		fmtDur(slices.Min(last)), fmtDur(slices.Max(last)), int(m2.sub(m1)[`lvm_agent_retries_total`]))
	if !*flagBenchSample {
		r.print(t)
		return
	}
	r.lvmTable("(a) raw: per CreateLV+RemoveLV+GetLVList", lvmA, n)
	r.lvmTable("(b) agent: per create+delete", lvmB, n)
	r.lvmTable(fmt.Sprintf("(c) burst: per create (%d)", burst), lvmC, burst)
	r.print(t)
}

// ---- lvm process sampling ----

// lvmRun is one lvm process lvmd ran: its subcommand and how long it was seen.
type lvmRun struct {
	sub         string
	first, last time.Time
	life        time.Duration
}

// span is where one delete's time went: from the request written to the
// first lvm process seen after it and the last one gone, and to the answer.
type span struct {
	firstLVM, lastLVM, total time.Duration
	lvm                      string // each process: subcommand +start..+end
}

func spanOf(runs []lvmRun, t0, end time.Time) span {
	sp := span{total: end.Sub(t0)}
	slices.SortFunc(runs, func(a, b lvmRun) int { return a.first.Compare(b.first) })
	var parts []string
	for _, x := range runs {
		if x.first.Before(t0) {
			continue
		}
		if sp.firstLVM == 0 {
			sp.firstLVM = x.first.Sub(t0)
		}
		sp.lastLVM = max(sp.lastLVM, x.last.Sub(t0))
		parts = append(parts, fmt.Sprintf("%s +%s..+%s", x.sub, fmtDur(x.first.Sub(t0)), fmtDur(x.last.Sub(t0))))
	}
	sp.lvm = strings.Join(parts, ", ")
	return sp
}

func spanField(sps []span, f func(span) time.Duration) []time.Duration {
	var d []time.Duration
	for _, s := range sps {
		d = append(d, f(s))
	}
	return d
}

type sampler struct {
	stopc chan struct{}
	done  chan []lvmRun
}

// startSampler records every lvm process (pid, subcommand, first and last
// time seen) by scanning /proc every 50 ms until stop: an lvm process lives
// 300 ms or more in the guest. It runs in every phase, so that its small cost
// weighs on both sides of each ratio; -guest.bench-sample=false turns it off.
func startSampler() *sampler {
	s := &sampler{stopc: make(chan struct{}), done: make(chan []lvmRun, 1)}
	if !*flagBenchSample {
		s.done <- nil
		return s
	}
	go func() {
		type seen struct {
			sub         string
			first, last time.Time
		}
		procs := map[int]*seen{}
		for {
			ents, _ := os.ReadDir("/proc")
			now := time.Now()
			for _, e := range ents {
				pid, err := strconv.Atoi(e.Name())
				if err != nil {
					continue
				}
				if p, ok := procs[pid]; ok {
					p.last = now
					continue
				}
				b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
				if err != nil {
					continue
				}
				argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
				if len(argv) > 1 && filepath.Base(argv[0]) == "lvm" {
					procs[pid] = &seen{sub: argv[1], first: now, last: now}
				}
			}
			select {
			case <-s.stopc:
				var runs []lvmRun
				for _, p := range procs {
					runs = append(runs, lvmRun{p.sub, p.first, p.last, p.last.Sub(p.first)})
				}
				s.done <- runs
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return s
}

func (s *sampler) stop() []lvmRun { close(s.stopc); return <-s.done }

// ---- agent metrics ----

type metrics map[string]float64

// scrape reads the agent's /metrics.
func scrape(t *testing.T, addr string) metrics {
	t.Helper()
	m, err := harness.ReadMetrics(addr)
	require.NoError(t, err)
	return m
}

func (m metrics) sub(o metrics) metrics {
	d := metrics{}
	for k, v := range m {
		d[k] = v - o[k]
	}
	return d
}

// sum of a metric's series, whatever their labels.
func (m metrics) sum(name string) float64 {
	var n float64
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			n += v
		}
	}
	return n
}

// mean of a histogram's samples with the given labels.
func (m metrics) mean(name, labels string) time.Duration {
	c := m[name+"_count{"+labels+"}"]
	if c == 0 {
		return 0
	}
	return time.Duration(m[name+"_sum{"+labels+"}"] / c * float64(time.Second))
}

// ---- the report ----

type report struct{ lines []string }

func (r *report) line(format string, a ...any) { r.lines = append(r.lines, fmt.Sprintf(format, a...)) }

func (r *report) row(what string, d time.Duration, n int, note string) {
	r.line("%-46s %9s  n=%-3d %s", what, fmtDur(d), n, note)
}

func (r *report) ratio(name string, b, a time.Duration, goal float64) string {
	x := b.Seconds() / a.Seconds()
	verdict := "met"
	if x > goal {
		verdict = "MISSED"
	}
	return fmt.Sprintf("%s = %.2f (goal <= %.2f: %s)", name, x, goal, verdict)
}

// lvmTable summarises the lvm processes seen, per request.
func (r *report) lvmTable(title string, runs []lvmRun, per int) {
	by := map[string][]time.Duration{}
	for _, x := range runs {
		by[x.sub] = append(by[x.sub], x.life)
	}
	subs := make([]string, 0, len(by))
	for s := range by {
		subs = append(subs, s)
	}
	sort.Strings(subs)
	r.line("  lvm processes, %s:", title)
	var total time.Duration
	for _, s := range subs {
		var sum time.Duration
		for _, d := range by[s] {
			sum += d
		}
		total += sum
		r.line("    lvm %-12s %5.1f per request, median %s, %s per request", s, float64(len(by[s]))/float64(per), fmtDur(median(by[s])), fmtDur(sum/time.Duration(per)))
	}
	r.line("    all lvm processes: %s per request", fmtDur(total/time.Duration(per)))
}

func (r *report) print(t *testing.T) {
	out := "\n==== bench-lvm (TCG guest; medians) ====\n" + strings.Join(r.lines, "\n") + "\n"
	fmt.Print(out)
	if dir := os.Getenv("LVM_AGENT_RESULTS"); dir != "" {
		if err := os.WriteFile(filepath.Join(dir, "bench.txt"), []byte(out), 0o644); err != nil {
			t.Logf("writing the report: %v", err)
		}
	}
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func fmtDur(d time.Duration) string {
	if d >= 10*time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return fmt.Sprintf("%.3f s", d.Seconds())
}
