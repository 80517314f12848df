package provisioning

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
	"github.com/lvm-agent/lvm-agent/provisioner"
)

// cloneNamespace is a namespace for a test that leaves nothing behind: its
// Pods and claims are deleted when it ends, and the volumes of its claims
// gone (the LVs with them), so that the next tests find the nodes as
// before.
func cloneNamespace(t *testing.T) string {
	t.Helper()
	ns := newNamespace(t)
	t.Cleanup(func() {
		ctx := context.Background()
		assert.NoError(t, cluster.Client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}, metav1.ListOptions{}))
		assert.NoError(t, cluster.Client.CoreV1().PersistentVolumeClaims(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
			pvs, err := cluster.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, nil
			}
			return !slices.ContainsFunc(pvs.Items, func(pv corev1.PersistentVolume) bool {
				return pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == ns && pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete
			}), nil
		})
		assert.NoError(t, err, "the volumes of namespace %s are not gone", ns)
	})
	return ns
}

// allLVs counts the LVs of both nodes.
func allLVs(t *testing.T) int { return len(lvNames(t, small)) + len(lvNames(t, big)) }

// assertNothingMade: the claim has no request and no volume, and no LV was
// made since before.
func assertNothingMade(t *testing.T, ns, name string, before int) {
	t.Helper()
	pvc, err := cluster.Client.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, corev1.ClaimPending, pvc.Status.Phase)
	assert.NotContains(t, pvc.Annotations, kube.AnnLifecycle, "no request written")
	assert.Equal(t, before, allLVs(t), "no LV made")
}

// A claim with a data source is never bound to an empty volume: the source
// does not exist, or is no claim (a VolumeSnapshot). Before issue 27 both
// were bound to a new, empty LV.
func TestCloneRefusedNothingMade(t *testing.T) {
	ns := cloneNamespace(t)
	storageClass(t, "copy", storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg1"})
	claimAndPod(t, ns, "src", "copy", "64Mi", corev1.PersistentVolumeFilesystem, map[string]string{corev1.LabelHostname: "small"})
	waitBound(t, ns, "src")
	before := allLVs(t)

	createClaim(t, ns, "missing", "copy", "64Mi", corev1.PersistentVolumeFilesystem, "nope")
	createPod(t, ns, "missing", nil)
	waitEventSaying(t, ns, "missing", provisioner.ReasonCloneRefused, "PVC "+ns+"/missing is a clone of PVC nope, which does not exist: no volume is made")
	waitEventSaying(t, ns, "missing", "ProvisioningFailed", "which does not exist: no volume is made")

	group := "snapshot.storage.k8s.io"
	snap := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "snap"},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: ptr("copy"), AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			DataSource: &corev1.TypedLocalObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "s1"},
			Resources:  corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}}}}
	_, err := cluster.Client.CoreV1().PersistentVolumeClaims(ns).Create(context.Background(), snap, metav1.CreateOptions{})
	require.NoError(t, err)
	createPod(t, ns, "snap", nil)
	waitEventSaying(t, ns, "snap", "ProvisioningFailed", "asks for a copy of VolumeSnapshot s1 (snapshot.storage.k8s.io): lvm-agent cannot make this copy")

	for _, name := range []string{"missing", "snap"} {
		assertNothingMade(t, ns, name, before)
	}
}

// Ten thin clones of a claim on the node the scheduler likes least (fewer
// CPUs, a smaller thin pool): each is placed on the source's node before
// its Pod exists, made there with one CreateLVSnapshot, and its Pod
// follows, all at the first try. The clones outlive their source.
func TestThinClonesOnSourcesNode(t *testing.T) {
	thin := func(size uint64) lvmdfake.Class {
		return lvmdfake.Class{Name: "thin", SizeBytes: size, Thin: true, Overprovision: 10}
	}
	a := startNodeOf(t, "thin-a", "16", "32Gi", thin(1<<30))
	startNodeOf(t, "thin-b", "64", "256Gi", thin(100<<30))
	var snapshots atomic.Int32
	a.lvm.SetHook(func(op, _, _ string) error {
		if op == "snapshot" {
			snapshots.Add(1)
		}
		return nil
	})
	ns := cloneNamespace(t)
	storageClass(t, "thin", storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "thin"})
	waitCapacity(t, "thin-a", "thin")
	waitCapacity(t, "thin-b", "thin")
	waitCloneKind(t, "thin-a", "thin", kube.CloneSnapshot)
	claimAndPod(t, ns, "src", "thin", "64Mi", corev1.PersistentVolumeFilesystem, map[string]string{corev1.LabelHostname: "thin-a"})
	_, srcPV := waitBound(t, ns, "src")
	require.NoError(t, a.lvm.Write("thin", srcPV.Name, 32<<20))

	var seen []func() []string
	for i := range 10 {
		name := fmt.Sprintf("clone-%d", i)
		seen = append(seen, recordSelectedNodes(t, ns, name))
		createClaim(t, ns, name, "thin", "128Mi", corev1.PersistentVolumeFilesystem, "src")
	}
	for i := range 10 {
		name := fmt.Sprintf("clone-%d", i)
		waitEventSaying(t, ns, name, provisioner.ReasonClonePlaced, "A clone of PVC src is made on its node, thin-a")
		createPod(t, ns, name, nil)
	}
	for i := range 10 {
		name := fmt.Sprintf("clone-%d", i)
		pvc, pv := waitBound(t, ns, name)
		assert.Equal(t, []string{"thin-a"}, seen[i](), "%s: the source's node at the first try", name)
		assert.Equal(t, "thin-a", pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values[0])
		assert.Equal(t, resource.MustParse("128Mi"), pv.Spec.Capacity[corev1.ResourceStorage])
		assert.Equal(t, "64Mi", pv.Annotations[provisioner.AnnPreResizeCapacity])
		assert.Equal(t, resource.MustParse("64Mi"), pvc.Status.Capacity[corev1.ResourceStorage],
			"the PV controller says the filesystem is the source's, for kubelet to grow")
		lv := lvOfClass(t, a.node, "thin", pv.Name)
		assert.True(t, lv.Thin)
		// The host's classes say wipe: none (harness.HostClass): its tag.
		assert.Equal(t, []string{kube.NoWipeTag, "lvm-agent.pvc." + string(pvc.UID)}, lv.Tags, "owned by the clone's claim only")
		assert.EqualValues(t, 32<<20, lv.Written, "the source's data")
		pod := waitPodNode(t, ns, name)
		assert.Equal(t, "thin-a", pod, "%s: its Pod runs where its volume is", name)
	}
	assert.EqualValues(t, 10, snapshots.Load(), "one snapshot per clone")

	deleteClaim(t, ns, "src")
	pvGone(t, srcPV.Name)
	lvs, err := a.lvm.List("thin")
	require.NoError(t, err)
	assert.Len(t, lvs, 10, "the clones keep their LVs when the source goes")
}

// waitCloneKind waits until the agent of node says it makes clones of kind
// in volume group vg.
func waitCloneKind(t *testing.T, node, vg, kind string) {
	t.Helper()
	harness.WaitFor(t, timeout, func(ctx context.Context) (metav1.Object, error) {
		return cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	}, func(a map[string]string) bool {
		entries, err := kube.DecodeStorageTopology(a[kube.DefaultCapacityAnnotation])
		return err == nil && slices.ContainsFunc(entries, func(e kube.StorageCapacity) bool { return e.Name == vg && e.Clone == kind })
	})
}

// waitPodNode waits until the scheduler bound the Pod and returns its node.
func waitPodNode(t *testing.T, ns, name string) string {
	t.Helper()
	var node string
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		pod, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			node = pod.Spec.NodeName
		}
		return node != "", nil
	})
	if err != nil {
		dump(t, ns, name)
	}
	require.NoError(t, err, "Pod %s/%s not scheduled", ns, name)
	return node
}

// lvOfClass is the LV name of class on n.
func lvOfClass(t *testing.T, n *node, class, name string) lvmdfake.LV {
	t.Helper()
	lvs, err := n.lvm.List(class)
	require.NoError(t, err)
	i := slices.IndexFunc(lvs, func(lv lvmdfake.LV) bool { return lv.Name == name })
	require.GreaterOrEqual(t, i, 0, "no LV %s/%s on %s", class, name, n.name)
	return lvs[i]
}

// A thick clone (not made yet: lvm-agent publishes no clone kind for a
// thick class) is placed on its source's node, then refused there.
func TestThickCloneRefusedOnSourcesNode(t *testing.T) {
	ns := cloneNamespace(t)
	storageClass(t, "thick-copy", storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg1"})
	claimAndPod(t, ns, "src", "thick-copy", "64Mi", corev1.PersistentVolumeFilesystem, map[string]string{corev1.LabelHostname: "small"})
	waitBound(t, ns, "src")
	before := allLVs(t)
	seen := recordSelectedNodes(t, ns, "copy")
	createClaim(t, ns, "copy", "thick-copy", "64Mi", corev1.PersistentVolumeFilesystem, "src")
	waitEventSaying(t, ns, "copy", provisioner.ReasonClonePlaced, "made on its node, small")
	createPod(t, ns, "copy", nil)
	waitEventSaying(t, ns, "copy", "ProvisioningFailed", "on node small, whose agent does not say it can clone volumes of volume group vg1")
	assert.Equal(t, []string{"small"}, seen())
	assertNothingMade(t, ns, "copy", before)
}

// A source that cannot be copied: an event on the clone, no node named,
// nothing made.
func TestCloneSourceRefused(t *testing.T) {
	ns := cloneNamespace(t)
	storageClass(t, "refuse", storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg1"})
	storageClass(t, "refuse-other", storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg1"})
	claimAndPod(t, ns, "big-src", "refuse", "128Mi", corev1.PersistentVolumeFilesystem, map[string]string{corev1.LabelHostname: "small"})
	claimAndPod(t, ns, "other-src", "refuse-other", "64Mi", corev1.PersistentVolumeFilesystem, map[string]string{corev1.LabelHostname: "small"})
	createClaim(t, ns, "unbound-src", "refuse", "64Mi", corev1.PersistentVolumeFilesystem, "")
	staticSource(t, ns, "foreign-src", "refuse", "small", map[string]string{kube.AnnSpec: "vg1/foreign"})
	staticSource(t, ns, "vg-src", "refuse", "small", map[string]string{kube.AnnSpec: "vg9/elsewhere", kube.AnnProvisionedBy: kube.DefaultProvisioner})
	staticSource(t, ns, "gone-src", "refuse", "gone", map[string]string{kube.AnnSpec: "vg1/lost", kube.AnnProvisionedBy: kube.DefaultProvisioner})
	waitBound(t, ns, "big-src")
	waitBound(t, ns, "other-src")
	before := allLVs(t)
	for src, says := range map[string]string{
		"unbound-src": "which is not bound to a volume yet (it is Pending)",
		"other-src":   `which is of StorageClass "refuse-other"; a clone is of its source's class, not "refuse"`,
		"big-src":     "which is 128Mi, larger than the 64Mi the clone asks for",
		"foreign-src": "which is not a local volume of provisioner " + kube.DefaultProvisioner + " bound to it",
		"vg-src":      "which is in volume group vg9, and StorageClass refuse now makes volumes in vg1",
		"gone-src":    "which is on node gone (hostname), which is gone",
	} {
		name := "of-" + src
		createClaim(t, ns, name, "refuse", "64Mi", corev1.PersistentVolumeFilesystem, src)
		waitEventSaying(t, ns, name, provisioner.ReasonCloneRefused, says+": no volume is made")
		pvc, err := cluster.Client.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), name, metav1.GetOptions{})
		require.NoError(t, err)
		assert.NotContains(t, pvc.Annotations, kube.AnnSelectedNode, "%s: no node named", name)
		assertNothingMade(t, ns, name, before)
	}
}

// staticSource is a claim bound to a hand-made local PV of class on the
// node of hostname host, with annotations (Retain: nobody deletes an LV).
func staticSource(t *testing.T, ns, name, class, host string, annotations map[string]string) {
	t.Helper()
	ctx := context.Background()
	pvName := ns + "-" + name
	_, err := cluster.Client.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName, Annotations: annotations},
		Spec: corev1.PersistentVolumeSpec{StorageClassName: class, PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			ClaimRef:               &corev1.ObjectReference{Namespace: ns, Name: name},
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/dev/vg1/" + name}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{host}}}}}}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cluster.Client.CoreV1().PersistentVolumes().Delete(context.Background(), pvName, metav1.DeleteOptions{})
	})
	_, err = cluster.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, VolumeName: pvName,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	waitBound(t, ns, name)
}
