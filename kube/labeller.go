package kube

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/kube/apiclient"
)

// The Labeller gives the requests of provisioners that do not label (one
// written for the original agent) the volume.node label, so that the
// hybrid mode's agents need not watch the unlabelled objects at all: one
// watcher of them per cluster instead of one per node. It runs in the
// provisioner's leader. Measured (make bench-cluster, docs/architecture.md
// "Scale"): the agents' own watches of the unlabelled objects sent every
// unlabelled change to every node, 332 watch events per transition with 300
// agents against 4.2 in labelled mode.
//
// It watches the PVCs and PVs without the label (client-go informers with
// the selector), keeps a stub of every one that is no open request (name,
// namespace, UID, resourceVersion: about a kilobyte each, in one process
// per cluster) and the routed fields of those that are, and labels each open
// request for the node Route names. It writes nothing else, never an object
// that has the label (such an object leaves its watch), and only the
// version it read: a conflict is read again, a deleted or labelled object is
// dropped.
type Labeller struct {
	client   apiclient.Interface
	pvcs     cache.SharedIndexInformer
	pvs      cache.SharedIndexInformer
	queue    workqueue.TypedRateLimitingInterface[labelKey]
	labelled *prometheus.CounterVec
	// lease, when set, holds the labeller's Lease while it runs (see unlabelled.go).
	lease Heartbeat
}

// A Heartbeat holds a Lease while it runs and deletes it on Stop:
// component-helpers' lease controller (provisioner.LabellerLease).
type Heartbeat interface {
	Run(ctx context.Context)
	Stop()
}

type labelKey struct {
	pv  bool
	key string // namespace/name, as the informers' store has it
}

// NewLabeller makes a labeller; Run starts it. reg, when set, registers its
// metrics.
func NewLabeller(c apiclient.Interface, reg prometheus.Registerer) *Labeller {
	pvcs, pvs := claimsAndVolumes(c, selectUnlabelled, func(obj any) (any, error) {
		if _, _, ok := Route(obj); !ok {
			return stub(obj), nil
		}
		return trim(obj)
	})
	l := &Labeller{client: c, pvcs: pvcs, pvs: pvs,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[labelKey](100*time.Millisecond, time.Minute),
			workqueue.TypedRateLimitingQueueConfig[labelKey]{Name: "labeller"}),
		labelled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_labeller_labelled_total",
			Help: "Requests of provisioners that do not label given the " + LabelNode + " label by the provisioner, by resource."}, []string{"resource"}),
	}
	if reg != nil {
		reg.MustRegister(l.labelled)
	}
	for _, inf := range []struct {
		i  cache.SharedIndexInformer
		pv bool
	}{{l.pvcs, false}, {l.pvs, true}} {
		// Errors only come from a stopped informer; these are new.
		_, _ = inf.i.AddEventHandler(cache.FilteringResourceEventHandler{
			FilterFunc: func(obj any) bool { _, _, ok := Route(obj); return ok },
			Handler: cache.ResourceEventHandlerFuncs{
				AddFunc:    func(obj any) { l.enqueue(inf.pv, obj) },
				UpdateFunc: func(_, obj any) { l.enqueue(inf.pv, obj) },
			},
		})
	}
	return l
}

// WithLease has the labeller run hb, the heartbeat of its Lease, from the
// moment its caches have synced until it stops, so that hybrid-mode agents
// know that it runs (LabellerPresence).
func (l *Labeller) WithLease(hb Heartbeat) *Labeller {
	l.lease = hb
	return l
}

func (l *Labeller) enqueue(pv bool, obj any) {
	if k, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
		l.queue.Add(labelKey{pv: pv, key: k})
	}
}

// Run labels until ctx ends, with workers writers.
func (l *Labeller) Run(ctx context.Context, workers int) {
	defer l.queue.ShutDown()
	klog.InfoS("Labelling the requests of provisioners that do not label", "selector", UnlabelledSelector(), "label", LabelNode)
	go l.pvcs.RunWithContext(ctx)
	go l.pvs.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), l.pvcs.HasSynced, l.pvs.HasSynced) {
		return
	}
	if l.lease != nil {
		klog.InfoS("Holding the labeller's Lease while labelling", "duration", LabellerLeaseDuration)
		go l.lease.Run(ctx)
		defer l.lease.Stop()
	}
	for range max(workers, 1) {
		go wait.UntilWithContext(ctx, func(ctx context.Context) {
			for l.next(ctx) {
			}
		}, time.Second)
	}
	<-ctx.Done()
}

// next labels one queued object; false when the queue is shut down.
func (l *Labeller) next(ctx context.Context) bool {
	k, quit := l.queue.Get()
	if quit {
		return false
	}
	defer l.queue.Done(k)
	if err := l.label(ctx, k); err != nil {
		if apierrors.IsConflict(err) {
			klog.V(2).InfoS("A request changed before it was labelled; reading it again", "object", k.key)
		} else {
			klog.ErrorS(err, "Could not label a request; will retry", "object", k.key)
		}
		l.queue.AddRateLimited(k)
		return true
	}
	l.queue.Forget(k)
	return true
}

// label labels the object of k as its informer holds it: gone from the
// cache (deleted, or labelled by someone), or no open request, it is left
// alone. A conflict (the object changed since the cache's copy) reads it
// again from the API server and decides anew.
func (l *Labeller) label(ctx context.Context, k labelKey) error {
	inf, resource := l.pvcs, "persistentvolumeclaims"
	if k.pv {
		inf, resource = l.pvs, "persistentvolumes"
	}
	item, exists, err := inf.GetStore().GetByKey(k.key)
	if err != nil || !exists {
		return err
	}
	obj := item.(runtime.Object)
	for read := 0; ; read++ {
		node, byHostname, ok := Route(obj)
		if m, err := metaOf(obj); err != nil || !ok || m.GetLabels()[LabelNode] != "" {
			return err
		}
		if byHostname {
			if node, err = l.nodeOfHostname(ctx, node); err != nil || node == "" {
				return err
			}
		}
		value := NodeLabelValue(node)
		err = LabelRequest(ctx, l.client, obj, value)
		switch {
		case err == nil:
			l.labelled.WithLabelValues(resource).Inc()
			klog.V(2).InfoS("Labelled a request for its node", "resource", resource, "object", k.key, "label", LabelNode+"="+value)
			return nil
		case apierrors.IsNotFound(err):
			return nil
		case !apierrors.IsConflict(err) || read > 0:
			return err // retried from the queue, from the cache's copy then
		}
		if obj, err = l.get(ctx, k); apierrors.IsNotFound(err) {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// get reads the object of k from the API server.
func (l *Labeller) get(ctx context.Context, k labelKey) (runtime.Object, error) {
	ns, name, err := cache.SplitMetaNamespaceKey(k.key)
	if err != nil {
		return nil, err
	}
	if k.pv {
		return l.client.PVs().Get(ctx, name, metav1.GetOptions{})
	}
	return l.client.PVCs(ns).Get(ctx, name, metav1.GetOptions{})
}

// nodeOfHostname is the Node whose kubernetes.io/hostname label is host: a
// local PV's affinity names the label, the volume.node label the node name.
// No Node with the label: host itself, as an agent that cannot read its
// Node matches it (Node.hostname); several: "", left to the agents' sweep.
func (l *Labeller) nodeOfHostname(ctx context.Context, host string) (string, error) {
	nodes, err := NodesOfHostname(ctx, l.client, host)
	switch {
	case err != nil:
		return "", err
	case len(nodes) == 0:
		return host, nil
	case len(nodes) > 1:
		klog.InfoS("Several Nodes carry a local PV's hostname; not labelling it", "hostname", host, "nodes", len(nodes))
		return "", nil
	}
	return nodes[0].Name, nil
}
