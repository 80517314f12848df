package kube

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// The hybrid watch mode's second source. The informers watch only objects
// labelled for this node, which keeps the agent's cost independent of the
// cluster's size; a provisioner that does not set the label (one written for
// the original agent) would then go unanswered. The Sweeper lists the PVCs
// and PVs that carry no volume.node label at all, then watches them from the
// list's resourceVersion, and hands the open requests of this node to the
// agent, which treats them as informer events.
//
// Measured (make bench-scale, 25,000 unlabelled objects among 100,000): a
// list of them every 30 s cost each agent about 1 MB/s and answered their
// requests after up to 44 s; one list (~30 MB) and a watch cost only their
// changes after the start, and answer at once. The list is paginated and
// asks for the latest state (resourceVersion unset), which kube-apiserver
// serves from its watch cache (ConsistentListFromCache,
// ListFromCacheSnapshot): etcd is read for one revision only, and the agent
// holds a page at a time, never the list. (resourceVersion "0" is served
// from the cache too, but ignores the page size, and may be older than what
// the agent has seen.) Nothing of the unlabelled objects is cached but the
// open requests of this node.
//
// Why not a second pair of informers on !volume.node with the stub
// transform, which would replace most of this file (issue 18): measured, it
// costs memory and CPU that this does not. A prototype (informers with the
// transform of NewInformers and the agent's handlers, started beside the
// labelled ones) against this Sweeper, one fresh agent each, hybrid mode,
// F foreign PVCs + F foreign PVs, 25% of them unlabelled:
//
//	KUBEBUILDER_ASSETS=$(scripts/kube-assets.sh) go run ./integration/scale \
//	  -foreign 10000,50000 -modes hybrid -lvmd-latency 0 -burst 200 -sequential 20 -agent-bin BIN
//
//	                  RSS after sync  CPU to sync  ready   RSS end of row
//	F=10000 sweeper      61.3 MiB       0.11 s     0.08 s    59.0 MiB
//	        informers    61.4 MiB       0.24 s     0.06 s    65.8 MiB
//	F=50000 sweeper      62.1 MiB       0.55 s     0.28 s    60.1 MiB
//	        informers    94.6 MiB       1.15 s     1.48 s   100.7 MiB
//
// The informers keep a stub of every unlabelled object (25,000 at F=50000,
// about 1.3 KiB each in RSS with the store's index), which the Sweeper never
// holds: the agent's memory would grow with the cluster again. Both answered
// the 5 unlabelled requests of each row (sweeper in 0.06 and 0.03 s,
// informers in 0.08 and 0.58 s).

// SweepTarget takes what a Sweeper finds; the agent implements it.
type SweepTarget interface {
	// Swept is an object the informers do not deliver: an open request of
	// this node, or an object handed over before, whatever its state now
	// (so that the agent also sees a request end).
	Swept(obj runtime.Object)
	// SweptGone is an object handed over before that was deleted.
	SweptGone(obj runtime.Object)
}

// SweepConfig configures a Sweeper.
type SweepConfig struct {
	Node Node
	// Interval between full lists besides the watch, a safety net (0: only
	// at start, and when the watch cannot resume).
	Interval time.Duration
	// PageSize bounds the objects of one list response (default 500).
	PageSize int64
	// Recorder, when set, records a Warning event on each request found
	// without the label, so that the provisioner's operator learns why.
	Recorder record.EventRecorder
	Metrics  *ClientMetrics
	// Registerer registers the sweeper's own metrics (nil: not registered).
	Registerer prometheus.Registerer
	// RehandDelay: a request that appears in the unlabelled watch is handed
	// over again after this long (default 5 s), in case it appeared because
	// its label was removed and the informers' removal reached the agent
	// second and made it forget the request.
	RehandDelay time.Duration
}

// Sweeper lists and watches the unlabelled PVCs and PVs.
type Sweeper struct {
	target    SweepTarget
	cfg       SweepConfig
	resources []*unlabelled

	mu sync.Mutex
	// held are the objects handed to the target, by key, as last handed:
	// their next state (answered, deleted, labelled) must be handed over too.
	held map[string]runtime.Object

	passes   *prometheus.CounterVec
	duration prometheus.Histogram
	listed   *prometheus.GaugeVec
	found    *prometheus.CounterVec
	watches  *prometheus.CounterVec
}

// NewSweeper makes a sweeper; Run starts it.
func NewSweeper(c kubernetes.Interface, target SweepTarget, cfg SweepConfig) *Sweeper {
	if cfg.PageSize <= 0 {
		cfg.PageSize = 500
	}
	if cfg.RehandDelay <= 0 {
		cfg.RehandDelay = 5 * time.Second
	}
	s := &Sweeper{target: target, cfg: cfg, held: map[string]runtime.Object{},
		resources: []*unlabelled{pvcs(c), pvs(c)},
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_sweeps_total",
			Help: "Hybrid mode: full lists of the unlabelled PVCs and PVs, by result (ok, error)."}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "lvm_agent_sweep_duration_seconds",
			Help: "Hybrid mode: time of one full list of the unlabelled PVCs and PVs.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 12)}),
		listed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lvm_agent_sweep_listed_objects",
			Help: "Hybrid mode: unlabelled objects in the last full list, by resource: what a list costs."}, []string{"resource"}),
		found: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_unlabelled_requests_total",
			Help: "Hybrid mode: requests of this node found without the " + LabelNode + " label (their provisioner should set it), by resource."},
			[]string{"resource"}),
		watches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_unlabelled_watches_total",
			Help: "Hybrid mode: watches of the unlabelled objects started, by resource."}, []string{"resource"}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(s.passes, s.duration, s.listed, s.found, s.watches)
	}
	return s
}

// Run lists the unlabelled objects, then follows them with watches from the
// list's resourceVersion, until ctx ends. It lists again when a watch cannot
// resume (its resourceVersion expired), and every Interval if set.
func (s *Sweeper) Run(ctx context.Context) {
	klog.InfoS("Following unlabelled PVCs and PVs for requests of provisioners that do not label", "selector", UnlabelledSelector(), "relist", s.cfg.Interval)
	newBackoff := func() wait.Backoff {
		return wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.2, Steps: 7, Cap: time.Minute}
	}
	backoff := newBackoff()
	for ctx.Err() == nil {
		rvs, err := s.sweep(ctx)
		if err != nil {
			if ctx.Err() == nil {
				d := backoff.Step()
				klog.ErrorS(err, "Listing unlabelled objects failed; will retry", "in", d)
				sleep(ctx, d)
			}
			continue
		}
		wctx, cancel := context.WithCancel(ctx)
		if s.cfg.Interval > 0 {
			cancel()
			// Jittered, so that agents started together do not list together.
			wctx, cancel = context.WithTimeout(ctx, wait.Jitter(s.cfg.Interval, 0.2))
		}
		errs := make(chan error, len(s.resources))
		started := time.Now()
		for i, r := range s.resources {
			go func() { errs <- s.follow(wctx, r, rvs[i]) }()
		}
		err = <-errs // the first to end ends all: the next list covers both
		cancel()
		for range s.resources[1:] {
			<-errs
		}
		switch {
		case err == nil || ctx.Err() != nil:
			backoff = newBackoff() // the relist interval passed, or the end
		case time.Since(started) < time.Minute:
			// Failing at once (say, a watch refused): do not list in a loop.
			d := backoff.Step()
			klog.ErrorS(err, "Watch of unlabelled objects failed; listing again", "in", d)
			sleep(ctx, d)
		default:
			klog.InfoS("Watch of unlabelled objects cannot resume; listing again", "reason", err.Error())
			backoff = newBackoff()
		}
	}
}

// Sweep makes one full pass over the unlabelled PVCs and PVs.
func (s *Sweeper) Sweep(ctx context.Context) error {
	_, err := s.sweep(ctx)
	return err
}

// sweep lists every resource and returns the resourceVersions to watch from.
func (s *Sweeper) sweep(ctx context.Context) ([]string, error) {
	start := time.Now()
	rvs := make([]string, len(s.resources))
	var errs []error
	for i, r := range s.resources {
		rv, err := s.list(ctx, r)
		rvs[i] = rv
		errs = append(errs, err)
	}
	s.duration.Observe(time.Since(start).Seconds())
	if err := errors.Join(errs...); err != nil {
		s.passes.WithLabelValues("error").Inc()
		return nil, err
	}
	s.passes.WithLabelValues("ok").Inc()
	return rvs, nil
}

// list lists one resource page by page, hands over what it finds, and then
// settles the held objects it did not list. An expired continue token fails
// the pass; the next one starts over.
func (s *Sweeper) list(ctx context.Context, r *unlabelled) (string, error) {
	o := metav1.ListOptions{LabelSelector: UnlabelledSelector(), Limit: s.cfg.PageSize}
	seen := map[string]bool{} // the held objects listed again
	rv, n := "", 0
	for {
		items, meta, err := r.list(ctx, o)
		if err != nil {
			return "", err
		}
		if rv == "" {
			rv = meta.ResourceVersion // every page is of the first page's snapshot
		}
		n += len(items)
		for _, obj := range items {
			s.received(r, obj, seen, false)
		}
		if meta.Continue == "" {
			break
		}
		o.Continue = meta.Continue
	}
	s.listed.WithLabelValues(r.name).Set(float64(n))
	s.mu.Lock()
	var left []runtime.Object
	for key, prev := range s.held {
		if !seen[key] && strings.HasPrefix(key, r.prefix) {
			left = append(left, prev)
		}
	}
	s.mu.Unlock()
	for _, prev := range left {
		s.settle(ctx, r, prev)
	}
	return rv, nil
}

// follow watches one resource from rv until ctx ends (nil) or the watch
// cannot resume (the error). A watch that the API server closes (they all
// time out) resumes from the last resourceVersion seen.
func (s *Sweeper) follow(ctx context.Context, r *unlabelled, rv string) error {
	// Five retries, 1 s growing to 5 s (about 13 s in all), jittered so that
	// the agents of a cluster do not come back to an API server in step.
	newBackoff := func() wait.Backoff {
		return wait.Backoff{Duration: time.Second, Factor: 1.5, Jitter: 0.2, Steps: 5}
	}
	backoff := newBackoff()
	for ctx.Err() == nil {
		s.watches.WithLabelValues(r.name).Inc()
		w, err := r.watch(ctx, metav1.ListOptions{LabelSelector: UnlabelledSelector(), ResourceVersion: rv, AllowWatchBookmarks: true})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) || backoff.Steps == 0 {
				return err
			}
			sleep(ctx, backoff.Step())
			continue
		}
		rv, err = s.consume(ctx, r, w, rv)
		w.Stop()
		if err != nil {
			return err
		}
		backoff = newBackoff()
	}
	return nil
}

// consume handles a watch's events until it ends, and returns the last
// resourceVersion seen.
func (s *Sweeper) consume(ctx context.Context, r *unlabelled, w watch.Interface, rv string) (string, error) {
	for {
		select {
		case <-ctx.Done():
			return rv, nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return rv, nil
			}
			if ev.Type == watch.Error {
				return rv, apierrors.FromObject(ev.Object)
			}
			if m, err := meta.Accessor(ev.Object); err == nil {
				rv = m.GetResourceVersion()
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				s.received(r, ev.Object, nil, ev.Type == watch.Added)
			case watch.Deleted:
				// Deleted, or labelled (so no longer unlabelled): settle tells which.
				key := r.key(ev.Object)
				s.mu.Lock()
				prev, held := s.held[key]
				s.mu.Unlock()
				if held {
					s.settle(ctx, r, prev)
				}
			}
		}
	}
}

// received handles an unlabelled object: it hands over an open request of
// this node, or the next state of an object handed over before, and marks
// what stays held as seen. An open request that a watch shows appearing is
// handed over once more after RehandDelay.
func (s *Sweeper) received(r *unlabelled, obj runtime.Object, seen map[string]bool, appeared bool) {
	owned, open := s.cfg.Node.Classify(obj)
	s.cfg.Metrics.ObjectsReceived(r.name, SourceUnlabelled, foreignLabel(owned), 1)
	key := r.key(obj)
	s.mu.Lock()
	defer s.mu.Unlock()
	prev, held := s.held[key]
	if !open && !held {
		return
	}
	trimmed, _ := trim(obj)
	o := trimmed.(runtime.Object)
	if open && (!held || uidOf(prev) != uidOf(o)) {
		s.warn(key, o, r.name)
	}
	s.target.Swept(o)
	if !open {
		delete(s.held, key)
		return
	}
	s.held[key] = o
	if seen != nil {
		seen[key] = true
	}
	if appeared {
		time.AfterFunc(s.cfg.RehandDelay, func() { s.rehand(key, o) })
	}
}

// rehand hands obj over again if it is still the request held for key.
func (s *Sweeper) rehand(key string, obj runtime.Object) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[key] == obj {
		s.target.Swept(obj)
	}
}

func (s *Sweeper) warn(key string, obj runtime.Object, resource string) {
	s.found.WithLabelValues(resource).Inc()
	klog.InfoS("Found a request without the node label: its provisioner should set the label, which lets agents watch only their own node's objects",
		"object", key, "label", LabelNode+"="+NodeLabelValue(s.cfg.Node.Name))
	if s.cfg.Recorder != nil {
		s.cfg.Recorder.Eventf(obj, corev1.EventTypeWarning, "UnlabelledRequest",
			"lvm-agent on node %s found this request among the unlabelled objects it follows for compatibility: set label %s=%s on requests, so that agents can watch only their own node's objects",
			s.cfg.Node.Name, LabelNode, NodeLabelValue(s.cfg.Node.Name))
	}
}

// settle handles a held object that is no longer unlabelled: deleted, or
// labelled since (and then the informers' from now on). It is read once
// more, so that the agent is told which.
func (s *Sweeper) settle(ctx context.Context, r *unlabelled, prev runtime.Object) {
	m, err := metaOf(prev)
	if err != nil {
		return
	}
	fresh, err := r.get(ctx, m.GetNamespace(), m.GetName())
	key := r.key(prev)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[key] != prev {
		return // handed over anew meanwhile
	}
	switch {
	case apierrors.IsNotFound(err):
		s.target.SweptGone(prev)
	case err != nil:
		klog.ErrorS(err, "Could not read a request that left the unlabelled objects; will try at the next list", "object", key)
		return
	default:
		trimmed, _ := trim(fresh)
		s.target.Swept(trimmed.(runtime.Object))
	}
	delete(s.held, key)
}

// unlabelled is one resource a Sweeper follows.
type unlabelled struct {
	name, prefix string
	list         func(context.Context, metav1.ListOptions) ([]runtime.Object, metav1.ListMeta, error)
	watch        func(context.Context, metav1.ListOptions) (watch.Interface, error)
	get          func(ctx context.Context, namespace, name string) (runtime.Object, error)
}

func (r *unlabelled) key(obj runtime.Object) string {
	m, err := metaOf(obj)
	if err != nil {
		return r.prefix
	}
	return r.prefix + m.GetNamespace() + "/" + m.GetName()
}

// objects points into a list's items.
func objects[T any, P interface {
	*T
	runtime.Object
}](items []T) []runtime.Object {
	out := make([]runtime.Object, len(items))
	for i := range items {
		out[i] = P(&items[i])
	}
	return out
}

func pvcs(c kubernetes.Interface) *unlabelled {
	return &unlabelled{name: "persistentvolumeclaims", prefix: "pvc/",
		list: func(ctx context.Context, o metav1.ListOptions) ([]runtime.Object, metav1.ListMeta, error) {
			l, err := c.CoreV1().PersistentVolumeClaims("").List(ctx, o)
			if err != nil {
				return nil, metav1.ListMeta{}, err
			}
			return objects(l.Items), l.ListMeta, nil
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.CoreV1().PersistentVolumeClaims("").Watch(ctx, o)
		},
		get: func(ctx context.Context, ns, name string) (runtime.Object, error) {
			return c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		},
	}
}

func pvs(c kubernetes.Interface) *unlabelled {
	return &unlabelled{name: "persistentvolumes", prefix: "pv/",
		list: func(ctx context.Context, o metav1.ListOptions) ([]runtime.Object, metav1.ListMeta, error) {
			l, err := c.CoreV1().PersistentVolumes().List(ctx, o)
			if err != nil {
				return nil, metav1.ListMeta{}, err
			}
			return objects(l.Items), l.ListMeta, nil
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.CoreV1().PersistentVolumes().Watch(ctx, o)
		},
		get: func(ctx context.Context, _, name string) (runtime.Object, error) {
			return c.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		},
	}
}

func uidOf(obj runtime.Object) string {
	if m, err := metaOf(obj); err == nil {
		return string(m.GetUID())
	}
	return ""
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
