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
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

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
	now      func() time.Time

	mu        sync.Mutex
	goneSince map[string]time.Time // node name → first seen without a Node
	names     map[string]string    // volume.node label value → node name
	counted   map[string]bool      // nodes lost now, counted in the metric
	looked    map[string]bool      // nodes looked at since the start
}

// RunNodeLoss runs the node-loss controller until ctx ends. lost is the
// Provisioner's (Config.LostNodes), which it keeps up to date.
func RunNodeLoss(ctx context.Context, client kubernetes.Interface, p *Provisioner, grace time.Duration, m *NodeLossMetrics) {
	if grace <= 0 {
		grace = DefaultNodeLossGrace
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	recorder, stop := kube.NewRecorder(p.api, p.cfg.Name, "")
	defer stop()
	c := &NodeLoss{client: p.api, name: p.cfg.Name, grace: grace, lost: p.cfg.LostNodes,
		nodes: factory.Core().V1().Nodes().Lister(), pvs: factory.Core().V1().PersistentVolumes().Lister(),
		pvcs: factory.Core().V1().PersistentVolumeClaims().Lister(), classes: factory.Storage().V1().StorageClasses().Lister(),
		sets: factory.Apps().V1().StatefulSets().Lister(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "node-loss"}),
		recorder: recorder, metrics: m, now: time.Now,
		goneSince: map[string]time.Time{}, names: map[string]string{}, counted: map[string]bool{}, looked: map[string]bool{}}
	if c.lost == nil {
		c.lost = NewLostNodes()
	}
	if c.metrics == nil {
		c.metrics = NewNodeLossMetrics(nil)
	}
	c.handle(factory)
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	defer c.queue.ShutDown()
	for _, synced := range factory.WaitForCacheSync(ctx.Done()) {
		if !synced {
			return
		}
	}
	c.missingAtStart()
	klog.InfoS("Node-loss controller started", "grace", grace)
	go wait.UntilWithContext(ctx, c.work, time.Second)
	<-ctx.Done()
}

func (c *NodeLoss) handle(factory informers.SharedInformerFactory) {
	_, _ = factory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
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
					c.goneSince[n.Name] = c.now()
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
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: onObject, UpdateFunc: func(_, obj any) { onObject(obj) }})
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
				c.goneSince[name] = c.now()
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
	reason, lost, recheck := NodeLost(node, since, c.now(), c.grace)
	if !lost && node == nil {
		// A node lost by its taint and then deleted stays lost.
		if r, was := c.lost.Lost(kube.NodeLabelValue(name)); was {
			reason, lost = r, true
		}
	}
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
