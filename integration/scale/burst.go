package main

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
)

const burstNS = "bench"

// observer follows the bench namespace's PVCs with a watch and records when
// each one is first seen answered.
type observer struct {
	mu       sync.Mutex
	answered map[string]time.Time
	// requested is when each PVC was first seen with an open create
	// request: what a watcher (an agent's too) sees of a request's write.
	requested map[string]time.Time
	failed    map[string]string
	waiters   map[string]chan struct{}
	cancel    context.CancelFunc
	done      chan struct{}
}

// observe starts a watch from the namespace's current resourceVersion.
func (cl *cluster) observe(ctx context.Context) (*observer, error) { return observeWith(ctx, cl.c) }

// observeWith is observe through the client c (e.g. of an API server that
// does not restart).
//
// The watch is a RetryWatcher, which resumes a broken watch but ends when
// its resourceVersion has expired (410 Gone): an API server that cannot
// keep up with its watchers (`all` mode's burst on a loaded host) ends the
// slow ones, and then their resourceVersions are soon compacted. The
// observer then lists the namespace, takes each PVC's state from the list
// (an answer first seen there is timed by the list) and watches again from
// the list's resourceVersion.
func observeWith(ctx context.Context, c kubernetes.Interface) (*observer, error) {
	l, err := c.CoreV1().PersistentVolumeClaims(burstNS).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return c.CoreV1().PersistentVolumeClaims(burstNS).Watch(ctx, o)
	}}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, l.ResourceVersion, lw)
	if err != nil {
		cancel()
		return nil, err
	}
	o := &observer{answered: map[string]time.Time{}, requested: map[string]time.Time{}, failed: map[string]string{}, waiters: map[string]chan struct{}{},
		cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(o.done)
		for {
			for ev := range w.ResultChan() {
				if pvc, ok := ev.Object.(*corev1.PersistentVolumeClaim); ok && ev.Type != watch.Deleted {
					o.record(pvc, time.Now())
				}
			}
			w.Stop()
			for ctx.Err() == nil {
				l, err := c.CoreV1().PersistentVolumeClaims(burstNS).List(ctx, metav1.ListOptions{})
				if err == nil {
					now := time.Now()
					for i := range l.Items {
						o.record(&l.Items[i], now)
					}
					if w, err = watchtools.NewRetryWatcherWithContext(ctx, l.ResourceVersion, lw); err == nil {
						break
					}
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
			if ctx.Err() != nil {
				return
			}
		}
	}()
	return o, nil
}

// record notes what pvc's state says, seen at now.
func (o *observer) record(pvc *corev1.PersistentVolumeClaim, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	state := pvc.Annotations[kube.AnnLifecycle]
	if _, seen := o.requested[pvc.Name]; !seen && state == kube.StateCreating {
		o.requested[pvc.Name] = now
	}
	if state != kube.StateCreated && state != kube.StateFailed {
		return
	}
	if _, seen := o.answered[pvc.Name]; seen {
		return
	}
	o.answered[pvc.Name] = now
	if state == kube.StateFailed {
		o.failed[pvc.Name] = pvc.Annotations[kube.AnnReason] + ": " + pvc.Annotations[kube.AnnError]
	}
	if ch, ok := o.waiters[pvc.Name]; ok {
		close(ch)
		delete(o.waiters, pvc.Name)
	}
}

func (o *observer) stop() { o.cancel(); <-o.done }

// answer is when name was first seen answered.
func (o *observer) answer(name string) (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	t, ok := o.answered[name]
	return t, ok
}

// request is when name was first seen with an open create request.
func (o *observer) request(name string) (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	t, ok := o.requested[name]
	return t, ok
}

// failure is the reason and error of a "failed" answer.
func (o *observer) failure(name string) (string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	f, ok := o.failed[name]
	return f, ok
}

// count is the number of answers seen.
func (o *observer) count() int { o.mu.Lock(); defer o.mu.Unlock(); return len(o.answered) }

// wait blocks until name is answered or ctx ends.
func (o *observer) wait(ctx context.Context, name string) (time.Time, error) {
	o.mu.Lock()
	if t, ok := o.answered[name]; ok {
		o.mu.Unlock()
		return t, nil
	}
	ch := make(chan struct{})
	o.waiters[name] = ch
	o.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
		return time.Time{}, fmt.Errorf("%s: no answer: %w", name, ctx.Err())
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.answered[name], nil
}

// burstResult is one burst of creates.
type burstResult struct {
	latency  time.Duration // of the fake lvmd
	n        int
	total    time.Duration // first write sent to last answer seen
	p50, p99 time.Duration // per volume: request written to answer seen
	// agentP50, agentP99: per volume, the agent's own part (lvm_agent_request_answer_seconds).
	agentP50, agentP99 time.Duration
	failed             int
	// slept is the mean time a time.Sleep(latency) took in this process
	// during the burst: what the fake's latency really was on a busy host.
	slept time.Duration
}

// prepare makes n PVCs for the bench node, as a scheduler leaves them.
func (cl *cluster) prepare(ctx context.Context, prefix string, n int) ([]string, error) {
	return cl.prepareOn(ctx, prefix, n, func(int) string { return benchNode })
}

// prepareOn makes n PVCs, the i-th for the node node(i).
func (cl *cluster) prepareOn(ctx context.Context, prefix string, n int, node func(int) string) ([]string, error) {
	names := make([]string, n)
	err := parallel(ctx, cl.cfg.createWorkers, 0, n, func(ctx context.Context, i int) error {
		names[i] = fmt.Sprintf("%s-%04d", prefix, i)
		_, err := cl.c.CoreV1().PersistentVolumeClaims(burstNS).Create(ctx, harness.NewPVC(burstNS, names[i], node(i)), metav1.CreateOptions{})
		return err
	})
	return names, err
}

// request writes a create request exactly as the provisioner helper does:
// lifecycle, spec and (when labelled) the node label in one merge patch.
func (cl *cluster) request(ctx context.Context, name string, labelled bool) error {
	return cl.requestOn(ctx, name, benchNode, labelled)
}

// requestOn is request for a PVC of node.
func (cl *cluster) requestOn(ctx context.Context, name, node string, labelled bool) error {
	spec := fmt.Sprintf(`{"volumeGroup":"vg1","name":"%s","size":4194304}`, name)
	var labels kube.Change
	if labelled {
		labels = kube.Set(map[string]string{kube.LabelNode: kube.NodeLabelValue(node)})
	}
	_, err := kube.UpdatePvcWithAnnotations(ctx, clientset.Wrap(cl.c), burstNS, name, "",
		kube.Set(map[string]string{kube.AnnLifecycle: kube.StateCreating, kube.AnnSpec: spec}), labels)
	return err
}

// burst writes n labelled create requests at once (createWorkers writers)
// and waits for every answer.
func (cl *cluster) burst(ctx context.Context, a *agentProc, obs *observer, prefix string, n int, latency time.Duration) (burstResult, []string, error) {
	r := burstResult{latency: latency, n: n}
	names, err := cl.prepare(ctx, prefix, n)
	if err != nil {
		return r, names, err
	}
	a.lvm.SetLatency(latency)
	stopProbe := sleepProbe(latency, &r.slept)
	defer stopProbe()
	written := make([]time.Time, n)
	start := time.Now()
	err = parallel(ctx, cl.cfg.createWorkers, 0, n, func(ctx context.Context, i int) error {
		err := cl.request(ctx, names[i], true)
		written[i] = time.Now()
		return err
	})
	if err != nil {
		return r, names, err
	}
	// Enough for the agent to do the burst at a tenth of lvmd's speed.
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute+time.Duration(n)*latency*10)
	defer cancel()
	lat := make([]time.Duration, n)
	var last time.Time
	for i, name := range names {
		t, err := obs.wait(wctx, name)
		if err != nil {
			return r, names, err
		}
		lat[i] = max(t.Sub(written[i]), 0)
		if t.After(last) {
			last = t
		}
		if _, failed := obs.failure(name); failed {
			r.failed++
		}
	}
	r.total = last.Sub(start)
	r.p50, r.p99 = percentile(lat, 0.50), percentile(lat, 0.99)
	stopProbe()
	return r, names, nil
}

// sleepProbe sleeps d again and again until stopped, and then sets mean to
// the mean time one sleep took. A busy host wakes sleepers late, and the
// fake's latency is such a sleep: this is the floor the host allowed.
func sleepProbe(d time.Duration, mean *time.Duration) (stop func()) {
	if d <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	result := make(chan time.Duration, 1)
	go func() {
		var total time.Duration
		n := 0
		for {
			select {
			case <-done:
				result <- total / time.Duration(max(n, 1))
				return
			default:
			}
			start := time.Now()
			time.Sleep(d)
			total += time.Since(start)
			n++
		}
	}()
	var once bool
	return func() {
		if !once {
			once = true
			close(done)
			*mean = <-result
		}
	}
}

// sequentialResult is the 1-by-1 probe: requests written one after the
// other, each when the previous one is answered.
type sequentialResult struct {
	p50, p99           time.Duration // request written -> answer seen
	writeP50, writeP99 time.Duration // the bench's own request write: what one API write costs here
}

// sequential measures the per-request time without any queueing.
func (cl *cluster) sequential(ctx context.Context, obs *observer, prefix string, n int) (sequentialResult, []string, error) {
	var r sequentialResult
	names, err := cl.prepare(ctx, prefix, n)
	if err != nil {
		return r, names, err
	}
	lat := make([]time.Duration, 0, n)
	wr := make([]time.Duration, 0, n)
	for _, name := range names {
		sent := time.Now()
		if err := cl.request(ctx, name, true); err != nil {
			return r, names, err
		}
		written := time.Now()
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		t, err := obs.wait(wctx, name)
		cancel()
		if err != nil {
			return r, names, err
		}
		lat = append(lat, max(t.Sub(written), 0))
		wr = append(wr, written.Sub(sent))
	}
	r.p50, r.p99 = percentile(lat, 0.50), percentile(lat, 0.99)
	r.writeP50, r.writeP99 = percentile(wr, 0.50), percentile(wr, 0.99)
	return r, names, nil
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// clearLVs empties the fake's volume group between bursts.
func clearLVs(a *agentProc) error {
	a.lvm.SetLatency(0)
	lvs, err := a.lvm.List("vg1")
	if err != nil {
		return err
	}
	for _, lv := range lvs {
		if err := a.lvm.Remove("vg1", lv.Name); err != nil {
			return err
		}
	}
	return nil
}
