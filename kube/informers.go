package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/lvm-agent/lvm-agent/kube/apiclient"
)

// WatchMode chooses what the agent's informers ask the API server for.
type WatchMode string

const (
	// WatchAll watches every PVC and PV and filters locally: works with
	// provisioners that do not set the volume.node label, at a cost that
	// grows with the cluster (every change to any PVC or PV reaches every node).
	WatchAll WatchMode = "all"
	// WatchLabelled watches only objects labelled volume.node=<this node>,
	// filtered by the API server: the cost grows with the node only, but a
	// request without the label is never seen.
	WatchLabelled WatchMode = "labelled"
	// WatchHybrid watches like WatchLabelled; the requests of provisioners
	// that do not label are labelled by the provisioner's Labeller (one
	// watcher per cluster) and then arrive like the others, and a Sweeper
	// lists the unlabelled objects at start and every --sweep-interval, so
	// that none is ignored where no labeller runs.
	WatchHybrid WatchMode = "hybrid"
)

// ParseWatchMode checks a --watch-mode value.
func ParseWatchMode(s string) (WatchMode, error) {
	switch m := WatchMode(s); m {
	case WatchAll, WatchLabelled, WatchHybrid:
		return m, nil
	}
	return "", fmt.Errorf("watch mode must be %q, %q or %q, not %q", WatchHybrid, WatchLabelled, WatchAll, s)
}

// Informers are the agent's PVC and PV informers.
type Informers struct {
	PVC cache.SharedIndexInformer
	PV  cache.SharedIndexInformer
}

// Start runs the informers until ctx ends.
func (i *Informers) Start(ctx context.Context) {
	go i.PVC.RunWithContext(ctx)
	go i.PV.RunWithContext(ctx)
}

// newInformer is an informer of r's objects (obj is the kind's zero value),
// listed and watched with tweak's options, cached through transform (when
// set), without resync: client-go's informer factory does this for a
// clientset; the agent's client is not one (package apiclient). c is the
// client r comes from: a fake clientset's informers do not ask for streamed
// lists, which its watch cannot serve.
func newInformer[T runtime.Object, L runtime.Object](c apiclient.Interface, r apiclient.Resource[T, L], obj T,
	tweak func(*metav1.ListOptions), transform cache.TransformFunc) cache.SharedIndexInformer {
	if tweak == nil {
		tweak = func(*metav1.ListOptions) {}
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			return r.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			return r.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, c), obj, 0,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	if transform != nil {
		_ = inf.SetTransform(transform) // errors only once started
	}
	return inf
}

// claimsAndVolumes are informers of every PVC and PV that tweak's options
// select, cached through transform.
func claimsAndVolumes(c apiclient.Interface, tweak func(*metav1.ListOptions), transform cache.TransformFunc) (pvcs, pvs cache.SharedIndexInformer) {
	return newInformer(c, c.PVCs(""), &corev1.PersistentVolumeClaim{}, tweak, transform),
		newInformer(c, c.PVs(), &corev1.PersistentVolume{}, tweak, transform)
}

// InformerOption adjusts NewInformers.
type InformerOption func(*informerConfig)

type informerConfig struct {
	owner   *Node
	metrics *ClientMetrics
}

// WithOwner caches the PVCs and PVs that owner does not own as stubs (name,
// namespace, UID, resourceVersion): in WatchAll mode nearly every object is
// someone else's, and this keeps the cache's memory to a few hundred bytes
// per foreign object. The agent decides on each event from the object as
// received, so a stub never hides a request that becomes ours.
func WithOwner(owner Node) InformerOption {
	return func(c *informerConfig) { c.owner = &owner }
}

// WithMetrics counts the objects the informers receive.
func WithMetrics(m *ClientMetrics) InformerOption {
	return func(c *informerConfig) { c.metrics = m }
}

// NewInformers builds the informers for a node. The cached objects are
// trimmed to what the agent reads, which keeps memory flat when every PVC of
// a large cluster is watched.
func NewInformers(c apiclient.Interface, node string, mode WatchMode, opts ...InformerOption) *Informers {
	cfg := informerConfig{}
	for _, o := range opts {
		o(&cfg)
	}
	var tweak func(*metav1.ListOptions)
	if mode == WatchLabelled || mode == WatchHybrid {
		sel := NodeSelector(node)
		tweak = func(o *metav1.ListOptions) { o.LabelSelector = sel }
	}
	// No resync: every request arrives as an event, and the agent's own
	// retries come from its work queue, not from rescans.
	inf := &Informers{}
	inf.PVC, inf.PV = claimsAndVolumes(c, tweak, cfg.transform)
	if cfg.metrics != nil {
		// Errors only come from a stopped informer; these are new.
		_, _ = inf.PVC.AddEventHandler(counter{cfg, SourceInformer})
		_, _ = inf.PV.AddEventHandler(counter{cfg, SourceInformer})
	}
	return inf
}

// NodeSelector is the label selector of the objects labelled for node.
func NodeSelector(node string) string {
	return labels.Set{LabelNode: NodeLabelValue(node)}.AsSelector().String()
}

// UnlabelledSelector is the label selector of the objects without the
// volume.node label: what the hybrid mode's sweep lists.
func UnlabelledSelector() string { return "!" + LabelNode }

// selectUnlabelled asks for the objects without the volume.node label.
func selectUnlabelled(o *metav1.ListOptions) { o.LabelSelector = UnlabelledSelector() }

// transform is applied by the informers to every object they receive, from
// lists and watches alike, before it is cached or handed to the agent. (It
// may see an object twice: a streamed list goes through a temporary store.)
func (c informerConfig) transform(obj any) (any, error) {
	if c.owner != nil {
		switch o := obj.(type) {
		case *corev1.PersistentVolumeClaim:
			if !c.owner.OwnsPVC(o) && !c.owner.Misdirected(o) {
				return stub(o), nil
			}
		case *corev1.PersistentVolume:
			if !c.owner.OwnsPV(o) && !c.owner.Misdirected(o) {
				return stub(o), nil
			}
		}
	}
	return trim(obj)
}

// counter is an informer event handler that counts the objects received
// (once each, unlike the transform).
type counter struct {
	informerConfig
	source string
}

func (c counter) OnAdd(obj any, _ bool) { c.count(obj) }
func (c counter) OnUpdate(_, obj any)   { c.count(obj) }
func (c counter) OnDelete(obj any)      { c.count(obj) }
func (c counter) count(obj any) {
	var resource string
	switch obj.(type) {
	case *corev1.PersistentVolumeClaim:
		resource = "persistentvolumeclaims"
	case *corev1.PersistentVolume:
		resource = "persistentvolumes"
	default:
		return // a tombstone: nothing was received
	}
	foreign := ForeignUnknown
	if c.owner != nil {
		owned, _ := c.owner.Classify(obj)
		foreign = foreignLabel(owned)
	}
	c.metrics.ObjectsReceived(resource, c.source, foreign, 1)
}

// Trim is obj as the informers cache an object of this node: what the agent
// holds of an object it reads itself.
func Trim(obj runtime.Object) runtime.Object {
	out, _ := trim(obj)
	return out.(runtime.Object)
}

// trim keeps only the fields the agent uses. It is idempotent, as an
// informer's transform must be.
func trim(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		return &corev1.PersistentVolumeClaim{ObjectMeta: trimMeta(o.ObjectMeta)}, nil
	case *corev1.PersistentVolume:
		pv := &corev1.PersistentVolume{ObjectMeta: trimMeta(o.ObjectMeta)}
		pv.Spec.CSI = o.Spec.CSI
		pv.Spec.Local = o.Spec.Local
		pv.Spec.NodeAffinity = o.Spec.NodeAffinity
		pv.Spec.ClaimRef = o.Spec.ClaimRef
		return pv, nil
	}
	return obj, nil
}

func trimMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		Labels: only(m.Labels, keptLabels), Annotations: only(m.Annotations, keptAnnotations), DeletionTimestamp: m.DeletionTimestamp}
}

// The annotations and labels the cache keeps of an owned object: the
// protocol's, and the PV's provisioned-by (ownership of local PVs). Anyone
// who may edit a PVC may add 256 KiB of annotations to it; the agent reads
// none of them.
var (
	keptAnnotations = []string{AnnLifecycle, AnnSpec, AnnError, AnnReason, AnnDevice, AnnSelectedNode,
		AnnProvisionedBy}
	keptLabels = []string{LabelNode}
)

// only is m restricted to keys (nil when none is there).
func only(m map[string]string, keys []string) map[string]string {
	var out map[string]string
	for _, k := range keys {
		if v, ok := m[k]; ok {
			if out == nil {
				out = make(map[string]string, len(keys))
			}
			out[k] = v
		}
	}
	return out
}

// stub is a PVC or PV reduced to its name, namespace, UID and
// resourceVersion: what a cache holds of an object that is not the agent's.
// Anything else is returned as it is.
func stub(obj any) any {
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		return &corev1.PersistentVolumeClaim{ObjectMeta: stubMeta(o.ObjectMeta)}
	case *corev1.PersistentVolume:
		return &corev1.PersistentVolume{ObjectMeta: stubMeta(o.ObjectMeta)}
	}
	return obj
}

func stubMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion}
}
