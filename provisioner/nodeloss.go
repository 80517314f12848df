package provisioner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
	client   kubernetes.Interface
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

// NodeLossMetrics are the node-loss controller's counters.
type NodeLossMetrics struct {
	nodes  *prometheus.CounterVec
	claims *prometheus.CounterVec
}

// NewNodeLossMetrics makes the counters and registers them with reg (nil: not served).
func NewNodeLossMetrics(reg prometheus.Registerer) *NodeLossMetrics {
	m := &NodeLossMetrics{
		nodes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_provisioner_nodes_lost_total",
			Help: "Nodes the provisioner counted lost for good, by reason (out-of-service taint, deleted)."}, []string{"reason"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_provisioner_node_loss_claims_total",
			Help: "Claims and volumes of lost nodes, by what was done: recreated (a StatefulSet's claim deleted), kept (with a NodeLost event), " +
				"rescheduled (a claim still being created sent back to the scheduler), volume-released (a PV removed without its node's agent)."},
			[]string{"action"}),
	}
	if reg != nil {
		reg.MustRegister(m.nodes, m.claims)
	}
	return m
}

// RunNodeLoss runs the node-loss controller until ctx ends. lost is the
// Provisioner's (Config.LostNodes), which it keeps up to date.
func RunNodeLoss(ctx context.Context, client kubernetes.Interface, p *Provisioner, grace time.Duration, m *NodeLossMetrics) {
	if grace <= 0 {
		grace = DefaultNodeLossGrace
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	recorder, stop := kube.NewRecorder(client, p.cfg.Name, "")
	defer stop()
	c := &NodeLoss{client: client, name: p.cfg.Name, grace: grace, lost: p.cfg.LostNodes,
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
	if !cache.WaitForCacheSync(ctx.Done(), factory.Core().V1().Nodes().Informer().HasSynced,
		factory.Core().V1().PersistentVolumes().Informer().HasSynced, factory.Core().V1().PersistentVolumeClaims().Informer().HasSynced,
		factory.Storage().V1().StorageClasses().Informer().HasSynced, factory.Apps().V1().StatefulSets().Informer().HasSynced) {
		return
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
	for {
		name, quit := c.queue.Get()
		if quit {
			return
		}
		if err := c.sync(ctx, name); err != nil {
			klog.ErrorS(err, "Node loss: not all done; trying again", "node", name)
			c.queue.AddRateLimited(name)
		} else {
			c.queue.Forget(name)
		}
		c.queue.Done(name)
	}
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

// releaseVolume handles one of our PVs on the lost node: its claim if it
// is bound, or the PV itself if it is released.
func (c *NodeLoss) releaseVolume(ctx context.Context, pv *corev1.PersistentVolume, node, reason string) error {
	if pv.DeletionTimestamp != nil {
		return nil
	}
	if ref := pv.Spec.ClaimRef; ref != nil && pv.Status.Phase == corev1.VolumeBound {
		pvc, err := c.pvcs.PersistentVolumeClaims(ref.Namespace).Get(ref.Name)
		if apierrors.IsNotFound(err) || err == nil && pvc.UID != ref.UID {
			return nil // the PV controller releases it; looked at then
		} else if err != nil {
			return err
		}
		if pvc.DeletionTimestamp != nil {
			return nil
		}
		return c.releaseClaim(ctx, pvc, pv, node, reason)
	}
	if pv.Status.Phase != corev1.VolumeReleased || pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete ||
		pv.Annotations[kube.AnnNodeLost] != "" {
		return nil // Retain keeps the PV; a marked one is the library's to remove
	}
	// Delete finishes a PV so marked without asking the agent.
	if err := kube.MarkPVNodeLost(ctx, c.client, pv, kube.NodeLostValue(node, reason)); err != nil {
		return err
	}
	lv := pv.Annotations[kube.AnnSpec]
	c.recorder.Eventf(pv, corev1.EventTypeWarning, ReasonNodeLost,
		"Node %s is lost (%s): the PV is removed without an answer from its agent. Its LV %s stays on that node's disks; if they come back, the node's orphan collector finds it.", node, reason, lv)
	c.metrics.claims.WithLabelValues("volume-released").Inc()
	klog.InfoS("Node lost: PV released without its agent", "node", node, "reason", reason, "pv", pv.Name, "lv", lv)
	return nil
}

// releaseClaim deletes a StatefulSet's claim of a recreate class, and
// keeps any other, with the event.
func (c *NodeLoss) releaseClaim(ctx context.Context, pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, node, reason string) error {
	value := kube.NodeLostValue(node, reason)
	if pvc.Annotations[kube.AnnNodeLost] == value {
		return nil // kept, and said so, already
	}
	lv := pv.Annotations[kube.AnnSpec]
	onNodeLoss, why := OnNodeLossKeep, "its StorageClass "+pv.Spec.StorageClassName+" cannot be read"
	if class, err := c.classes.Get(pv.Spec.StorageClassName); err == nil {
		if params, err := ParseParams(class.Parameters); err == nil {
			onNodeLoss, why = params.OnNodeLoss, "its StorageClass says onNodeLoss: "+params.OnNodeLoss
		}
	}
	if onNodeLoss == OnNodeLossRecreate {
		sets, err := c.sets.StatefulSets(pvc.Namespace).List(labels.Everything())
		if err != nil {
			return err
		}
		if set := StatefulSetOf(pvc, sets); set != nil {
			c.recorder.Eventf(pvc, corev1.EventTypeWarning, ReasonNodeLost,
				"Node %s is lost (%s): the claim is deleted so that StatefulSet %s makes a new one for its replica on another node. Its LV %s stays on that node's disks (PV %s, reclaim policy %s).",
				node, reason, set.Name, lv, pv.Name, pv.Spec.PersistentVolumeReclaimPolicy)
			if err := kube.DeleteLostClaim(ctx, c.client, pvc); err != nil {
				return err
			}
			c.metrics.claims.WithLabelValues("recreated").Inc()
			klog.InfoS("Node lost: StatefulSet claim deleted for a new one", "node", node, "reason", reason, "pvc", klog.KObj(pvc),
				"statefulSet", set.Name, "pv", pv.Name, "lv", lv, "reclaimPolicy", pv.Spec.PersistentVolumeReclaimPolicy)
			return nil
		}
		why = "no StatefulSet's volumeClaimTemplates made it"
	}
	c.recorder.Eventf(pvc, corev1.EventTypeWarning, ReasonNodeLost,
		"Node %s is lost (%s). The claim is kept (%s); its LV %s was on that node only. To release it: delete the Pods that use it "+
			"(kubectl -n %s delete pod POD --force --grace-period=0, as their node is down), then kubectl -n %s delete pvc %s; "+
			"its PV %s (reclaim policy %s) then goes without that node's agent.",
		node, reason, why, lv, pvc.Namespace, pvc.Namespace, pvc.Name, pv.Name, pv.Spec.PersistentVolumeReclaimPolicy)
	if err := kube.MarkClaimNodeLost(ctx, c.client, pvc, value); err != nil {
		return err
	}
	c.metrics.claims.WithLabelValues("kept").Inc()
	klog.InfoS("Node lost: claim kept", "node", node, "reason", reason, "pvc", klog.KObj(pvc), "why", why, "pv", pv.Name, "lv", lv)
	return nil
}

// unmarkKept removes the node-lost mark from the kept claims of a node
// that is back (its taint lifted, or its Node registered again): `volume
// status` no longer shows them NODE-LOST. (PVs marked stay marked: their
// delete was decided, and the orphan collector has their LVs.)
func (c *NodeLoss) unmarkKept(ctx context.Context, node string) error {
	prefix := node + ": "
	pvcs, err := c.pvcs.List(labels.Everything())
	if err != nil {
		return err
	}
	var errs []error
	for _, pvc := range pvcs {
		if strings.HasPrefix(pvc.Annotations[kube.AnnNodeLost], prefix) {
			if err := kube.ClearClaimNodeLost(ctx, c.client, pvc); err != nil {
				errs = append(errs, err)
				continue
			}
			klog.InfoS("Node back: kept claim no longer marked lost", "node", node, "pvc", klog.KObj(pvc))
		}
	}
	return errors.Join(errs...)
}

// sendBack returns an unbound claim whose selected node is lost to the
// scheduler, as the provisioner does for a node without room.
func (c *NodeLoss) sendBack(ctx context.Context, pvc *corev1.PersistentVolumeClaim, node, reason string) error {
	if err := kube.SendBackToScheduler(ctx, c.client, pvc); err != nil {
		return err
	}
	state := pvc.Annotations[kube.AnnLifecycle]
	c.recorder.Eventf(pvc, corev1.EventTypeWarning, ReasonNodeLost,
		"Node %s is lost (%s): the claim is sent back to the scheduler, which picks another node for its Pod.", node, reason)
	c.metrics.claims.WithLabelValues("rescheduled").Inc()
	klog.InfoS("Node lost: unbound claim sent back to the scheduler", "node", node, "reason", reason, "pvc", klog.KObj(pvc), "lifecycle", state)
	return nil
}

// lostError says that a wait for the node's agent ended because the node
// is lost.
func lostError(ctx context.Context, node string, err error) error {
	if err != nil && errors.Is(context.Cause(ctx), ErrNodeLost) {
		return fmt.Errorf("node %s: %w (%s)", node, ErrNodeLost, strings.TrimSpace(err.Error()))
	}
	return err
}
