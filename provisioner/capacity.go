package provisioner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	storageinformers "k8s.io/client-go/informers/storage/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/kube"
)

// LabelProvisioner marks the CSIStorageCapacity objects a provisioner keeps,
// so that it lists (and removes) only its own.
const LabelProvisioner = "lvm-agent.io/provisioner"

// Capacity keeps one CSIStorageCapacity per Node and StorageClass of this
// provisioner, from the capacity annotation the agents publish on their
// Nodes: the kube-scheduler's volume binding then never picks a node whose
// volume group cannot hold a claim (given a CSIDriver object of the
// provisioner's name with storageCapacity: true). It must be the only
// writer: run it in the leader only.
type Capacity struct {
	client     kubernetes.Interface
	name       string // provisioner
	namespace  string // of the CSIStorageCapacity objects
	annotation string // Node capacity annotation
	nodes      cache.SharedIndexInformer
	classes    cache.SharedIndexInformer
	objects    cache.SharedIndexInformer
	queue      workqueue.TypedRateLimitingInterface[string]
}

// NewCapacity wires the capacity writer to the leader's informers
// (NewInformers: a Node's labels and capacity annotation are all it reads
// of one); Run runs it once they are started.
func NewCapacity(client kubernetes.Interface, factory informers.SharedInformerFactory, provisioner, namespace, annotation string) *Capacity {
	// Its own CSIStorageCapacity objects only, in the factory so that it is
	// started with the others. The factory holds one informer per kind:
	// this filtered one is the factory's CSIStorageCapacity informer, and
	// nothing else of the leader reads that kind.
	own := factory.InformerFor(&storagev1.CSIStorageCapacity{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return storageinformers.NewFilteredCSIStorageCapacityInformer(c, namespace, resync, cache.Indexers{},
			func(o *metav1.ListOptions) { o.LabelSelector = labels.Set{LabelProvisioner: provisioner}.String() })
	})
	c := &Capacity{client: client, name: provisioner, namespace: namespace, annotation: annotation,
		nodes: factory.Core().V1().Nodes().Informer(), classes: factory.Storage().V1().StorageClasses().Informer(), objects: own,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "capacity"})}
	// Every change leads to one pass over the whole set: the single key
	// coalesces bursts, and a failed pass is retried with backoff.
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.queue.Add("all") },
		UpdateFunc: func(any, any) { c.queue.Add("all") },
		DeleteFunc: func(any) { c.queue.Add("all") },
	}
	for _, inf := range []cache.SharedIndexInformer{c.nodes, c.classes, c.objects} {
		_ = handle(inf, h) // fails only on a stopped informer
	}
	return c
}

// Run keeps the objects in step until ctx ends.
func (c *Capacity) Run(ctx context.Context) {
	defer c.queue.ShutDown()
	if !cache.WaitForCacheSync(ctx.Done(), c.nodes.HasSynced, c.classes.HasSynced, c.objects.HasSynced) {
		return
	}
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	work(ctx, c.queue, func(ctx context.Context, _ string) error { return c.sync(ctx) }, func(_ string, err error) {
		klog.ErrorS(err, "Could not update CSIStorageCapacity objects; will retry")
	})
}

// Desired computes the CSIStorageCapacity objects for nodes and classes:
// one per Node with a hostname label and a capacity entry for the volume
// group of a StorageClass of this provisioner, holding that entry's free
// bytes. A Node without the entry, or whose entry does not serve the class
// (Params.Serves), gets no object, which the scheduler reads as no
// capacity.
func Desired(provisioner, namespace, annotation string, nodes []*corev1.Node, classes []*storagev1.StorageClass) map[string]*storagev1.CSIStorageCapacity {
	out := map[string]*storagev1.CSIStorageCapacity{}
	for _, n := range nodes {
		hostname := n.Labels[HostnameLabel]
		raw, ok := n.Annotations[annotation]
		if hostname == "" || !ok {
			continue
		}
		entries, err := kube.DecodeStorageTopology(raw)
		if err != nil {
			klog.ErrorS(err, "Node capacity annotation is not readable; the node gets no capacity", "node", n.Name, "annotation", annotation)
			continue
		}
		byVG := map[string]kube.StorageCapacity{}
		for _, e := range entries {
			byVG[e.Name] = e
		}
		for _, sc := range classes {
			if sc.Provisioner != provisioner {
				continue
			}
			params, err := ParseParams(sc.Parameters)
			if err != nil {
				continue // its claims fail with the reason; nothing to publish
			}
			e, ok := byVG[params.VolumeGroup]
			if !ok || params.Serves(e) != nil {
				continue
			}
			bytes := int64(e.Free)
			name := capacityName(n.Name, sc.Name)
			out[name] = &storagev1.CSIStorageCapacity{
				ObjectMeta:       metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{LabelProvisioner: provisioner}},
				NodeTopology:     &metav1.LabelSelector{MatchLabels: map[string]string{HostnameLabel: hostname}},
				StorageClassName: sc.Name,
				Capacity:         resource.NewQuantity(bytes, resource.BinarySI),
			}
		}
	}
	return out
}

// capacityName is a stable object name for a node and class (both may be
// long; the name must be a DNS subdomain).
func capacityName(node, class string) string {
	sum := sha256.Sum256([]byte(node + "\x00" + class))
	return "lvm-" + hex.EncodeToString(sum[:])[:20]
}

func (c *Capacity) sync(ctx context.Context) error {
	var nodes []*corev1.Node
	for _, o := range c.nodes.GetStore().List() {
		nodes = append(nodes, o.(*corev1.Node))
	}
	var classes []*storagev1.StorageClass
	for _, o := range c.classes.GetStore().List() {
		classes = append(classes, o.(*storagev1.StorageClass))
	}
	want := Desired(c.name, c.namespace, c.annotation, nodes, classes)
	api := c.client.StorageV1().CSIStorageCapacities(c.namespace)
	for _, o := range c.objects.GetStore().List() {
		have := o.(*storagev1.CSIStorageCapacity)
		w, ok := want[have.Name]
		switch {
		case !ok:
			if err := api.Delete(ctx, have.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete CSIStorageCapacity %s: %w", have.Name, err)
			}
		case same(have, w):
		default:
			upd := have.DeepCopy()
			upd.Capacity, upd.NodeTopology, upd.StorageClassName = w.Capacity, w.NodeTopology, w.StorageClassName
			if _, err := api.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("update CSIStorageCapacity %s: %w", have.Name, err)
			}
		}
		delete(want, have.Name)
	}
	for _, w := range want {
		if _, err := api.Create(ctx, w, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create CSIStorageCapacity %s: %w", w.Name, err)
		}
	}
	return nil
}

func same(a, b *storagev1.CSIStorageCapacity) bool {
	return a.StorageClassName == b.StorageClassName && a.Capacity != nil && a.Capacity.Cmp(*b.Capacity) == 0 &&
		a.NodeTopology != nil && labels.Equals(a.NodeTopology.MatchLabels, b.NodeTopology.MatchLabels)
}
