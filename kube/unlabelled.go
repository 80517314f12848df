package kube

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/kube/apiclient"
)

// How a hybrid-mode agent learns whether the requests of provisioners that
// do not label reach it labelled (issue 24).
//
// The hybrid mode's informers watch only the objects labelled for their
// node. Where the provisioner's Labeller runs, it labels every other request
// and the agents need nothing more: one watcher of the unlabelled objects per
// cluster (measured flat in the number of nodes, docs/architecture.md
// "Scale"). Where none runs (a provisioner of the original design alone),
// each agent must watch the unlabelled objects itself, or their requests wait
// for a sweep. The Labeller says that it runs with a Lease, as kubelet does
// for its Node: LabellerLeaseDuration long, renewed every quarter of it, from
// the moment its caches have synced (from then on it labels every open
// request there is), deleted when it stops. Each agent follows that one
// object (a watch with a name field selector: one event per renewal, N agents
// / 10 s) and watches the unlabelled objects (UnlabelledWatch) while the
// Lease is absent, released, or not renewed within its duration.
//
// No request is left to nobody: while the agent's unlabelled watch is
// stopped, the Lease was renewed less than a duration ago by a labeller whose
// caches had synced, which labels each open request (the labelled watch then
// delivers it); once the agent starts its unlabelled watch, that watch's
// first list holds every unlabelled request made before, the watch every one
// after. A labeller that stops cleanly deletes its Lease and the agents take
// over within a watch event; one that crashes is noticed within
// LabellerLeaseDuration (a standby provisioner's labeller usually renews the
// Lease before that: the leader election's Lease is 15 s). A request the
// labeller cannot route is still found by the Sweeper.

const (
	// LabellerLeaseName is the Lease the Labeller renews in the
	// provisioner's namespace.
	LabellerLeaseName = "lvm-agent-labeller"
	// LabellerLeaseDuration is how long the agents wait for a renewal before
	// they watch the unlabelled objects themselves (kubelet's Node Lease: 40 s).
	LabellerLeaseDuration = 40 * time.Second
)

// LeaseRef names a Lease.
type LeaseRef struct{ Namespace, Name string }

func (r LeaseRef) String() string { return r.Namespace + "/" + r.Name }

// ParseLeaseRef parses NAMESPACE/NAME.
func ParseLeaseRef(s string) (LeaseRef, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return LeaseRef{}, fmt.Errorf("%q is not NAMESPACE/NAME of a Lease", s)
	}
	return LeaseRef{Namespace: ns, Name: name}, nil
}

// leaseExpiry is when a Lease seen at now stops vouching for its holder:
// absent, released, or without a duration, at once; renewed since the last
// sight (renewTime changed), a duration after now (the agent's own clock, as
// the node lifecycle controller judges Node Leases: no clock skew between
// machines counts); at first sight, a duration after its renewTime, but no
// later than a duration after now.
func leaseExpiry(l *coordinationv1.Lease, prev *coordinationv1.Lease, prevExpiry, now time.Time) time.Time {
	if l == nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || l.Spec.RenewTime == nil ||
		l.Spec.LeaseDurationSeconds == nil || *l.Spec.LeaseDurationSeconds <= 0 {
		return now
	}
	d := time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	switch {
	case prev == nil || prev.UID != l.UID:
		if exp := l.Spec.RenewTime.Add(d); exp.Before(now.Add(d)) {
			return exp
		}
		return now.Add(d)
	case prev.Spec.RenewTime == nil || !prev.Spec.RenewTime.Equal(l.Spec.RenewTime):
		return now.Add(d)
	}
	return prevExpiry
}

// LabellerPresence follows the labeller's Lease and runs watch while no
// labeller vouches for the unlabelled requests.
type LabellerPresence struct {
	client apiclient.Interface
	lease  LeaseRef
	watch  *UnlabelledWatch
	synced chan struct{}
}

// NewLabellerPresence makes a presence; Run starts it.
func NewLabellerPresence(c apiclient.Interface, lease LeaseRef, watch *UnlabelledWatch) *LabellerPresence {
	return &LabellerPresence{client: c, lease: lease, watch: watch, synced: make(chan struct{})}
}

// Synced is closed once the first decision is made (the unlabelled watch
// started, or the Lease found fresh).
func (p *LabellerPresence) Synced() <-chan struct{} { return p.synced }

// Run follows the Lease until ctx ends, and stops the unlabelled watch then.
func (p *LabellerPresence) Run(ctx context.Context) {
	defer p.watch.Stop()
	inf := newInformer(p.client, p.client.Leases(p.lease.Namespace), &coordinationv1.Lease{}, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", p.lease.Name).String()
	}, nil)
	changed := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	// Errors only come from a stopped informer; this one is new.
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke})
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return
	}
	var prev *coordinationv1.Lease
	var expiry time.Time
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for first := true; ; first = false {
		var l *coordinationv1.Lease
		if item, ok, _ := inf.GetStore().GetByKey(p.lease.String()); ok {
			l = item.(*coordinationv1.Lease)
		}
		now := time.Now()
		expiry = leaseExpiry(l, prev, expiry, now)
		prev = l
		if now.Before(expiry) {
			if p.watch.Stop() || first {
				klog.InfoS("The labeller's Lease is held: requests without the node label reach this agent labelled; not watching the unlabelled objects",
					"lease", p.lease, "holder", *l.Spec.HolderIdentity)
			}
			timer.Reset(expiry.Sub(now))
		} else if p.watch.Start(ctx) {
			klog.InfoS("No labeller holds its Lease: watching the PVCs and PVs without the node label for this node's requests (run lvm-agent provisioner with --label-requests, or label the requests, to spare every node this watch)",
				"lease", p.lease, "selector", UnlabelledSelector())
		}
		if first {
			close(p.synced)
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-timer.C:
		}
	}
}

// UnlabelledWatch watches the PVCs and PVs without the volume.node label,
// while started, and hands this node's objects among them to a SweepTarget:
// the Sweeper's job, done at once instead of every interval, at the cost of
// a stub of every unlabelled object in the cache (about 1.3 KiB each) and of
// every unlabelled change on every node. It runs only while no labeller
// does (LabellerPresence).
type UnlabelledWatch struct {
	client  apiclient.Interface
	target  SweepTarget
	node    Node
	metrics *ClientMetrics
	active  prometheus.Gauge
	// pvcs, pvs read an object again when it leaves the watch.
	pvcs, pvs *unlabelled

	mu   sync.Mutex
	stop context.CancelFunc // nil while stopped
}

// NewUnlabelledWatch makes a watch, stopped; reg, when set, registers its
// gauge.
func NewUnlabelledWatch(c apiclient.Interface, target SweepTarget, node Node, m *ClientMetrics, reg prometheus.Registerer) *UnlabelledWatch {
	w := &UnlabelledWatch{client: c, target: target, node: node, metrics: m, pvcs: pvcs(c), pvs: pvs(c),
		active: prometheus.NewGauge(prometheus.GaugeOpts{Name: "lvm_agent_unlabelled_watch",
			Help: "Hybrid mode: 1 while this agent watches the PVCs and PVs without the " + LabelNode + " label itself (no labeller holds its Lease), else 0."})}
	if reg != nil {
		reg.MustRegister(w.active)
	}
	return w
}

// Active says whether the watch runs.
func (w *UnlabelledWatch) Active() bool { w.mu.Lock(); defer w.mu.Unlock(); return w.stop != nil }

// Start starts the watch until ctx ends or Stop; false if it ran already.
func (w *UnlabelledWatch) Start(ctx context.Context) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stop != nil {
		return false
	}
	ctx, w.stop = context.WithCancel(ctx)
	cfg := informerConfig{owner: &w.node, metrics: w.metrics}
	pvcs, pvs := claimsAndVolumes(w.client, selectUnlabelled, cfg.transform)
	for _, inf := range []cache.SharedIndexInformer{pvcs, pvs} {
		// Errors only come from a stopped informer; these are new.
		_, _ = inf.AddEventHandler(counter{cfg, SourceUnlabelled})
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    w.handOver,
			UpdateFunc: func(_, obj any) { w.handOver(obj) },
			DeleteFunc: func(obj any) { w.left(ctx, obj) },
		})
		go inf.RunWithContext(ctx)
	}
	w.active.Set(1)
	return true
}

// Stop stops the watch; false if it was not running. What it handed over
// stays with the agent: each such request is labelled by the labeller whose
// Lease stopped it, and then delivered by the labelled informers.
func (w *UnlabelledWatch) Stop() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stop == nil {
		return false
	}
	w.stop()
	w.stop = nil
	w.active.Set(0)
	return true
}

// handOver gives the agent an object of this node, open or not: so that it
// also sees a request end. (Nothing unlabelled is misdirected: that is a
// label naming the wrong node.)
func (w *UnlabelledWatch) handOver(obj any) {
	if owned, _ := w.node.Classify(obj); owned {
		w.target.Swept(obj.(runtime.Object))
	}
}

// left handles an object that left the watch: deleted, or labelled (the
// API server's watch says "deleted" for an object that stops matching the
// selector, with its last matching state). An open request is read again:
// gone, the agent forgets it; labelled for this node, the labelled
// informers have it; else it is handed over as it is now.
func (w *UnlabelledWatch) left(ctx context.Context, obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if _, open := w.node.Classify(obj); !open {
		// Not a request the agent holds (it forgot it when it saw it
		// answered): nothing to settle, and no read. Most objects leave
		// this way: a provisioner that labels writes the label with the
		// request, on a claim that was unlabelled until then.
		return
	}
	last := obj.(runtime.Object)
	r := w.pvs
	if _, ok := last.(*corev1.PersistentVolumeClaim); ok {
		r = w.pvcs
	}
	m, err := metaOf(last)
	if err != nil {
		return
	}
	go func() {
		var fresh runtime.Object
		var getErr error
		err := wait.ExponentialBackoffWithContext(ctx, wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Steps: 8, Cap: 10 * time.Second},
			func(ctx context.Context) (bool, error) {
				fresh, getErr = r.get(ctx, m.GetNamespace(), m.GetName())
				return getErr == nil || apierrors.IsNotFound(getErr), nil
			})
		switch {
		case err != nil:
			klog.InfoS("Could not read a request that left the unlabelled objects; the labelled watch or the next sweep will show it", "object", r.key(last), "err", getErr)
		case apierrors.IsNotFound(getErr) || uidOf(fresh) != uidOf(last):
			w.target.SweptGone(last)
			if getErr == nil {
				w.handOver(Trim(fresh))
			}
		default:
			if fm, err := metaOf(fresh); err == nil && w.node.labelled(fm.GetLabels()) {
				return
			}
			w.handOver(Trim(fresh))
		}
	}()
}
