package kube

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// WatchMode chooses what the agent's informers ask the API server for.
type WatchMode string

const (
	// WatchAll watches every PVC and PV and filters locally: works with
	// provisioners that do not set the volume.node label.
	WatchAll WatchMode = "all"
	// WatchLabelled watches only objects labelled volume.node=<this node>,
	// filtered by the API server.
	WatchLabelled WatchMode = "labelled"
)

// Informers are the agent's PVC and PV informers.
type Informers struct {
	Factory informers.SharedInformerFactory
	PVC     cache.SharedIndexInformer
	PV      cache.SharedIndexInformer
}

// NewInformers builds the informers for a node. The cached objects are
// trimmed to what the agent reads, which keeps memory flat when every PVC of
// a large cluster is watched.
func NewInformers(c kubernetes.Interface, node string, mode WatchMode) *Informers {
	opts := []informers.SharedInformerOption{informers.WithTransform(trim)}
	if mode == WatchLabelled {
		sel := labels.Set{LabelNode: NodeLabelValue(node)}.AsSelector().String()
		opts = append(opts, informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
	}
	// No resync: every request arrives as an event, and the agent's own
	// retries come from its work queue, not from rescans.
	f := informers.NewSharedInformerFactoryWithOptions(c, time.Duration(0), opts...)
	return &Informers{Factory: f, PVC: f.Core().V1().PersistentVolumeClaims().Informer(), PV: f.Core().V1().PersistentVolumes().Informer()}
}

// trim keeps only the fields the agent uses.
func trim(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		return &corev1.PersistentVolumeClaim{ObjectMeta: trimMeta(o.ObjectMeta)}, nil
	case *corev1.PersistentVolume:
		pv := &corev1.PersistentVolume{ObjectMeta: trimMeta(o.ObjectMeta)}
		pv.Spec.CSI = o.Spec.CSI
		pv.Spec.NodeAffinity = o.Spec.NodeAffinity
		pv.Spec.ClaimRef = o.Spec.ClaimRef
		return pv, nil
	}
	return obj, nil
}

func trimMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		Labels: m.Labels, Annotations: m.Annotations, DeletionTimestamp: m.DeletionTimestamp}
}
