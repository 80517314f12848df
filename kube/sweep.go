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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/kube/apiclient"
)

// The hybrid watch mode's safety net. The informers watch only objects
// labelled for this node, which keeps the agent's cost independent of the
// cluster's size; a provisioner that does not set the label (one written for
// the original agent) is served by the provisioner's Labeller, which labels
// such requests (one watcher of the unlabelled objects per cluster), or,
// where no labeller holds its Lease, by the agent's own UnlabelledWatch
// (unlabelled.go). The Sweeper lists the PVCs and PVs that carry no
// volume.node label at all, at start and every Interval while the labeller
// runs, and hands the open requests of this node to the agent, which treats
// them as informer events: a request the labeller did not label (it cannot
// route it, or it was made in the moments a labeller was failing) is late,
// but never lost.
//
// It lists and never watches. Measured (make bench-cluster, hybrid mode,
// docs/architecture.md "Scale"): with a watch of the unlabelled objects on
// every agent, every unlabelled change went to every node, 332 watch events
// per transition at 300 agents against 4.2 in labelled mode; the API
// server's cost per transition grew 2.3 times from 1 agent to 300. A list
// costs each agent its unlabelled objects once per Interval instead, paged:
// the list asks for the latest state (resourceVersion unset), which
// kube-apiserver serves from its watch cache (ConsistentListFromCache,
// ListFromCacheSnapshot): etcd is read for one revision only, and the agent
// holds a page at a time, never the list. (resourceVersion "0" is served
// from the cache too, but ignores the page size, and may be older than what
// the agent has seen.) Nothing of the unlabelled objects is cached but the
// open requests of this node.
//
// A request handed over stays held until a list no longer shows it open:
// answered, it is handed over once more; gone from the unlabelled objects
// (deleted, or labelled since: the labeller's hand-over to the informers),
// it is read once more and handed over as it is now, or as gone. The agent
// thus sees every held request's next state, at the latest one Interval
// later, whichever source shows it first.
//
// Why a list and not, where a labeller runs, a second pair of informers on
// !volume.node with the stub transform (issue 18; UnlabelledWatch is that
// pair, for clusters without a labeller): measured, it costs memory and CPU
// that this does not. A prototype (informers with the
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
	// Interval between full lists (0: only at start).
	Interval time.Duration
	// PageSize bounds the objects of one list response (default 500).
	PageSize int64
	// Recorder, when set, records a Warning event on each request found
	// without the label, so that the provisioner's operator learns why.
	Recorder record.EventRecorder
	Metrics  *ClientMetrics
	// Registerer registers the sweeper's own metrics (nil: not registered).
	Registerer prometheus.Registerer
	// Skip, when set and true, skips a pass: the unlabelled objects are
	// watched (UnlabelledWatch), and their requests are not late.
	Skip func() bool
}

// Sweeper lists the unlabelled PVCs and PVs.
type Sweeper struct {
	target    SweepTarget
	cfg       SweepConfig
	resources []*unlabelled

	late sync.Once // the log line that says how to fix late requests

	mu sync.Mutex
	// held are the objects handed to the target, by key, as last handed:
	// their next state (answered, deleted, labelled) must be handed over too.
	held map[string]runtime.Object

	passes   *prometheus.CounterVec
	duration prometheus.Histogram
	listed   *prometheus.GaugeVec
	found    *prometheus.CounterVec
}

// NewSweeper makes a sweeper; Run starts it.
func NewSweeper(c apiclient.Interface, target SweepTarget, cfg SweepConfig) *Sweeper {
	if cfg.PageSize <= 0 {
		cfg.PageSize = 500
	}
	s := &Sweeper{target: target, cfg: cfg, held: map[string]runtime.Object{},
		resources: []*unlabelled{pvcs(c), pvs(c)},
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_sweeps_total",
			Help: "Hybrid mode: full lists of the unlabelled PVCs and PVs, by result (ok, error, skipped: the agent watches them)."}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "lvm_agent_sweep_duration_seconds",
			Help: "Hybrid mode: time of one full list of the unlabelled PVCs and PVs.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 12)}),
		listed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lvm_agent_sweep_listed_objects",
			Help: "Hybrid mode: unlabelled objects in the last full list, by resource: what a list costs."}, []string{"resource"}),
		found: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_unlabelled_requests_total",
			Help: "Hybrid mode: requests of this node found late, by a sweep, without the " + LabelNode + " label (neither the labeller nor this agent's watch delivered them), by resource."},
			[]string{"resource"}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(s.passes, s.duration, s.listed, s.found)
	}
	return s
}

// Run lists the unlabelled objects at once and then every Interval
// (jittered, so that agents started together do not list together), until
// ctx ends; a failed list is retried with backoff.
func (s *Sweeper) Run(ctx context.Context) {
	klog.InfoS("Listing unlabelled PVCs and PVs for requests of provisioners that do not label", "selector", UnlabelledSelector(), "interval", s.cfg.Interval)
	newBackoff := func() wait.Backoff {
		return wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.2, Steps: 7, Cap: time.Minute}
	}
	backoff := newBackoff()
	for ctx.Err() == nil {
		if err := s.Sweep(ctx); err != nil {
			if ctx.Err() == nil {
				d := backoff.Step()
				klog.ErrorS(err, "Listing unlabelled objects failed; will retry", "in", d)
				sleep(ctx, d)
			}
			continue
		}
		backoff = newBackoff()
		if s.cfg.Interval <= 0 {
			return
		}
		sleep(ctx, wait.Jitter(s.cfg.Interval, 0.2))
	}
}

// Sweep makes one full pass over the unlabelled PVCs and PVs.
func (s *Sweeper) Sweep(ctx context.Context) error {
	if s.cfg.Skip != nil && s.cfg.Skip() {
		s.passes.WithLabelValues("skipped").Inc()
		return nil
	}
	start := time.Now()
	var errs []error
	for _, r := range s.resources {
		errs = append(errs, s.list(ctx, r))
	}
	s.duration.Observe(time.Since(start).Seconds())
	if err := errors.Join(errs...); err != nil {
		s.passes.WithLabelValues("error").Inc()
		return err
	}
	s.passes.WithLabelValues("ok").Inc()
	return nil
}

// list lists one resource page by page, hands over what it finds, and then
// settles the held objects it did not list. An expired continue token fails
// the pass; the next one starts over.
func (s *Sweeper) list(ctx context.Context, r *unlabelled) error {
	o := metav1.ListOptions{LabelSelector: UnlabelledSelector(), Limit: s.cfg.PageSize}
	seen := map[string]bool{} // the held objects listed again
	n := 0
	for {
		items, meta, err := r.list(ctx, o)
		if err != nil {
			return err
		}
		n += len(items)
		for _, obj := range items {
			s.received(r, obj, seen)
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
	return nil
}

// received handles an unlabelled object: it hands over an open request of
// this node, or the next state of an object handed over before, and marks
// what stays held as seen.
func (s *Sweeper) received(r *unlabelled, obj runtime.Object, seen map[string]bool) {
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
	seen[key] = true
}

func (s *Sweeper) warn(key string, obj runtime.Object, resource string) {
	s.found.WithLabelValues(resource).Inc()
	const hint = "requests without the node label reach the agents at once only where lvm-agent provisioner runs with --label-requests (its labeller holds the --labeller-lease Lease) or, where none does, through each agent's own watch of them; this one was found by a list: have its provisioner set the label, or check the labeller"
	s.late.Do(func() {
		klog.InfoS("Found a request late, without the node label: "+hint, "object", key, "label", LabelNode+"="+NodeLabelValue(s.cfg.Node.Name),
			"metric", "lvm_agent_unlabelled_requests_total")
	})
	klog.V(2).InfoS("Unlabelled request found by a sweep", "object", key)
	if s.cfg.Recorder != nil {
		s.cfg.Recorder.Eventf(obj, corev1.EventTypeWarning, "UnlabelledRequest",
			"lvm-agent on node %s found this request late, by a list of the unlabelled objects: set label %s=%s on requests, or run lvm-agent provisioner with --label-requests",
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

func pvcs(c apiclient.Interface) *unlabelled {
	return &unlabelled{name: "persistentvolumeclaims", prefix: "pvc/",
		list: func(ctx context.Context, o metav1.ListOptions) ([]runtime.Object, metav1.ListMeta, error) {
			l, err := c.PVCs("").List(ctx, o)
			if err != nil {
				return nil, metav1.ListMeta{}, err
			}
			return objects(l.Items), l.ListMeta, nil
		},
		get: func(ctx context.Context, ns, name string) (runtime.Object, error) {
			return c.PVCs(ns).Get(ctx, name, metav1.GetOptions{})
		},
	}
}

func pvs(c apiclient.Interface) *unlabelled {
	return &unlabelled{name: "persistentvolumes", prefix: "pv/",
		list: func(ctx context.Context, o metav1.ListOptions) ([]runtime.Object, metav1.ListMeta, error) {
			l, err := c.PVs().List(ctx, o)
			if err != nil {
				return nil, metav1.ListMeta{}, err
			}
			return objects(l.Items), l.ListMeta, nil
		},
		get: func(ctx context.Context, _, name string) (runtime.Object, error) {
			return c.PVs().Get(ctx, name, metav1.GetOptions{})
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
