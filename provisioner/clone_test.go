package provisioner

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
)

// A claim that asks for a copy is never provisioned empty: no request is
// written, and the error (the library's ProvisioningFailed event) says why.
func TestProvisionRefusesDataSource(t *testing.T) {
	snapGroup := "snapshot.storage.k8s.io"
	for _, c := range []struct {
		name    string
		source  *corev1.TypedLocalObjectReference
		ref     *corev1.TypedObjectReference
		want    error
		wantErr string
	}{
		{"a PVC that does not exist", &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "src"}, nil,
			ErrCloneSource, "PVC ns/data is a clone of PVC src, which does not exist: no volume is made"},
		{"a VolumeSnapshot", &corev1.TypedLocalObjectReference{APIGroup: &snapGroup, Kind: "VolumeSnapshot", Name: "snap"}, nil,
			ErrCloneNotSupported, "PVC ns/data asks for a copy of VolumeSnapshot snap (snapshot.storage.k8s.io): lvm-agent cannot make this copy"},
		{"a populator (dataSourceRef only)", nil, &corev1.TypedObjectReference{APIGroup: ptr("example.com"), Kind: "Seed", Name: "s"},
			ErrCloneNotSupported, "Seed s (example.com)"},
		{"a PVC of another namespace", nil, &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "s", Namespace: ptr("other")},
			ErrCloneNotSupported, "PersistentVolumeClaim s in namespace other"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, corev1.PersistentVolumeFilesystem, created)
			w.pvc.Spec.DataSource, w.pvc.Spec.DataSourceRef = c.source, c.ref
			pv, state, err := provision(t, w, class(storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete,
				map[string]string{"volumeGroup": "vg0"}))
			require.ErrorIs(t, err, c.want)
			assert.ErrorContains(t, err, c.wantErr)
			assert.Nil(t, pv)
			assert.Equal(t, controller.ProvisioningFinished, state, "never Reschedule: another node cannot copy either")
			ann, _ := requested(t, w)
			assert.NotContains(t, ann, kube.AnnLifecycle, "no request written")
		})
	}
}

func ptr[T any](v T) *T { return &v }

// cloneWorld is a bound source claim "src" of class "lvm" (1 GiB, on
// node-a, whose hostname is host-a) and a clone "data" of it, as change
// leaves them.
func cloneWorld(t *testing.T, change func(src *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, clone *corev1.PersistentVolumeClaim)) (*fake.Clientset, *corev1.PersistentVolumeClaim) {
	t.Helper()
	lvm := "lvm"
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{HostnameLabel: "host-a"}}}
	src := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "src", UID: "uid-src"},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &lvm, VolumeName: "pvc-uid-src",
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}}
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-uid-src",
		Annotations: map[string]string{kube.AnnSpec: "vg0/pvc-uid-src", kube.AnnProvisionedBy: kube.DefaultProvisioner}},
		Spec: corev1.PersistentVolumeSpec{Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			ClaimRef:               &corev1.ObjectReference{Namespace: "ns", Name: "src", UID: "uid-src"},
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/dev/vg0/pvc-uid-src"}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: HostnameLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{"host-a"}}}}}}}}}
	clone := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data", UID: "uid-1", ResourceVersion: "1"},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &lvm,
			DataSource: &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "src"},
			Resources:  corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if change != nil {
		change(src, pv, clone)
	}
	return fake.NewClientset(node, src, pv, clone), clone
}

func TestCloneSource(t *testing.T) {
	wffc := class(storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg0"})
	block := corev1.PersistentVolumeBlock
	type objs = func(src *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, clone *corev1.PersistentVolumeClaim)
	for _, c := range []struct {
		name   string
		change objs
		err    string
	}{
		{"ok", nil, ""},
		{"larger clone", func(_ *corev1.PersistentVolumeClaim, _ *corev1.PersistentVolume, clone *corev1.PersistentVolumeClaim) {
			clone.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("2Gi")
		}, ""},
		{"no source", func(_ *corev1.PersistentVolumeClaim, _ *corev1.PersistentVolume, clone *corev1.PersistentVolumeClaim) {
			clone.Spec.DataSource.Name = "nope"
		}, "PVC ns/data is a clone of PVC nope, which does not exist: no volume is made"},
		{"not bound", func(src *corev1.PersistentVolumeClaim, _ *corev1.PersistentVolume, _ *corev1.PersistentVolumeClaim) {
			src.Status.Phase, src.Spec.VolumeName = corev1.ClaimPending, ""
		}, "is not bound to a volume yet (it is Pending)"},
		{"other class", func(src *corev1.PersistentVolumeClaim, _ *corev1.PersistentVolume, _ *corev1.PersistentVolumeClaim) {
			other := "other"
			src.Spec.StorageClassName = &other
		}, `is of StorageClass "other"; a clone is of its source's class, not "lvm"`},
		{"other volume mode", func(_ *corev1.PersistentVolumeClaim, _ *corev1.PersistentVolume, clone *corev1.PersistentVolumeClaim) {
			clone.Spec.VolumeMode = &block
		}, "is of volumeMode Filesystem; a clone of it must be too, not Block"},
		{"not ours", func(_ *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, _ *corev1.PersistentVolumeClaim) {
			pv.Annotations[kube.AnnProvisionedBy] = "someone.else"
		}, "is bound to PV pvc-uid-src, which is not a local volume of provisioner lvm.lvm-agent.io bound to it"},
		{"PV of another claim", func(_ *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, _ *corev1.PersistentVolumeClaim) {
			pv.Spec.ClaimRef.UID = "uid-other"
		}, "which is not a local volume"},
		{"other VG", func(_ *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, _ *corev1.PersistentVolumeClaim) {
			pv.Annotations[kube.AnnSpec] = "vg9/pvc-uid-src"
		}, "is in volume group vg9, and StorageClass lvm now makes volumes in vg0"},
		{"larger source", func(_ *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, _ *corev1.PersistentVolumeClaim) {
			pv.Spec.Capacity[corev1.ResourceStorage] = resource.MustParse("3Gi")
		}, "is 3Gi, larger than the 1Gi the clone asks for"},
		{"node gone", func(_ *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, _ *corev1.PersistentVolumeClaim) {
			pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values = []string{"host-gone"}
		}, "is on node host-gone (hostname), which is gone"},
	} {
		t.Run(c.name, func(t *testing.T) {
			client, clone := cloneWorld(t, c.change)
			src, err := New(client, Config{}).cloneSource(context.Background(), clone, wffc)
			if c.err == "" {
				require.NoError(t, err)
				assert.Equal(t, cloneSource{Node: "node-a", VolumeGroup: "vg0", Name: "pvc-uid-src", Size: 1 << 30}, src)
				return
			}
			require.ErrorIs(t, err, ErrCloneSource)
			assert.ErrorContains(t, err, c.err)
		})
	}
}

// Provision of a clone: on another node than the source's, the node is given
// back to the scheduler; on the source's node, refused while its agent does
// not say it clones; asked with the source once it does.
func TestProvisionClone(t *testing.T) {
	wffc := class(storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg0"})
	client, clone := cloneWorld(t, nil)
	p := New(client, Config{Timeout: 200 * time.Millisecond})
	provision := func(node string) (controller.ProvisioningState, error) {
		_, state, err := p.Provision(context.Background(), controller.ProvisionOptions{StorageClass: wffc, PVName: "pvc-uid-1", PVC: clone, SelectedNodeName: node})
		return state, err
	}
	requested := func() map[string]string {
		got, err := client.CoreV1().PersistentVolumeClaims("ns").Get(context.Background(), "data", metav1.GetOptions{})
		require.NoError(t, err)
		return got.Annotations
	}
	_, err := client.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b",
		Labels: map[string]string{HostnameLabel: "host-b"}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	state, err := provision("node-b")
	require.ErrorIs(t, err, ErrWrongNode)
	assert.Equal(t, controller.ProvisioningReschedule, state)

	state, err = provision("node-a")
	require.ErrorIs(t, err, ErrCloneNotSupported)
	assert.ErrorContains(t, err, "whose agent does not say it can clone volumes of volume group vg0 (annotation csi.alibabacloud.com/storage-topology)")
	assert.Equal(t, controller.ProvisioningFinished, state)
	assert.NotContains(t, requested(), kube.AnnLifecycle, "no request written")

	_, err = kube.UpdateNodeWithAnnotations(context.Background(), clientset.Wrap(client), "node-a", "", kube.Set(map[string]string{kube.DefaultCapacityAnnotation: kube.EncodeStorageTopology(
		[]kube.StorageCapacity{{Type: "lvm", Name: "vg0", DeviceClass: "vg0", Capacity: 1 << 40, Free: 1 << 40, Clone: kube.CloneSnapshot, Wipe: kube.WipeZero}})}))
	require.NoError(t, err)
	_, err = kube.UpdatePvcWithAnnotations(context.Background(), clientset.Wrap(client), "ns", "data", "", kube.Set(map[string]string{kube.AnnSelectedNode: "node-a"}), nil)
	require.NoError(t, err)
	state, err = provision("node-a")
	assert.Equal(t, controller.ProvisioningInBackground, state, "asked, no answer yet: %v", err)
	spec, err := kube.ParseCreateSpec(requested()[kube.AnnSpec])
	require.NoError(t, err)
	assert.Equal(t, kube.CreateSpec{VolumeGroup: "vg0", Name: "pvc-uid-1", Size: 1 << 30, Source: &kube.CloneSource{Name: "pvc-uid-src", Kind: kube.CloneSnapshot}}, spec)
}

// The PV of a Filesystem clone larger than its source says that its
// filesystem is the source's size, so that kubelet grows it; a Block clone,
// or one of its source's size, says nothing.
func TestProvisionCloneLargerThanItsSource(t *testing.T) {
	wffc := class(storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg0"})
	block := corev1.PersistentVolumeBlock
	for _, c := range []struct {
		name string
		size string
		mode *corev1.PersistentVolumeMode
		want map[string]string
	}{
		{"larger", "3Gi", nil, map[string]string{kube.AnnSpec: "vg0/pvc-uid-1", AnnPreResizeCapacity: "1Gi"}},
		{"same size", "1Gi", nil, map[string]string{kube.AnnSpec: "vg0/pvc-uid-1"}},
		{"larger block", "3Gi", &block, map[string]string{kube.AnnSpec: "vg0/pvc-uid-1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			client, clone := cloneWorld(t, func(src *corev1.PersistentVolumeClaim, _ *corev1.PersistentVolume, clone *corev1.PersistentVolumeClaim) {
				clone.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse(c.size)
				clone.Spec.VolumeMode, src.Spec.VolumeMode = c.mode, c.mode
				clone.Annotations = map[string]string{kube.AnnSelectedNode: "node-a"}
			})
			_, err := kube.UpdateNodeWithAnnotations(context.Background(), clientset.Wrap(client), "node-a", "", kube.Set(map[string]string{kube.DefaultCapacityAnnotation: kube.EncodeStorageTopology(
				[]kube.StorageCapacity{{Type: "lvm", Name: "vg0", DeviceClass: "vg0", Capacity: 1 << 40, Free: 1 << 40, Clone: kube.CloneSnapshot, Wipe: kube.WipeZero}})}))
			require.NoError(t, err)
			client.PrependWatchReactor("*", func(a clienttesting.Action) (bool, watch.Interface, error) {
				wi, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace())
				go func() {
					_, err := kube.UpdatePvcWithAnnotations(context.Background(), clientset.Wrap(client), "ns", "data", "",
						kube.Set(map[string]string{kube.AnnLifecycle: kube.StateCreated, kube.AnnDevice: "/dev/vg0/pvc-uid-1"}), nil)
					assert.NoError(t, err)
				}()
				return true, wi, err
			})
			pv, _, err := New(client, Config{Timeout: 5 * time.Second}).Provision(context.Background(),
				controller.ProvisionOptions{StorageClass: wffc, PVName: "pvc-uid-1", PVC: clone, SelectedNodeName: "node-a"})
			require.NoError(t, err)
			assert.Equal(t, c.want, pv.Annotations)
		})
	}
}
