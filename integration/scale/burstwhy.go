package main

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/lvm-agent/lvm-agent/integration/harness"
)

// burstWhy is where a cluster-wide burst's time went: each candidate the
// issue names, measured over the burst, so that the bench output says which
// resource saturated rather than leaving it to a guess.
type burstWhy struct {
	wall time.Duration // first request sent -> last answer seen
	// cpuWall is the time between the CPU samples (the scrapes of 100
	// agents' /metrics make it longer than wall): the shares' denominator.
	cpuWall time.Duration
	cores   int
	// CPU seconds over the burst of the API server, etcd, the agents (sum)
	// and this process (the writers, the observer and every fake lvmd).
	apiCPU, etcdCPU, agentsCPU, benchCPU float64
	// hostCPU: every process's CPU seconds (/proc/stat), ours and the
	// host's other jobs'.
	hostCPU float64
	// slept is the mean time a sleep of the lvmd latency took: the fake's
	// real latency on this host.
	latency, slept time.Duration
	creates        int // per node
	// The bench's writes: first sent -> last response, and each one's round trip.
	writeSpan          time.Duration
	writeP50, writeP99 time.Duration
	// Watch delivery: a request's write sent -> the bench's watch sees it.
	seenP50, seenP99 time.Duration
	// The API server's own PVC PATCH latency (apiserver_request_duration_seconds),
	// everyone's: the bench's requests and the agents' answers.
	apiPatchP50, apiPatchP99 time.Duration
	// apfWait: seconds requests waited in priority-and-fairness queues, and how many did.
	apfWait, apfWaited float64
	// Summed over the agents (their /metrics): the client-side rate limiter's
	// waits, the work queue's wait, a create's lvmd calls, the agent's part of
	// an answer (seen -> answer sent) and its PVC patches' round trips.
	throttleSum, throttleP99 float64
	throttleN                float64
	queueP50, queueP99       time.Duration
	opP50, opP99             time.Duration
	answerP50, answerP99     time.Duration
	patchP50, patchP99       time.Duration
	// Per node, from the bench's watch: the time from the burst's start to
	// the node's last answer (mean, largest), and within it the time the
	// node had no request seen and unanswered: its lvmd had nothing to do.
	nodeSpan, nodeSpanMax time.Duration
	starved, starvedMax   time.Duration
}

// share is CPU seconds over the burst as a share of the host's cores.
func (w burstWhy) share(cpu float64) float64 { return cpu / (float64(w.cores) * w.cpuWall.Seconds()) }

func (w burstWhy) ours() float64 { return w.apiCPU + w.etcdCPU + w.agentsCPU + w.benchCPU }

// over splits a node's time beyond its floor (creates x latency): the
// sleeps' lateness, the time the node had nothing open, and the rest (the
// agent between lvmd calls; its last answer's patch and delivery).
func (w burstWhy) over() (late, starved, rest time.Duration) {
	floor := time.Duration(w.creates) * w.latency
	late = time.Duration(w.creates) * max(w.slept-w.latency, 0)
	return late, w.starved, w.nodeSpan - floor - late - w.starved
}

// burstSample is what the attribution reads before and after the burst.
type burstSample struct {
	// at, host and apiCPU are read together, before the scrapes: CPU
	// seconds of every process on the host and of the API server.
	at           time.Time
	host, apiCPU float64
	api          apiSample
	etcd         procStats
	bench        procStats
	agents       metrics // every agent's /metrics, summed series by series
}

func sampleBurst(s apiSample, cp *harness.ControlPlane, f *fleet) (burstSample, error) {
	b := burstSample{at: time.Now(), api: s, agents: metrics{}}
	var err error
	if b.host, err = hostCPUSeconds(); err != nil {
		return b, err
	}
	p, err := pidStats(s.pid)
	if err != nil {
		return b, err
	}
	b.apiCPU = p.cpuSeconds
	if b.etcd, err = etcdStats(cp); err != nil {
		return b, err
	}
	if b.bench, err = pidStats(os.Getpid()); err != nil {
		return b, err
	}
	for _, a := range f.agents {
		if a.proc.Cmd.ProcessState != nil {
			continue
		}
		m, err := a.scrape()
		if err != nil {
			return b, err
		}
		for k, v := range m {
			b.agents[k] += v
		}
	}
	return b, nil
}

// hostCPUSeconds is the CPU time of every process since boot, /proc/stat's
// first line less idle and iowait.
func hostCPUSeconds() (float64, error) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: %q", line)
	}
	busy := 0.0
	for i, v := range f[1:8] { // user nice system idle iowait irq softirq
		if i == 3 || i == 4 {
			continue
		}
		var x float64
		if _, err := fmt.Sscanf(v, "%g", &x); err != nil {
			return 0, err
		}
		busy += x
	}
	return busy / 100, nil // USER_HZ
}

// etcdStats is /proc of the control plane's etcd.
func etcdStats(cp *harness.ControlPlane) (procStats, error) {
	pid, err := cp.EtcdPID()
	if err != nil {
		return procStats{}, err
	}
	return pidStats(pid)
}

// attribute fills a burstWhy from the samples around the burst and its requests.
func attribute(b fleetBurst, b0, b1 burstSample, rr requestsResult, obs *observer, names []string, node func(int) string) burstWhy {
	w := burstWhy{wall: rr.total, cpuWall: b1.at.Sub(b0.at), cores: runtime.NumCPU(), agentsCPU: b.agentCPU, hostCPU: b1.host - b0.host,
		latency: b.latency, slept: b.slept, creates: b.n / max(b.nodes, 1),
		apiCPU: b1.apiCPU - b0.apiCPU, etcdCPU: b1.etcd.cpuSeconds - b0.etcd.cpuSeconds,
		benchCPU: b1.bench.cpuSeconds - b0.bench.cpuSeconds}
	var first, last time.Time
	wr := make([]time.Duration, len(names))
	var seen []time.Duration
	type edge struct {
		t time.Time
		d int
	}
	perNode := map[string][]edge{}
	for i, name := range names {
		if first.IsZero() || rr.sent[i].Before(first) {
			first = rr.sent[i]
		}
		last = later(last, rr.written[i])
		wr[i] = rr.written[i].Sub(rr.sent[i])
		req, ok := obs.request(name)
		ans, _ := obs.answer(name)
		if !ok { // answered before the watch saw the request open: count it from the answer
			req = ans
		}
		seen = append(seen, max(req.Sub(rr.sent[i]), 0))
		perNode[node(i)] = append(perNode[node(i)], edge{req, 1}, edge{ans, -1})
	}
	w.writeSpan = last.Sub(first)
	w.writeP50, w.writeP99 = percentile(wr, 0.5), percentile(wr, 0.99)
	w.seenP50, w.seenP99 = percentile(seen, 0.5), percentile(seen, 0.99)
	for _, edges := range perNode {
		slices.SortStableFunc(edges, func(a, b edge) int { return a.t.Compare(b.t) })
		open, idleFrom := 0, first
		var starved time.Duration
		for _, e := range edges {
			if open == 0 && e.d > 0 {
				starved += max(e.t.Sub(idleFrom), 0)
			}
			open += e.d
			if open == 0 {
				idleFrom = e.t
			}
		}
		span := edges[len(edges)-1].t.Sub(first)
		w.nodeSpan += span
		w.nodeSpanMax = max(w.nodeSpanMax, span)
		w.starved += starved
		w.starvedMax = max(w.starvedMax, starved)
	}
	if n := time.Duration(len(perNode)); n > 0 {
		w.nodeSpan /= n
		w.starved /= n
	}
	api := b1.api.m.sub(b0.api.m)
	patch := []string{`verb="PATCH"`, `resource="persistentvolumeclaims"`}
	w.apiPatchP50 = api.quantile("apiserver_request_duration_seconds", 0.5, patch...)
	w.apiPatchP99 = api.quantile("apiserver_request_duration_seconds", 0.99, patch...)
	w.apfWait = api.sum("apiserver_flowcontrol_request_wait_duration_seconds_sum")
	w.apfWaited = api.sum("apiserver_flowcontrol_request_wait_duration_seconds_count")
	ag := b1.agents.sub(b0.agents)
	w.throttleSum = ag.sum("lvm_agent_kube_rate_limiter_wait_seconds_sum")
	w.throttleN = ag.sum("lvm_agent_kube_rate_limiter_wait_seconds_count")
	w.throttleP99 = ag.quantile("lvm_agent_kube_rate_limiter_wait_seconds", 0.99).Seconds()
	w.queueP50, w.queueP99 = ag.quantile("lvm_agent_workqueue_wait_seconds", 0.5), ag.quantile("lvm_agent_workqueue_wait_seconds", 0.99)
	create := `kind="create"`
	w.opP50, w.opP99 = ag.quantile("lvm_agent_operation_duration_seconds", 0.5, create), ag.quantile("lvm_agent_operation_duration_seconds", 0.99, create)
	w.answerP50, w.answerP99 = ag.quantile("lvm_agent_request_answer_seconds", 0.5), ag.quantile("lvm_agent_request_answer_seconds", 0.99)
	own := []string{`verb="patch"`, `resource="persistentvolumeclaims"`}
	w.patchP50, w.patchP99 = ag.quantile("lvm_agent_kube_request_duration_seconds", 0.5, own...), ag.quantile("lvm_agent_kube_request_duration_seconds", 0.99, own...)
	return w
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// lines prints the attribution through printf, one cause a line.
func (w burstWhy) lines(printf func(string, ...any), indent string) {
	p := func(format string, args ...any) { printf(indent+format, args...) }
	s := func(d time.Duration) string { return secs(d) + " s" }
	p("CPU over the %s (%s between the samples): API server %.1f s, etcd %.1f s, agents %.1f s, bench (writers, watch, fake lvmds) %.1f s = %.0f%% of %d cores; the host's other jobs %.1f s (%.0f%%): busy %.0f%%",
		s(w.wall), s(w.cpuWall), w.apiCPU, w.etcdCPU, w.agentsCPU, w.benchCPU, 100*w.share(w.ours()), w.cores,
		max(w.hostCPU-w.ours(), 0), 100*w.share(max(w.hostCPU-w.ours(), 0)), 100*w.share(w.hostCPU))
	p("requests: all written in %s (the bench's PATCH p50 %s, p99 %s; the API server's PVC PATCH p50 %s, p99 %s); write -> seen by a watch p50 %s, p99 %s",
		s(w.writeSpan), s(w.writeP50), s(w.writeP99), s(w.apiPatchP50), s(w.apiPatchP99), s(w.seenP50), s(w.seenP99))
	p("priority and fairness: %.0f requests queued, %.1f s waited in all", w.apfWaited, w.apfWait)
	p("agents: client rate limiter %.0f waits, %.2f s in all (p99 %.4f s); work queue wait p50 %s, p99 %s; create (lvmd calls) p50 %s, p99 %s;",
		w.throttleN, w.throttleSum, w.throttleP99, s(w.queueP50), s(w.queueP99), s(w.opP50), s(w.opP99))
	p("  seen -> answer sent p50 %s, p99 %s; their PVC patches p50 %s, p99 %s", s(w.answerP50), s(w.answerP99), s(w.patchP50), s(w.patchP99))
	p("per node: start -> last answer %s (largest %s); of it, nothing open on the node (lvmd idle, waiting for requests) %s (largest %s)",
		s(w.nodeSpan), s(w.nodeSpanMax), s(w.starved), s(w.starvedMax))
	late, starved, rest := w.over()
	p("over the %d x %v floor, per node: %s = sleeps late (a %v sleep took %v) %s + nothing open %s + the rest (the agent between lvmd calls, the last answer's patch and delivery) %s",
		w.creates, w.latency, s(w.nodeSpan-time.Duration(w.creates)*w.latency), w.latency, w.slept.Round(time.Microsecond), s(late), s(starved), s(rest))
}
