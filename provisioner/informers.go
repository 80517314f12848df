package provisioner

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// resyncCheck is how often the claim and volume informers look for a
// handler whose resync is due. A handler of a shared informer resyncs only
// at its informer's period or longer, never shorter, and an informer whose
// period is 0 resyncs no handler at all: the library's handlers (every
// 15 minutes) and the resizer's (every 10) need it to be at most theirs.
const resyncCheck = 5 * time.Minute

// NewInformers is the provisioner leader's one informer factory: the
// library's controller, the placer, the resizer with the nudger, node loss
// and the capacity writer each take their informers from it, so that each
// claim, volume, Node and StorageClass is held once. Every controller adds
// its handlers before the factory is started, once, with the leader's
// context.
//
// Nodes are trimmed to what the controllers read: name, labels, the capacity
// annotation (Provision, the resizer, the capacity writer) and the taints
// (node loss: the out-of-service taint); no status, images or conditions.
// Claims and volumes are held whole: the library and the resizer write
// them back from what they read.
func NewInformers(client kubernetes.Interface, capacityAnnotation string) informers.SharedInformerFactory {
	return informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithCustomResyncConfig(map[metav1.Object]time.Duration{
			&corev1.PersistentVolumeClaim{}: resyncCheck,
			&corev1.PersistentVolume{}:      resyncCheck,
		}),
		informers.WithTransform(func(obj any) (any, error) {
			n, ok := obj.(*corev1.Node)
			if !ok {
				return obj, nil // another kind, or a tombstone
			}
			t := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Labels: n.Labels},
				Spec: corev1.NodeSpec{Taints: n.Spec.Taints}}
			if v, ok := n.Annotations[capacityAnnotation]; ok {
				t.Annotations = map[string]string{capacityAnnotation: v}
			}
			return t, nil
		}))
}

// handle adds h to inf without a resync: the claim and volume informers
// check for one every resyncCheck, and a handler added with AddEventHandler
// would take that as its own.
func handle(inf cache.SharedIndexInformer, h cache.ResourceEventHandler) error {
	_, err := inf.AddEventHandlerWithResyncPeriod(h, 0)
	return err
}
