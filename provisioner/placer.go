package provisioner

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/kube"
)

// Event reasons of the Placer, on the clone's claim.
const (
	ReasonClonePlaced  = "ClonePlaced"
	ReasonCloneRefused = "CloneRefused"
)

// Placer puts each clone claim of this provisioner's WaitForFirstConsumer
// classes on its source's node, before any Pod is scheduled: it sets the
// claim's volume.kubernetes.io/selected-node, as the scheduler would. The
// PV controller then does not wait for a Pod (a claim that carries the
// annotation is provisioned at once), the library provisions for that
// node, the scheduler sends a Pod of an unbound claim that carries it only
// to that node, and a Pod of the bound claim follows the PV's node
// affinity (docs/architecture.md, "Clones"). A source that cannot be
// copied gets a CloneRefused event on the clone, and no node.
type Placer struct {
	p        *Provisioner
	pvcs     corelisters.PersistentVolumeClaimLister
	classes  storagelisters.StorageClassLister
	synced   []cache.InformerSynced
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder
}

// NewPlacer makes a Placer over the claims of p, with the leader's
// informers (NewInformers); Run runs it.
func NewPlacer(factory informers.SharedInformerFactory, p *Provisioner) *Placer {
	claims := factory.Core().V1().PersistentVolumeClaims()
	classes := factory.Storage().V1().StorageClasses()
	pl := &Placer{p: p, pvcs: claims.Lister(), classes: classes.Lister(),
		synced: []cache.InformerSynced{claims.Informer().HasSynced, classes.Informer().HasSynced},
		// A refused source may be bound, or grown, later: looked at again,
		// at most a minute apart.
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "clone-placer"})}
	enqueue := func(obj any) {
		if pvc, ok := obj.(*corev1.PersistentVolumeClaim); ok && unplaced(pvc) {
			if key, err := cache.MetaNamespaceKeyFunc(pvc); err == nil {
				pl.queue.Add(key)
			}
		}
	}
	utilruntime.Must(handle(claims.Informer(), cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) }}))
	return pl
}

// Run places clones until ctx ends, once the informers have synced.
func (pl *Placer) Run(ctx context.Context) {
	defer pl.queue.ShutDown()
	recorder, stop := kube.NewRecorder(pl.p.api, pl.p.cfg.Name, "")
	defer stop()
	pl.recorder = recorder
	if !cache.WaitForCacheSync(ctx.Done(), pl.synced...) {
		return
	}
	go wait.UntilWithContext(ctx, pl.work, time.Second)
	<-ctx.Done()
}

// unplaced: a claim with a data source that no node was chosen for yet.
func unplaced(pvc *corev1.PersistentVolumeClaim) bool {
	_, selected := pvc.Annotations[kube.AnnSelectedNode]
	return !selected && pvc.Spec.VolumeName == "" && pvc.DeletionTimestamp == nil && dataSource(pvc) != nil
}

func (pl *Placer) work(ctx context.Context) {
	work(ctx, pl.queue, pl.place, func(key string, err error) {
		klog.V(2).InfoS("Clone not placed; looking again later", "pvc", key, "err", err)
	})
}

// place names the source's node on the clone claim of key, or says why not.
func (pl *Placer) place(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pvc, err := pl.pvcs.PersistentVolumeClaims(ns).Get(name)
	if apierrors.IsNotFound(err) || err == nil && !unplaced(pvc) {
		return nil
	} else if err != nil {
		return err
	}
	class, err := pl.classes.Get(className(pvc))
	if apierrors.IsNotFound(err) || err == nil && !pl.ours(class) {
		return nil // not this provisioner's claim (or not yet)
	} else if err != nil {
		return err
	}
	src, err := pl.p.cloneSource(ctx, pvc, class)
	if errors.Is(err, ErrCloneSource) || errors.Is(err, ErrCloneNotSupported) {
		pl.recorder.Event(pvc, corev1.EventTypeWarning, ReasonCloneRefused, err.Error())
		return err
	} else if err != nil {
		return err
	}
	// Conditional on the version read: a scheduler that picked a node
	// since (a Pod came first) wins, and Provision gives that node back.
	_, err = kube.UpdatePvcWithAnnotations(ctx, pl.p.api, ns, name, pvc.ResourceVersion,
		kube.Set(map[string]string{kube.AnnSelectedNode: src.Node}), nil)
	if err != nil {
		return fmt.Errorf("name the source's node on the clone: %w", err)
	}
	pl.recorder.Eventf(pvc, corev1.EventTypeNormal, ReasonClonePlaced, "A clone of PVC %s is made on its node, %s; its Pods run there", dataSource(pvc).Name, src.Node)
	klog.V(2).InfoS("Clone placed on its source's node", "pvc", key, "node", src.Node, "source", src.VolumeGroup+"/"+src.Name)
	return nil
}

// ours: a class of this provisioner whose volumes wait for a consumer (an
// Immediate class is refused by Provision anyway).
func (pl *Placer) ours(class *storagev1.StorageClass) bool {
	return class.Provisioner == pl.p.cfg.Name && class.VolumeBindingMode != nil &&
		*class.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer
}
