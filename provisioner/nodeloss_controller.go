package provisioner

import (
	"context"
	"errors"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient"
)

// ReasonNodeLost is the Warning event on a claim (or PV) of a lost node.
const ReasonNodeLost = "NodeLost"

// DefaultNodeLossGrace is how long a deleted Node may take to register again
// before its claims are released.
const DefaultNodeLossGrace = 5 * time.Minute

// NodeLoss releases what holds workloads on a node lost for good (NodeLost
// says when that is): a StatefulSet's claim there is deleted, so that its
// replica gets a new one on another node (StorageClass parameter
// onNodeLoss: recreate, the default); any other claim is kept, with a
// NodeLost event that says how to release it, and the node-lost
// annotation that `volume status` shows; a claim still waiting for the
// node's agent to create its LV is sent back to the scheduler; a released
// PV of reclaim policy Delete is removed without the agent's answer (its
// LV stays on the node's disks; the event names it). It runs on the
// provisioner's leader only, like every writer here.
type NodeLoss struct {
	client   apiclient.Interface
	name     string // the provisioner's: only its PVs are looked at
	grace    time.Duration
	lost     *LostNodes
	nodes    corelisters.NodeLister
	pvs      corelisters.PersistentVolumeLister
	pvcs     corelisters.PersistentVolumeClaimLister
	classes  storagelisters.StorageClassLister
	sets     appslisters.StatefulSetLister
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder
	metrics  *NodeLossMetrics
	clock    clock.WithTicker
	synced   []cache.InformerSynced
	// onLook, when set, is told of each of sync's decisions (the tests'
	// proof that the controller looked at a node).
	onLook func(look)

	mu        sync.Mutex
	goneSince map[string]time.Time // node name → first seen without a Node
	graceEnds map[string]time.Time // node name → when the grace of its missing Node ends
	names     map[string]string    // volume.node label value → node name
	counted   map[string]bool      // nodes lost now, counted in the metric
	looked    map[string]bool      // nodes looked at since the start
}

// NewNodeLoss wires the node-loss controller to the leader's informers
// (NewInformers); Run runs it. It keeps p's LostNodes (Config.LostNodes)
// up to date.
func NewNodeLoss(factory informers.SharedInformerFactory, p *Provisioner, grace time.Duration, m *NodeLossMetrics) *NodeLoss {
	return newNodeLoss(factory, p, grace, m, clock.RealClock{})
}

// newNodeLoss is NewNodeLoss on clk: the grace and its rechecks run on it.
func newNodeLoss(factory informers.SharedInformerFactory, p *Provisioner, grace time.Duration, m *NodeLossMetrics, clk clock.WithTicker) *NodeLoss {
	if grace <= 0 {
		grace = DefaultNodeLossGrace
	}
	infs := []cache.SharedIndexInformer{factory.Core().V1().Nodes().Informer(), factory.Core().V1().PersistentVolumes().Informer(),
		factory.Core().V1().PersistentVolumeClaims().Informer(), factory.Storage().V1().StorageClasses().Informer(),
		factory.Apps().V1().StatefulSets().Informer()}
	c := &NodeLoss{client: p.api, name: p.cfg.Name, grace: grace, lost: p.cfg.LostNodes,
		nodes: factory.Core().V1().Nodes().Lister(), pvs: factory.Core().V1().PersistentVolumes().Lister(),
		pvcs: factory.Core().V1().PersistentVolumeClaims().Lister(), classes: factory.Storage().V1().StorageClasses().Lister(),
		sets: factory.Apps().V1().StatefulSets().Lister(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "node-loss", Clock: clk}),
		metrics: m, clock: clk,
		goneSince: map[string]time.Time{}, graceEnds: map[string]time.Time{}, names: map[string]string{}, counted: map[string]bool{}, looked: map[string]bool{}}
	for _, inf := range infs {
		c.synced = append(c.synced, inf.HasSynced)
	}
	if c.lost == nil {
		c.lost = NewLostNodes()
	}
	if c.metrics == nil {
		c.metrics = NewNodeLossMetrics(nil)
	}
	c.handle(factory)
	return c
}

// Run looks at the nodes until ctx ends, once the informers have synced.
func (c *NodeLoss) Run(ctx context.Context) {
	defer c.queue.ShutDown()
	recorder, stop := kube.NewRecorder(c.client, c.name, "")
	defer stop()
	c.recorder = recorder
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return
	}
	c.missingAtStart()
	klog.InfoS("Node-loss controller started", "grace", c.grace)
	go wait.UntilWithContext(ctx, c.work, time.Second)
	<-ctx.Done()
}

func (c *NodeLoss) handle(factory informers.SharedInformerFactory) {
	_ = handle(factory.Core().V1().Nodes().Informer(), cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if n, ok := obj.(*corev1.Node); ok {
				c.mu.Lock()
				delete(c.goneSince, n.Name) // registered (again)
				c.names[kube.NodeLabelValue(n.Name)] = n.Name
				c.mu.Unlock()
				c.queue.Add(n.Name)
			}
		},
		UpdateFunc: func(_, obj any) {
			if n, ok := obj.(*corev1.Node); ok {
				c.queue.Add(n.Name)
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if n, ok := obj.(*corev1.Node); ok {
				c.mu.Lock()
				if _, seen := c.goneSince[n.Name]; !seen {
					c.goneSince[n.Name] = c.clock.Now()
				}
				c.mu.Unlock()
				c.queue.Add(n.Name)
			}
		},
	})
	// A PV or a claim of a node lost already (a claim that reached
	// `creating` there, a PV released there) is looked at again.
	onObject := func(obj any) {
		if node := c.nodeOf(obj); node != "" {
			if _, lost := c.lost.Lost(kube.NodeLabelValue(node)); lost {
				c.queue.Add(node)
			}
		}
	}
	for _, inf := range []cache.SharedIndexInformer{factory.Core().V1().PersistentVolumes().Informer(), factory.Core().V1().PersistentVolumeClaims().Informer()} {
		_ = handle(inf, cache.ResourceEventHandlerFuncs{AddFunc: onObject, UpdateFunc: func(_, obj any) { onObject(obj) }})
	}
}

// nodeOf is the node of one of our PVs, or of an unbound claim's
// selected node ("": neither).
func (c *NodeLoss) nodeOf(obj any) string {
	switch o := obj.(type) {
	case *corev1.PersistentVolume:
		if !c.ours(o) {
			return ""
		}
		v := o.Labels[kube.LabelNode]
		c.mu.Lock()
		defer c.mu.Unlock()
		if name, ok := c.names[v]; ok {
			return name
		}
		return v // a node name that is a valid label value is its own
	case *corev1.PersistentVolumeClaim:
		if o.Spec.VolumeName == "" {
			return o.Annotations[kube.AnnSelectedNode]
		}
	}
	return ""
}

// ours: a local PV this provisioner made, labelled with its node.
func (c *NodeLoss) ours(pv *corev1.PersistentVolume) bool {
	return pv.Spec.Local != nil && pv.Annotations[kube.AnnProvisionedBy] == c.name && pv.Labels[kube.LabelNode] != ""
}

// missingAtStart: the nodes our PVs name that have no Node object are
// counted missing from now. The controller does not know when they went
// (it was not running), so a restart gives them the full grace again:
// late rather than wrong.
func (c *NodeLoss) missingAtStart() {
	nodes, _ := c.nodes.List(labels.Everything())
	for _, n := range nodes {
		c.mu.Lock()
		c.names[kube.NodeLabelValue(n.Name)] = n.Name
		c.mu.Unlock()
		c.queue.Add(n.Name)
	}
	pvs, _ := c.pvs.List(labels.Everything())
	for _, pv := range pvs {
		name := c.nodeOf(pv)
		if name == "" {
			continue
		}
		if _, err := c.nodes.Get(name); apierrors.IsNotFound(err) {
			c.mu.Lock()
			if _, seen := c.goneSince[name]; !seen {
				c.goneSince[name] = c.clock.Now()
			}
			c.mu.Unlock()
			c.queue.Add(name)
		}
	}
}

func (c *NodeLoss) work(ctx context.Context) {
	work(ctx, c.queue, c.sync, func(name string, err error) {
		klog.ErrorS(err, "Node loss: not all done; trying again", "node", name)
	})
}

// sync decides whether the node is lost and, if so, releases what it holds.
func (c *NodeLoss) sync(ctx context.Context, name string) error {
	node, err := c.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		node = nil
	} else if err != nil {
		return err
	}
	c.mu.Lock()
	since := c.goneSince[name]
	if node != nil {
		delete(c.goneSince, name)
		since = time.Time{}
	}
	c.mu.Unlock()
	now := c.clock.Now()
	reason, lost, recheck := NodeLost(node, since, now, c.grace)
	if !lost && node == nil {
		// A node lost by its taint and then deleted stays lost.
		if r, was := c.lost.Lost(kube.NodeLabelValue(name)); was {
			reason, lost = r, true
		}
	}
	// Told once the sync is done, with what it did.
	defer c.look(name, node, since, now, lost, reason, recheck)
	if !lost {
		c.lost.set(name, "")
		c.mu.Lock()
		wasLost := c.counted[name]
		delete(c.counted, name)
		// Once per node after a start too: it may have come back while
		// no leader ran.
		first := !c.looked[name]
		c.looked[name] = true
		c.mu.Unlock()
		if wasLost {
			klog.InfoS("Node no longer counted lost", "node", name)
		}
		if recheck > 0 {
			c.queue.AddAfter(name, recheck)
		}
		if node != nil && (wasLost || first) {
			return c.unmarkKept(ctx, name)
		}
		return nil
	}
	c.mu.Lock()
	first := !c.counted[name]
	c.counted[name] = true
	c.mu.Unlock()
	if first {
		c.metrics.nodes.WithLabelValues(reason).Inc()
		klog.InfoS("Node lost: releasing its claims", "node", name, "reason", reason)
	}
	// Waits for the node's agent end now: Provision and Delete see the loss.
	c.lost.set(name, reason)
	var errs []error
	pvs, err := c.pvs.List(labels.Everything())
	if err != nil {
		return err
	}
	for _, pv := range pvs {
		if c.nodeOf(pv) == name {
			errs = append(errs, c.releaseVolume(ctx, pv, name, reason))
		}
	}
	pvcs, err := c.pvcs.List(labels.Everything())
	if err != nil {
		return err
	}
	for _, pvc := range pvcs {
		if c.nodeOf(pvc) == name && pvc.DeletionTimestamp == nil {
			errs = append(errs, c.sendBack(ctx, pvc, name, reason))
		}
	}
	return errors.Join(errs...)
}

// look is one of sync's decisions on the node name, once it is carried
// out: node its Node (nil: none), missing since since. It is logged (every one at V(4); at V(2) a
// deleted Node's grace, when it starts and when it ends with the Node
// back), and told to onLook.
func (c *NodeLoss) look(name string, node *corev1.Node, since, now time.Time, lost bool, reason string, recheck time.Duration) {
	rv := ""
	if node != nil {
		rv = node.ResourceVersion
	}
	klog.V(4).InfoS("Node looked at", "node", name, "resourceVersion", rv, "lost", lost, "reason", reason, "recheckIn", recheck)
	c.mu.Lock()
	ends, waiting := c.graceEnds[name]
	switch {
	case node == nil && recheck > 0 && (!waiting || !ends.Equal(since.Add(c.grace))):
		ends = since.Add(c.grace)
		c.graceEnds[name] = ends
		klog.V(2).InfoS("Node deleted: lost unless it registers again within the grace", "node", name, "graceEnds", ends)
	case node != nil && waiting && !now.Before(ends):
		delete(c.graceEnds, name)
		klog.V(2).InfoS("Node registered again within its grace: not lost", "node", name, "graceEnded", ends)
	case lost:
		delete(c.graceEnds, name) // the loss is logged
	}
	c.mu.Unlock()
	if c.onLook != nil {
		c.onLook(look{node: name, present: node != nil, resourceVersion: rv, at: now, lost: lost, recheck: recheck})
	}
}

// look is one decision of sync, for the tests.
type look struct {
	node            string
	present         bool
	resourceVersion string
	at              time.Time
	lost            bool
	recheck         time.Duration
}
