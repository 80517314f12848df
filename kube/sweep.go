package kube

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// The hybrid watch mode's sweep. The informers watch only objects labelled
// for this node, which keeps the agent's cost independent of the cluster's
// size; a provisioner that does not set the label (one written for the
// original agent) would then go unanswered. The sweep lists, every interval,
// the PVCs and PVs that carry no volume.node label at all, and hands the open
// requests of this node to the agent, which treats them as informer events.
//
// The lists are paginated and ask for the latest state (resourceVersion
// unset): kube-apiserver serves such lists from its watch cache
// (ConsistentListFromCache, ListFromCacheSnapshot), so a sweep costs etcd one
// revision read, and the agent holds one page at a time, never the list.
// (resourceVersion "0" is served from the cache too, but ignores the page
// size, and may be older than what the agent has already seen.)

// SweepTarget takes what a sweep finds; the agent implements it.
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
	Node     Node
	Interval time.Duration
	// PageSize bounds the objects of one list response (default 500).
	PageSize int64
	// Recorder, when set, records a Warning event on each request found by
	// a sweep, so that the provisioner's operator sees why it was slow.
	Recorder record.EventRecorder
	Metrics  *ClientMetrics
	// Registerer registers the sweep's own metrics (nil: not registered).
	Registerer prometheus.Registerer
}

// Sweeper runs the hybrid mode's sweeps.
type Sweeper struct {
	client kubernetes.Interface
	target SweepTarget
	cfg    SweepConfig
	// held are the objects handed to the target, by key, as last handed:
	// their next state (answered, deleted, labelled) must be handed over too.
	held map[string]runtime.Object

	passes   *prometheus.CounterVec
	duration prometheus.Histogram
	listed   *prometheus.GaugeVec
	found    *prometheus.CounterVec
}

// NewSweeper makes a sweeper; Run starts it.
func NewSweeper(c kubernetes.Interface, target SweepTarget, cfg SweepConfig) *Sweeper {
	if cfg.PageSize <= 0 {
		cfg.PageSize = 500
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 30 * time.Second
	}
	s := &Sweeper{client: c, target: target, cfg: cfg, held: map[string]runtime.Object{},
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_sweeps_total",
			Help: "Hybrid mode: sweeps of the unlabelled PVCs and PVs, by result (ok, error)."}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "lvm_agent_sweep_duration_seconds",
			Help: "Hybrid mode: time of one sweep.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 12)}),
		listed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lvm_agent_sweep_listed_objects",
			Help: "Hybrid mode: unlabelled objects listed by the last sweep, by resource: what each sweep costs."}, []string{"resource"}),
		found: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_unlabelled_requests_total",
			Help: "Hybrid mode: requests of this node found by a sweep because their provisioner does not set the " + LabelNode + " label, by resource."},
			[]string{"resource"}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(s.passes, s.duration, s.listed, s.found)
	}
	return s
}

// Run sweeps at once and then every interval (with jitter, so that the
// agents of a cluster started together do not sweep together) until ctx ends.
func (s *Sweeper) Run(ctx context.Context) {
	klog.InfoS("Sweeping unlabelled PVCs and PVs for requests of provisioners that do not label", "interval", s.cfg.Interval, "selector", UnlabelledSelector())
	wait.JitterUntilWithContext(ctx, func(ctx context.Context) {
		if err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			klog.ErrorS(err, "Sweep failed; next one in an interval", "interval", s.cfg.Interval)
		}
	}, s.cfg.Interval, 0.2, true)
}

// Sweep makes one pass over the unlabelled PVCs and PVs.
func (s *Sweeper) Sweep(ctx context.Context) error {
	start := time.Now()
	seen := map[string]bool{} // the held objects listed again
	errPVC := s.sweepPVCs(ctx, seen)
	if errPVC == nil {
		s.settle(ctx, pvcPrefix, seen)
	}
	errPV := s.sweepPVs(ctx, seen)
	if errPV == nil {
		s.settle(ctx, pvPrefix, seen)
	}
	s.duration.Observe(time.Since(start).Seconds())
	if errPVC != nil {
		s.passes.WithLabelValues("error").Inc()
		return errPVC
	}
	if errPV != nil {
		s.passes.WithLabelValues("error").Inc()
		return errPV
	}
	s.passes.WithLabelValues("ok").Inc()
	return nil
}

// Key prefixes of held objects.
const (
	pvcPrefix = "pvc/"
	pvPrefix  = "pv/"
)

func (s *Sweeper) sweepPVCs(ctx context.Context, seen map[string]bool) error {
	n := 0
	err := s.pages(ctx, func(ctx context.Context, o metav1.ListOptions) (string, error) {
		l, err := s.client.CoreV1().PersistentVolumeClaims("").List(ctx, o)
		if err != nil {
			return "", err
		}
		n += len(l.Items)
		own := 0
		for i := range l.Items {
			pvc := &l.Items[i]
			owned := s.cfg.Node.OwnsPVC(pvc)
			if owned {
				own++
			}
			open := pvc.Annotations[AnnLifecycle] == StateCreating && owned
			s.hand(pvcPrefix+pvc.Namespace+"/"+pvc.Name, pvc, open, "persistentvolumeclaims", seen)
		}
		s.cfg.Metrics.ObjectsReceived("persistentvolumeclaims", SourceSweep, Own, own)
		s.cfg.Metrics.ObjectsReceived("persistentvolumeclaims", SourceSweep, Foreign, len(l.Items)-own)
		return l.Continue, nil
	})
	s.listed.WithLabelValues("persistentvolumeclaims").Set(float64(n))
	return err
}

func (s *Sweeper) sweepPVs(ctx context.Context, seen map[string]bool) error {
	n := 0
	err := s.pages(ctx, func(ctx context.Context, o metav1.ListOptions) (string, error) {
		l, err := s.client.CoreV1().PersistentVolumes().List(ctx, o)
		if err != nil {
			return "", err
		}
		n += len(l.Items)
		own := 0
		for i := range l.Items {
			pv := &l.Items[i]
			owned := s.cfg.Node.OwnsPV(pv)
			if owned {
				own++
			}
			open := pv.Annotations[AnnLifecycle] == StateDeleting && owned
			s.hand(pvPrefix+pv.Name, pv, open, "persistentvolumes", seen)
		}
		s.cfg.Metrics.ObjectsReceived("persistentvolumes", SourceSweep, Own, own)
		s.cfg.Metrics.ObjectsReceived("persistentvolumes", SourceSweep, Foreign, len(l.Items)-own)
		return l.Continue, nil
	})
	s.listed.WithLabelValues("persistentvolumes").Set(float64(n))
	return err
}

// pages lists the unlabelled objects page by page. An expired continue
// token fails the pass; the next pass starts over.
func (s *Sweeper) pages(ctx context.Context, page func(context.Context, metav1.ListOptions) (string, error)) error {
	o := metav1.ListOptions{LabelSelector: UnlabelledSelector(), Limit: s.cfg.PageSize}
	for {
		cont, err := page(ctx, o)
		if err != nil || cont == "" {
			return err
		}
		o.Continue = cont
	}
}

// hand gives the target an open request, or the next state of an object
// it was given before, and marks what stays held as seen.
func (s *Sweeper) hand(key string, obj runtime.Object, open bool, resource string, seen map[string]bool) {
	prev, held := s.held[key]
	if !open && !held {
		return
	}
	trimmed, _ := trim(obj)
	o := trimmed.(runtime.Object)
	if open && (!held || uidOf(prev) != uidOf(o)) {
		s.warn(key, o, resource)
	}
	if m, err := metaOf(o); err == nil && s.cfg.Metrics != nil {
		s.cfg.Metrics.clock.seen(resource, m.GetNamespace(), m.GetName(), open)
	}
	s.target.Swept(o)
	if open {
		s.held[key] = o
		seen[key] = true
	} else {
		delete(s.held, key)
	}
}

func (s *Sweeper) warn(key string, obj runtime.Object, resource string) {
	s.found.WithLabelValues(resource).Inc()
	klog.InfoS("Found a request without the node label: its provisioner should set the label, so that the request is seen at once instead of by the next sweep",
		"object", key, "label", LabelNode+"="+NodeLabelValue(s.cfg.Node.Name), "interval", s.cfg.Interval)
	if s.cfg.Recorder != nil {
		s.cfg.Recorder.Eventf(obj, corev1.EventTypeWarning, "UnlabelledRequest",
			"lvm-agent on node %s found this request by its periodic sweep (every %v), not by its watch: set label %s=%s on requests to have them seen at once",
			s.cfg.Node.Name, s.cfg.Interval, LabelNode, NodeLabelValue(s.cfg.Node.Name))
	}
}

// settle handles the held objects of one kind that a complete pass did not
// list: deleted, or labelled since (and then the informers' from now on).
// Each is read once more, so that the agent is told which.
func (s *Sweeper) settle(ctx context.Context, prefix string, seen map[string]bool) {
	for key, prev := range s.held {
		if seen[key] || !strings.HasPrefix(key, prefix) {
			continue
		}
		fresh, err := s.get(ctx, prev)
		switch {
		case apierrors.IsNotFound(err):
			s.target.SweptGone(prev)
		case err != nil:
			klog.ErrorS(err, "Could not read a request that left the sweep; will try at the next one", "object", key)
			continue
		default:
			trimmed, _ := trim(fresh)
			s.target.Swept(trimmed.(runtime.Object))
		}
		delete(s.held, key)
	}
}

func (s *Sweeper) get(ctx context.Context, obj runtime.Object) (runtime.Object, error) {
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		return s.client.CoreV1().PersistentVolumeClaims(o.Namespace).Get(ctx, o.Name, metav1.GetOptions{})
	case *corev1.PersistentVolume:
		return s.client.CoreV1().PersistentVolumes().Get(ctx, o.Name, metav1.GetOptions{})
	}
	return nil, apierrors.NewNotFound(corev1.Resource("unknown"), "")
}

func uidOf(obj runtime.Object) string {
	if m, err := metaOf(obj); err == nil {
		return string(m.GetUID())
	}
	return ""
}
