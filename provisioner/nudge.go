package provisioner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
)

// Nudger makes kubelet grow a claim's filesystem as soon as the LV has
// grown. kubelet's local volume plugin grows it when kubelet syncs a Pod
// that uses the claim, and kubelet has no claim informer: without a
// trigger, that is its periodic sync (--sync-frequency, a minute, jittered
// up to 90 s). A Pod whose annotations changed is synced at once, so once
// the resizer has written the PV's capacity and then the claim's
// NodeResizePending (external-resizer writes them in that order, and
// kubelet reads both from the API server), each running Pod of the claim
// gets kube.AnnResizeNudge = "CLAIM=SIZE". The value makes the nudge happen
// once per Pod and size, also across restarts.
type Nudger struct {
	client  apiclient.Interface
	name    string
	claims  corelisters.PersistentVolumeClaimLister
	volumes corelisters.PersistentVolumeLister
	synced  []cache.InformerSynced
	queue   workqueue.TypedRateLimitingInterface[string]
	nudges  *prometheus.CounterVec
}

// NewNudger watches claims and PVs through factory (the leader's,
// NewInformers).
func NewNudger(client kubernetes.Interface, name string, factory informers.SharedInformerFactory, reg prometheus.Registerer) (*Nudger, error) {
	n := &Nudger{client: clientset.Wrap(client), name: name,
		claims:  factory.Core().V1().PersistentVolumeClaims().Lister(),
		volumes: factory.Core().V1().PersistentVolumes().Lister(),
		synced: []cache.InformerSynced{factory.Core().V1().PersistentVolumeClaims().Informer().HasSynced,
			factory.Core().V1().PersistentVolumes().Informer().HasSynced},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "nudge"}),
		nudges: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_provisioner_kubelet_nudges_total",
			Help: "Pods annotated so that kubelet grows a grown claim's filesystem at once, by result."}, []string{"result"}),
	}
	if reg != nil {
		// Each resizer of a process (the tests run several) counts in one.
		var are prometheus.AlreadyRegisteredError
		switch err := reg.Register(n.nudges); {
		case errors.As(err, &are):
			n.nudges = are.ExistingCollector.(*prometheus.CounterVec)
		case err != nil:
			return nil, err
		}
	}
	enqueue := func(obj any) {
		if pvc, ok := obj.(*corev1.PersistentVolumeClaim); ok && fsResizePending(pvc) {
			n.queue.Add(pvc.Namespace + "/" + pvc.Name)
		}
	}
	_, err := factory.Core().V1().PersistentVolumeClaims().Informer().AddEventHandlerWithResyncPeriod(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) },
	}, resizeResync)
	return n, err
}

// fsResizePending: the claim waits for kubelet to grow its filesystem.
func fsResizePending(pvc *corev1.PersistentVolumeClaim) bool {
	if pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] == corev1.PersistentVolumeClaimNodeResizePending {
		return true
	}
	return slices.ContainsFunc(pvc.Status.Conditions, func(c corev1.PersistentVolumeClaimCondition) bool {
		return c.Type == corev1.PersistentVolumeClaimFileSystemResizePending && c.Status == corev1.ConditionTrue
	})
}

// usesClaim: a Pod that kubelet runs (or will) with the claim mounted.
func usesClaim(pod *corev1.Pod, claim string) bool {
	if pod.DeletionTimestamp != nil || pod.Spec.NodeName == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return false
	}
	return slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool {
		return v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim
	})
}

// Run works the queue until ctx ends, once the informers have synced (a
// claim's PV not in the cache yet would be taken for a PV not ours).
func (n *Nudger) Run(ctx context.Context) {
	defer n.queue.ShutDown()
	if !cache.WaitForCacheSync(ctx.Done(), n.synced...) {
		return
	}
	go work(ctx, n.queue, n.sync, func(key string, err error) {
		klog.ErrorS(err, "Kubelet not nudged yet; retrying", "claim", key)
	})
	<-ctx.Done()
}

// sync nudges the running Pods of the claim key, if it waits for kubelet
// and its PV is one of ours. The Pods are listed when a claim needs it (a
// grow), not watched: a Pod informer would hold every Pod of the cluster.
func (n *Nudger) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pvc, err := n.claims.PersistentVolumeClaims(ns).Get(name)
	if apierrors.IsNotFound(err) || err == nil && !fsResizePending(pvc) {
		return nil
	}
	if err != nil {
		return err
	}
	pv, err := n.volumes.Get(pvc.Spec.VolumeName)
	if apierrors.IsNotFound(err) || err == nil && (pv.Spec.Local == nil || pv.Annotations[kube.AnnProvisionedBy] != n.name) {
		return nil
	}
	if err != nil {
		return err
	}
	size := pvc.Status.AllocatedResources[corev1.ResourceStorage]
	value := pvc.Name + "=" + size.String()
	pods, err := n.client.Pods(ns).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return fmt.Errorf("list the Pods of namespace %s: %w", ns, err)
	}
	klog.V(2).InfoS("Claim waits for kubelet to grow its filesystem; nudging its running Pods", "claim", klog.KObj(pvc), "size", size.String(), "pods", len(pods.Items))
	var failed error
	for i := range pods.Items {
		pod := &pods.Items[i]
		if !usesClaim(pod, pvc.Name) || pod.Annotations[kube.AnnResizeNudge] == value {
			continue
		}
		if err := kube.NudgePod(ctx, n.client, pod, value); err != nil {
			// A Pod changed since the list (kubelet writes its status):
			// the claim is listed again with backoff.
			n.nudges.WithLabelValues("retry").Inc()
			failed = err
			continue
		}
		n.nudges.WithLabelValues("nudged").Inc()
		klog.InfoS("Kubelet nudged to grow the filesystem", "pod", klog.KObj(pod), "claim", klog.KObj(pvc), "node", pod.Spec.NodeName, "size", size.String())
	}
	return failed
}
