package provisioner

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/lvm-agent/lvm-agent/kube"
)

func placer(t *testing.T, change func(*corev1.PersistentVolumeClaim, *corev1.PersistentVolume, *corev1.PersistentVolumeClaim),
	sc *storagev1.StorageClass) (*Placer, *record.FakeRecorder, func() map[string]string) {
	t.Helper()
	client, clone := cloneWorld(t, change)
	pvcs := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	classes := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	require.NoError(t, pvcs.Add(clone))
	require.NoError(t, classes.Add(sc))
	rec := record.NewFakeRecorder(10)
	pl := &Placer{p: New(client, Config{}), pvcs: corelisters.NewPersistentVolumeClaimLister(pvcs),
		classes: storagelisters.NewStorageClassLister(classes), recorder: rec}
	return pl, rec, func() map[string]string {
		got, err := client.CoreV1().PersistentVolumeClaims("ns").Get(context.Background(), "data", metav1.GetOptions{})
		require.NoError(t, err)
		return got.Annotations
	}
}

func TestPlacerNamesTheSourcesNode(t *testing.T) {
	pl, rec, annotations := placer(t, nil, class(storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg0"}))
	require.NoError(t, pl.place(context.Background(), "ns/data"))
	assert.Equal(t, map[string]string{kube.AnnSelectedNode: "node-a"}, annotations())
	assert.Equal(t, "Normal ClonePlaced A clone of PVC src is made on its node, node-a; its Pods run there", <-rec.Events)
}

func TestPlacerRefuses(t *testing.T) {
	pl, rec, annotations := placer(t, func(src *corev1.PersistentVolumeClaim, _ *corev1.PersistentVolume, _ *corev1.PersistentVolumeClaim) {
		src.Status.Phase = corev1.ClaimPending
	}, class(storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg0"}))
	require.ErrorIs(t, pl.place(context.Background(), "ns/data"), ErrCloneSource, "looked at again later")
	assert.Empty(t, annotations(), "no node named")
	assert.Equal(t, "Warning CloneRefused PVC ns/data is a clone of PVC src, which is not bound to a volume yet (it is Pending): no volume is made", <-rec.Events)
}

func TestPlacerLeavesOthersClaims(t *testing.T) {
	for name, sc := range map[string]*storagev1.StorageClass{
		"immediate": class(storagev1.VolumeBindingImmediate, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg0"}),
		"other provisioner": func() *storagev1.StorageClass {
			c := class(storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, nil)
			c.Provisioner = "other.example.com"
			return c
		}(),
	} {
		t.Run(name, func(t *testing.T) {
			pl, rec, annotations := placer(t, nil, sc)
			require.NoError(t, pl.place(context.Background(), "ns/data"))
			assert.Empty(t, annotations())
			assert.Empty(t, rec.Events)
		})
	}
}
