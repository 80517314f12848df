package provisioning

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
	"github.com/lvm-agent/lvm-agent/provisioner"
)

const timeout = 90 * time.Second

func newNamespace(t testing.TB) string {
	t.Helper()
	ns := strings.ToLower(strings.NewReplacer("/", "-", "_", "-", "=", "-").Replace(t.Name()))
	_, err := cluster.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return ns
}

func storageClass(t testing.TB, name string, mode storagev1.VolumeBindingMode, reclaim corev1.PersistentVolumeReclaimPolicy, params map[string]string) {
	t.Helper()
	params = harness.HostClass(params)
	_, err := cluster.Client.StorageV1().StorageClasses().Create(context.Background(), &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: kube.DefaultProvisioner,
		VolumeBindingMode: &mode, ReclaimPolicy: &reclaim, Parameters: params, MountOptions: []string{"noatime"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cluster.Client.StorageV1().StorageClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// claimAndPod creates a claim of class and a Pod that uses it, as a user does.
func claimAndPod(t testing.TB, ns, name, class, size string, mode corev1.PersistentVolumeMode, nodeSelector map[string]string) {
	t.Helper()
	createClaim(t, ns, name, class, size, mode, "")
	createPod(t, ns, name, nodeSelector)
}

// createClaim creates a claim of class; with source, a clone of that claim.
func createClaim(t testing.TB, ns, name, class, size string, mode corev1.PersistentVolumeMode, source string) {
	t.Helper()
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, VolumeMode: &mode,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}},
	}
	if source != "" {
		pvc.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: source}
	}
	_, err := cluster.Client.CoreV1().PersistentVolumeClaims(ns).Create(context.Background(), pvc, metav1.CreateOptions{})
	require.NoError(t, err)
}

// createPod creates a Pod named name that uses the claim of that name.
func createPod(t testing.TB, ns, name string, nodeSelector map[string]string) {
	t.Helper()
	_, err := cluster.Client.CoreV1().Pods(ns).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{NodeSelector: nodeSelector, Containers: []corev1.Container{{Name: "app", Image: "busybox",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// waitBound waits for the claim to be bound and returns it with its PV.
func waitBound(t testing.TB, ns, name string) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) {
	t.Helper()
	var pvc *corev1.PersistentVolumeClaim
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		pvc, err = cluster.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && pvc.Status.Phase == corev1.ClaimBound, nil
	})
	if err != nil {
		dump(t, ns, name)
	}
	require.NoError(t, err, "claim %s/%s not bound", ns, name)
	pv, err := cluster.Client.CoreV1().PersistentVolumes().Get(context.Background(), pvc.Spec.VolumeName, metav1.GetOptions{})
	require.NoError(t, err)
	return pvc, pv
}

// recordSelectedNodes watches a claim and returns what selected-node was
// set to, in order (each change once).
func recordSelectedNodes(t testing.TB, ns, name string) func() []string {
	t.Helper()
	return recordAnnotation(t, ns, name, kube.AnnSelectedNode)
}

// recordAnnotation watches a claim and returns the values its annotation
// key was set to, in order (each change once).
func recordAnnotation(t testing.TB, ns, name, key string) func() []string {
	t.Helper()
	w, err := cluster.Client.CoreV1().PersistentVolumeClaims(ns).Watch(context.Background(),
		metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	require.NoError(t, err)
	return record(t, w, key)
}

// recordPVAnnotation is recordAnnotation for a PV.
func recordPVAnnotation(t testing.TB, name, key string) func() []string {
	t.Helper()
	w, err := cluster.Client.CoreV1().PersistentVolumes().Watch(context.Background(),
		metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	require.NoError(t, err)
	return record(t, w, key)
}

// record returns the values the annotation key of the objects of w was set
// to, in order (each change once).
func record(t testing.TB, w watch.Interface, key string) func() []string {
	var mu sync.Mutex
	var seen []string
	go func() {
		for ev := range w.ResultChan() {
			if o, err := meta.Accessor(ev.Object); err == nil && ev.Type != watch.Deleted {
				v := o.GetAnnotations()[key]
				mu.Lock()
				if v != "" && (len(seen) == 0 || seen[len(seen)-1] != v) {
					seen = append(seen, v)
				}
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(w.Stop)
	return func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(seen) }
}

func deleteClaim(t testing.TB, ns, name string) {
	t.Helper()
	ctx := context.Background()
	// No kubelet confirms a Pod's end here: delete it at once.
	require.NoError(t, cluster.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}))
	require.NoError(t, cluster.Client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, name, metav1.DeleteOptions{}))
}

func lvNames(t testing.TB, n *node) []string {
	t.Helper()
	lvs, err := n.lvm.List("vg1")
	require.NoError(t, err)
	out := []string{}
	for _, lv := range lvs {
		out = append(out, lv.Name)
	}
	return out
}

func lvTags(t testing.TB, n *node, name string) []string { return lvOf(t, n, name).Tags }

// lvOf is the LV name of vg1 on n.
func lvOf(t testing.TB, n *node, name string) lvmdfake.LV {
	t.Helper()
	lvs, err := n.lvm.List("vg1")
	require.NoError(t, err)
	for _, lv := range lvs {
		if lv.Name == name {
			return lv
		}
	}
	t.Fatalf("no LV %s on %s", name, n.name)
	return lvmdfake.LV{}
}

func pvGone(t testing.TB, name string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		_, err := cluster.Client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	require.NoError(t, err, "PV %s still there", name)
}

// A Pod with a 2 GiB claim: the scheduler, reading the provisioner's
// CSIStorageCapacity objects, picks the 100 GiB node at the first try
// although it prefers the 1 GiB node otherwise; the PV is exactly the
// issue's; deleting the claim removes the LV and then the PV.
func TestPodClaimBoundThenDeleted(t *testing.T) {
	ns := newNamespace(t)
	storageClass(t, "thick", storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg1"})
	// The leader publishes what the agents report: 1 GiB free on small, 100 on big.
	assert.Equal(t, int64(1<<30), waitCapacity(t, "small", "thick").Capacity.Value())
	assert.Equal(t, int64(100<<30), waitCapacity(t, "big", "thick").Capacity.Value())
	seen := recordSelectedNodes(t, ns, "data")
	asked := recordAnnotation(t, ns, "data", kube.AnnLifecycle)
	start := time.Now()
	claimAndPod(t, ns, "data", "thick", "2Gi", corev1.PersistentVolumeFilesystem, nil)
	pvc, pv := waitBound(t, ns, "data")
	t.Logf("claim bound %v after creation", time.Since(start))
	assert.Equal(t, []string{"big"}, seen(), "the scheduler picked the node with room at the first try")

	name := "pvc-" + string(pvc.UID)
	fsType, fsMode := "ext4", corev1.PersistentVolumeFilesystem
	assert.Equal(t, name, pv.Name)
	assert.Equal(t, corev1.PersistentVolumeSpec{
		Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")},
		AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		VolumeMode:                    &fsMode,
		PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
		MountOptions:                  []string{"noatime"},
		StorageClassName:              "thick",
		PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/dev/vg1/" + name, FSType: &fsType}},
		NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{"big"}}}}}}},
		ClaimRef: pv.Spec.ClaimRef,
	}, pv.Spec)
	require.NotNil(t, pv.Spec.ClaimRef)
	assert.Equal(t, pvc.UID, pv.Spec.ClaimRef.UID)
	assert.Equal(t, kube.DefaultProvisioner, pv.Annotations[kube.AnnProvisionedBy])
	assert.Equal(t, "vg1/"+name, pv.Annotations[kube.AnnSpec])
	assert.Equal(t, "big", pv.Labels[kube.LabelNode])
	assert.Equal(t, []string{name}, lvNames(t, big))
	assert.Empty(t, lvNames(t, small))

	// The lifecycle on the PV: deleting, then deleted (seen by a watch),
	// then the PV is gone, with its LV.
	w, err := cluster.Client.CoreV1().PersistentVolumes().Watch(context.Background(),
		metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: pv.ResourceVersion})
	require.NoError(t, err)
	defer w.Stop()
	deleteClaim(t, ns, "data")
	var states []string
	for ev := range w.ResultChan() {
		if ev.Type == watch.Deleted {
			break
		}
		if p, ok := ev.Object.(*corev1.PersistentVolume); ok {
			if s := p.Annotations[kube.AnnLifecycle]; s != "" && (len(states) == 0 || states[len(states)-1] != s) {
				states = append(states, s)
			}
		}
	}
	assert.Equal(t, []string{kube.StateDeleting, kube.StateDeleted}, states)
	pvGone(t, name)
	assert.Empty(t, lvNames(t, big))
	// The claim was asked for once: the library's second look at it, before
	// its PV informer showed the saved PV, reused the agent's answer.
	assert.Equal(t, []string{kube.StateCreating, kube.StateCreated}, asked(), "the claim's lifecycle, each change once")
}

func TestBlockClaim(t *testing.T) {
	ns := newNamespace(t)
	storageClass(t, "block", storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg1"})
	claimAndPod(t, ns, "raw", "block", "64Mi", corev1.PersistentVolumeBlock, nil)
	_, pv := waitBound(t, ns, "raw")
	require.NotNil(t, pv.Spec.Local)
	assert.Nil(t, pv.Spec.Local.FSType, "handed raw")
	assert.Equal(t, corev1.PersistentVolumeBlock, *pv.Spec.VolumeMode)
	on := pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values[0]
	n := map[string]*node{"small": small, "big": big}[on]
	require.NotNil(t, n, on)
	assert.Equal(t, "/dev/vg1/"+pv.Name, pv.Spec.Local.Path)
	assert.Contains(t, lvNames(t, n), pv.Name)
	deleteClaim(t, ns, "raw")
	pvGone(t, pv.Name)
}

// An Immediate class would make a volume before the scheduler picks a
// node: refused with an event, nothing made.
func TestImmediateClassRefused(t *testing.T) {
	ns := newNamespace(t)
	storageClass(t, "immediate", storagev1.VolumeBindingImmediate, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg1"})
	before := len(lvNames(t, small)) + len(lvNames(t, big))
	claimAndPod(t, ns, "now", "immediate", "64Mi", corev1.PersistentVolumeFilesystem, nil)
	ev := waitEvent(t, ns, "now", "ProvisioningFailed")
	assert.Contains(t, ev.Message, "WaitForFirstConsumer")
	pvc, err := cluster.Client.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), "now", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, corev1.ClaimPending, pvc.Status.Phase)
	assert.NotContains(t, pvc.Annotations, kube.AnnLifecycle, "no request written")
	assert.Equal(t, before, len(lvNames(t, small))+len(lvNames(t, big)))
	deleteClaim(t, ns, "now")
}

func waitEvent(t testing.TB, ns, object, reason string) corev1.Event {
	t.Helper()
	return waitEventSaying(t, ns, object, reason, "")
}

// waitEventSaying waits for an event of reason on object whose message
// contains text.
func waitEventSaying(t testing.TB, ns, object, reason, text string) corev1.Event {
	t.Helper()
	var found corev1.Event
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		evs, err := cluster.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
			"involvedObject.name": object, "reason": reason}.String()})
		if err != nil {
			return false, nil
		}
		for _, ev := range evs.Items {
			if strings.Contains(ev.Message, text) {
				found = ev
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		dump(t, ns, object)
	}
	require.NoError(t, err, "no %s event saying %q on %s/%s", reason, text, ns, object)
	return found
}

// A Retain class: the claim's deletion releases the PV, which stays, with
// its LV, tagged retained.
func TestRetainKeepsPVAndLV(t *testing.T) {
	ns := newNamespace(t)
	storageClass(t, "keep", storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimRetain, map[string]string{"volumeGroup": "vg1"})
	claimAndPod(t, ns, "kept", "keep", "2Gi", corev1.PersistentVolumeFilesystem, nil)
	_, pv := waitBound(t, ns, "kept")
	assert.Contains(t, lvTags(t, big, pv.Name), kube.RetainedTag)
	deleteClaim(t, ns, "kept")
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		pv = p
		return err == nil && p.Status.Phase == corev1.VolumeReleased, nil
	})
	require.NoError(t, err)
	assert.NotContains(t, pv.Annotations, kube.AnnLifecycle, "no delete asked")
	assert.Contains(t, lvNames(t, big), pv.Name)
	// The admin's to remove: the PV now, the LV later (by hand).
	require.NoError(t, cluster.Client.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{}))
	pvGone(t, pv.Name)
	assert.Contains(t, lvNames(t, big), pv.Name, "Retain keeps the LV")
	require.NoError(t, big.lvm.Remove("vg1", pv.Name))
}

// The provisioner is killed while the agent works on the request; the
// replica that takes over asks again: one LV, one PV.
func TestProvisionerKilledMidProvision(t *testing.T) {
	ns := newNamespace(t)
	storageClass(t, "slow", storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg1"})
	release := make(chan struct{})
	big.lvm.SetHook(func(op, _, _ string) error {
		if op == "create" {
			<-release
		}
		return nil
	})
	defer big.lvm.SetHook(nil)
	claimAndPod(t, ns, "slow", "slow", "2Gi", corev1.PersistentVolumeFilesystem, nil)
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		pvc, err := cluster.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "slow", metav1.GetOptions{})
		return err == nil && pvc.Annotations[kube.AnnLifecycle] == kube.StateCreating, nil
	})
	require.NoError(t, err)
	prov.Kill()
	prov = startProvisioner(mainTB)
	close(release)
	pvc, pv := waitBound(t, ns, "slow")
	assert.Equal(t, "pvc-"+string(pvc.UID), pv.Name)
	var lvs []string
	for _, name := range lvNames(t, big) {
		if strings.HasSuffix(name, string(pvc.UID)) {
			lvs = append(lvs, name)
		}
	}
	assert.Equal(t, []string{pv.Name}, lvs, "one LV")
	pvs, err := cluster.Client.CoreV1().PersistentVolumes().List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	n := 0
	for _, p := range pvs.Items {
		if p.Spec.ClaimRef != nil && p.Spec.ClaimRef.UID == pvc.UID {
			n++
		}
	}
	assert.Equal(t, 1, n, "one PV")
	deleteClaim(t, ns, "slow")
	pvGone(t, pv.Name)
}

// An agent of the original design answers "created" without volume.device:
// the provisioner says why it cannot make a PV and guesses nothing.
func TestAgentOfOriginalDesign(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	storageClass(t, "old", storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg1"})
	node := "old"
	harnessNode(t, node)
	// It publishes capacity in the format lvm-agent kept from it.
	_, err := kube.UpdateNodeWithAnnotations(ctx, clientset.Wrap(cluster.Client), node, "", kube.Set(map[string]string{
		"csi.alibabacloud.com/storage-topology": `[{"type":"lvm","name":"vg1","capacity":107374182400}]`}))
	require.NoError(t, err)
	waitCapacity(t, node, "old")
	stop := make(chan struct{})
	defer close(stop)
	go originalAgent(t, ns, node, stop)
	claimAndPod(t, ns, "legacy", "old", "1Gi", corev1.PersistentVolumeFilesystem, map[string]string{"kubernetes.io/hostname": node})
	ev := waitEvent(t, ns, "legacy", "ProvisioningFailed")
	assert.Contains(t, ev.Message, kube.AnnDevice)
	assert.Contains(t, ev.Message, provisioner.ErrNoDevice.Error())
	pvs, err := cluster.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	for _, p := range pvs.Items {
		assert.NotEqual(t, ns, claimNamespace(p), "no PV for the claim: %s", p.Name)
	}
	deleteClaim(t, ns, "legacy")
}

func claimNamespace(pv corev1.PersistentVolume) string {
	if pv.Spec.ClaimRef == nil {
		return ""
	}
	return pv.Spec.ClaimRef.Namespace
}

// originalAgent answers every create request on node as the original agent
// did: "created", and no device.
func originalAgent(t testing.TB, ns, node string, stop chan struct{}) {
	w, err := cluster.Client.CoreV1().PersistentVolumeClaims(ns).Watch(context.Background(), metav1.ListOptions{})
	if !assert.NoError(t, err) {
		return
	}
	defer w.Stop()
	for {
		select {
		case <-stop:
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			pvc, isPVC := ev.Object.(*corev1.PersistentVolumeClaim)
			if !isPVC || pvc.Annotations[kube.AnnSelectedNode] != node || pvc.Annotations[kube.AnnLifecycle] != kube.StateCreating {
				continue
			}
			_, err := kube.UpdatePvcWithAnnotations(context.Background(), clientset.Wrap(cluster.Client), ns, pvc.Name, pvc.ResourceVersion,
				kube.Set(map[string]string{kube.AnnLifecycle: kube.StateCreated}), nil)
			if err != nil && !apierrors.IsConflict(err) {
				t.Errorf("original agent: %v", err)
			}
		}
	}
}

// harnessNode registers a Node for the test only.
func harnessNode(t testing.TB, name string) {
	t.Helper()
	harness.ReadyNode(t, cluster.ControlPlane, name, "4", "8Gi")
	t.Cleanup(func() { _ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// With capacity publishing off (no CSIDriver object, so the scheduler
// ignores capacity, and no CSIStorageCapacity), the scheduler picks the
// 1 GiB node for a 2 GiB claim (its scoring prefers it); its agent answers
// InsufficientCapacity, the provisioner hands the claim back (reschedule),
// and the claim ends bound on the 100 GiB node, with one LV in all. The
// scheduler keeps no memory of a failed provisioning, so once the first
// answer is in, the test makes the small node the less attractive one: the
// retry then goes to the other node, as it would by chance in a cluster.
func TestRescheduleWithoutCapacity(t *testing.T) {
	ctx := context.Background()
	require.NoError(t, cluster.Client.StorageV1().CSIDrivers().Delete(ctx, kube.DefaultProvisioner, metav1.DeleteOptions{}))
	prov.Kill()
	prov = startProvisioner(mainTB, "--publish-capacity=false")
	require.NoError(t, cluster.Client.StorageV1().CSIStorageCapacities(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	t.Cleanup(func() {
		setAllocatable(t, small, "64", "256Gi")
		prov.Kill()
		createCSIDriver(mainTB)
		prov = startProvisioner(mainTB)
	})

	ns := newNamespace(t)
	storageClass(t, "nocap", storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg1"})
	seen := recordSelectedNodes(t, ns, "data")
	before := len(lvNames(t, small))
	claimAndPod(t, ns, "data", "nocap", "2Gi", corev1.PersistentVolumeFilesystem, nil)
	ann := harness.WaitFor(t, timeout, func(ctx context.Context) (metav1.Object, error) {
		return cluster.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
	}, func(a map[string]string) bool { return a[kube.AnnLifecycle] == kube.StateFailed })
	assert.Equal(t, kube.ReasonInsufficientCapacity, ann[kube.AnnReason])
	setAllocatable(t, small, "2", "4Gi")
	_, pv := waitBound(t, ns, "data")
	assert.Equal(t, []string{"small", "big"}, seen(), "selected nodes in order")
	assert.Equal(t, "big", pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values[0])
	assert.Len(t, lvNames(t, small), before, "no LV on the small node")
	assert.Equal(t, 1, count(lvNames(t, big), pv.Name))
	deleteClaim(t, ns, "data")
	pvGone(t, pv.Name)
}

func count(names []string, name string) int {
	n := 0
	for _, x := range names {
		if x == name {
			n++
		}
	}
	return n
}

// dump logs what the parts say about a claim that did not get where a test
// expected.
func dump(t testing.TB, ns, name string) {
	ctx := context.Background()
	if pvc, err := cluster.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
		t.Logf("claim: annotations %v, status %v", pvc.Annotations, pvc.Status.Phase)
	}
	if pod, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
		t.Logf("pod: node %q, conditions %+v", pod.Spec.NodeName, pod.Status.Conditions)
	}
	if evs, err := cluster.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, e := range evs.Items {
			t.Logf("event %s %s %s: %s", e.InvolvedObject.Name, e.Type, e.Reason, e.Message)
		}
	}
	tail := func(s string) string {
		if len(s) > 6000 {
			return s[len(s)-6000:]
		}
		return s
	}
	t.Logf("provisioner:\n%s", tail(prov.Output()))
	t.Logf("scheduler:\n%s", tail(cluster.Scheduler.Output()))
	t.Logf("controller-manager:\n%s", tail(cluster.ControllerManager.Output()))
}

func setAllocatable(t testing.TB, n *node, cpu, memory string) {
	t.Helper()
	ctx := context.Background()
	obj, err := cluster.Client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
	require.NoError(t, err)
	obj.Status.Allocatable[corev1.ResourceCPU], obj.Status.Allocatable[corev1.ResourceMemory] = resource.MustParse(cpu), resource.MustParse(memory)
	obj.Status.Capacity = obj.Status.Allocatable
	_, err = cluster.Client.CoreV1().Nodes().UpdateStatus(ctx, obj, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// waitCapacity waits for the provisioner's CSIStorageCapacity of a node and
// class, so that the scheduler's first look at a Pod already sees it.
func waitCapacity(t testing.TB, hostname, class string) *storagev1.CSIStorageCapacity {
	t.Helper()
	var found *storagev1.CSIStorageCapacity
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Client.StorageV1().CSIStorageCapacities(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for i, c := range list.Items {
			if c.StorageClassName == class && c.NodeTopology != nil && c.NodeTopology.MatchLabels["kubernetes.io/hostname"] == hostname {
				found = &list.Items[i]
				return true, nil
			}
		}
		return false, nil
	})
	require.NoError(t, err, "no CSIStorageCapacity for node %s and class %s", hostname, class)
	return found
}

// The probes' /healthz answers 200 on the leader and on a standby (which the
// library's metrics server, started only by the leader, would not).
func TestProvisionerHealthz(t *testing.T) {
	leader := provHealth
	startProvisioner(t) // the standby: prov holds the Lease
	standby := provHealth
	provHealth = leader
	for name, addr := range map[string]string{"leader": leader, "standby": standby} {
		t.Run(name, func(t *testing.T) {
			var code int
			err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/healthz", nil)
				if err != nil {
					return false, err
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return false, nil // not listening yet
				}
				_ = resp.Body.Close()
				code = resp.StatusCode
				return true, nil
			})
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, code)
		})
	}
}

// The API server refuses the PV of a created LV for longer than the
// library's default store tries (5 times, 10 s apart), and the claim is
// deleted meanwhile. The provisioner keeps saving the PV; once it is saved,
// it is released and reclaimed: no LV is left. (With the default the
// library gave up, called Delete with the unsaved PV, our Delete found no
// PV, and the LV leaked.)
func TestProvisionerSavesPVUntilAccepted(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	storageClass(t, "unsaved", storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg1"})
	admission := cluster.Client.AdmissionregistrationV1()
	fail := admissionv1.Fail
	_, err := admission.ValidatingAdmissionPolicies().Create(ctx, &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: ns},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{Operations: []admissionv1.OperationType{admissionv1.Create},
					Rule: admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"persistentvolumes"}}}}}},
			Validations: []admissionv1.Validation{{Expression: "!has(object.spec.claimRef) || object.spec.claimRef.namespace != '" + ns + "'"}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = admission.ValidatingAdmissionPolicies().Delete(ctx, ns, metav1.DeleteOptions{}) })
	_, err = admission.ValidatingAdmissionPolicyBindings().Create(ctx, &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns},
		Spec:       admissionv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: ns, ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	unbind := func() { _ = admission.ValidatingAdmissionPolicyBindings().Delete(ctx, ns, metav1.DeleteOptions{}) }
	t.Cleanup(unbind)
	// The policy is in force once a dry run of such a PV is refused.
	probe := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: ns + "-probe"}, Spec: corev1.PersistentVolumeSpec{
		Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
		AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/probe"}},
		ClaimRef:               &corev1.ObjectReference{Namespace: ns, Name: "x"}}}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		_, err := cluster.Client.CoreV1().PersistentVolumes().Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsInvalid(err) || apierrors.IsForbidden(err), nil
	})
	require.NoError(t, err, "the policy never refused a PV")

	claimAndPod(t, ns, "unsaved", "unsaved", "2Gi", corev1.PersistentVolumeFilesystem, nil)
	var pvc *corev1.PersistentVolumeClaim
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		pvc, err = cluster.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "unsaved", metav1.GetOptions{})
		return err == nil && pvc.Annotations[kube.AnnLifecycle] == kube.StateCreated, nil
	})
	require.NoError(t, err, "the agent never created the LV")
	lv := "pvc-" + string(pvc.UID)
	require.Contains(t, lvNames(t, big), lv)
	deleteClaim(t, ns, "unsaved")
	// Longer than the library's default store tries before it gives up.
	time.Sleep(50 * time.Second)
	require.Contains(t, lvNames(t, big), lv, "the LV is kept while its PV is unsaved")
	unbind()
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		return !slices.Contains(lvNames(t, big), lv), nil
	})
	require.NoError(t, err, "LV %s leaked", lv)
	pvGone(t, lv)
}

// A Node whose kubernetes.io/hostname label is not its name: the PV's
// affinity names the label's value, and the node's agent, which read its
// label at start, owns the PV and removes the LV when the claim goes.
func TestProvisionerNodeHostnameDiffers(t *testing.T) {
	ns := newNamespace(t)
	renamed := startNodeNamed(t, "renamed", "renamed-host", 10<<30, "2", "4Gi")
	t.Cleanup(func() {
		_ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), "renamed", metav1.DeleteOptions{})
	})
	storageClass(t, "renamed", storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg1"})
	claimAndPod(t, ns, "data", "renamed", "1Gi", corev1.PersistentVolumeFilesystem, map[string]string{corev1.LabelHostname: "renamed-host"})
	pvc, pv := waitBound(t, ns, "data")
	assert.Equal(t, "renamed", pvc.Annotations[kube.AnnSelectedNode])
	assert.Equal(t, []string{"renamed-host"}, pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values)
	assert.Equal(t, []string{pv.Name}, lvNames(t, renamed))
	deleteClaim(t, ns, "data")
	pvGone(t, pv.Name)
	assert.Empty(t, lvNames(t, renamed))
}

// Claims and their Pods created together, as a user applies them: each
// claim is asked for once (creating, then created, and nothing after),
// although the provisioner library looks at a claim again once the request
// and the answer updated it, and its PV informer may not show the PV yet;
// and each PV's removal is asked once too.
func TestClaimsAskedOnce(t *testing.T) {
	ns := newNamespace(t)
	storageClass(t, "once", storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg1"})
	const n = 4 // Pods of 1 CPU: as many as the big node holds
	asked := make([]func() []string, n)
	for i := range n {
		name := fmt.Sprintf("c%d", i)
		asked[i] = recordAnnotation(t, ns, name, kube.AnnLifecycle)
		claimAndPod(t, ns, name, "once", "2Gi", corev1.PersistentVolumeFilesystem, map[string]string{corev1.LabelHostname: "big"})
	}
	pvs := make([]string, n)
	removal := make([]func() []string, n)
	for i := range n {
		_, pv := waitBound(t, ns, fmt.Sprintf("c%d", i))
		pvs[i] = pv.Name
		removal[i] = recordPVAnnotation(t, pv.Name, kube.AnnLifecycle)
	}
	for i := range n {
		deleteClaim(t, ns, fmt.Sprintf("c%d", i))
	}
	for i := range n {
		pvGone(t, pvs[i])
		assert.Equal(t, []string{kube.StateCreating, kube.StateCreated}, asked[i](), "claim c%d's lifecycle, each change once", i)
		assert.Equal(t, []string{kube.StateDeleting, kube.StateDeleted}, removal[i](), "PV of c%d: its lifecycle, each change once", i)
	}
}

// A leader whose client is throttled far below what its controllers ask
// (a recovering cluster's backlog) keeps its Lease: the renewals do not
// queue behind the controllers' requests. Before, they waited past the
// renew deadline, and the leader gave up its Lease and exited.
func TestLeaderKeepsItsLeaseWhenThrottled(t *testing.T) {
	const name = "throttled.lvm-agent.io"
	p := startProvisioner(t, "--name", name, "--kube-api-qps", "0.2", "--kube-api-burst", "1", "--label-requests=false")
	leases := cluster.Client.CoordinationV1().Leases(namespace)
	var holder string
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return false, nil
		}
		holder = *l.Spec.HolderIdentity
		return true, nil
	})
	require.NoError(t, err, "the provisioner takes its Lease")
	// Five renew deadlines (3 s each) while its controllers' informers
	// wait seconds for each request.
	time.Sleep(15 * time.Second)
	l, err := leases.Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	require.NotNil(t, l.Spec.HolderIdentity)
	assert.Equal(t, holder, *l.Spec.HolderIdentity, "the same process holds the Lease")
	require.NotNil(t, l.Spec.RenewTime)
	// Within two Lease durations (4 s): a loaded host may delay one renewal.
	assert.Less(t, time.Since(l.Spec.RenewTime.Time), 8*time.Second, "renewed all along")
	assert.NotContains(t, p.Output(), "lost the leader Lease")
}
