package provisioner

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/lvm-agent/lvm-agent/kube"
)

// A claim that asks for a copy is never provisioned empty: no request is
// written, and the error (the library's ProvisioningFailed event) says why.
func TestProvisionRefusesDataSource(t *testing.T) {
	snapGroup := "snapshot.storage.k8s.io"
	for _, c := range []struct {
		name    string
		source  *corev1.TypedLocalObjectReference
		ref     *corev1.TypedObjectReference
		wantErr string
	}{
		{"a PVC", &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "src"}, nil,
			"PVC ns/data asks for a copy of PersistentVolumeClaim src: lvm-agent cannot make this copy yet"},
		{"a VolumeSnapshot", &corev1.TypedLocalObjectReference{APIGroup: &snapGroup, Kind: "VolumeSnapshot", Name: "snap"}, nil,
			"VolumeSnapshot snap (snapshot.storage.k8s.io)"},
		{"a populator (dataSourceRef only)", nil, &corev1.TypedObjectReference{APIGroup: ptr("example.com"), Kind: "Seed", Name: "s"},
			"Seed s (example.com)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, corev1.PersistentVolumeFilesystem, created)
			w.pvc.Spec.DataSource, w.pvc.Spec.DataSourceRef = c.source, c.ref
			pv, state, err := provision(t, w, class(storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete,
				map[string]string{"volumeGroup": "vg0"}))
			require.ErrorIs(t, err, ErrCloneNotSupported)
			assert.ErrorContains(t, err, c.wantErr)
			assert.Nil(t, pv)
			assert.Equal(t, controller.ProvisioningFinished, state, "never Reschedule: another node cannot copy either")
			ann, _ := requested(t, w)
			assert.NotContains(t, ann, kube.AnnLifecycle, "no request written")
		})
	}
}

func ptr[T any](v T) *T { return &v }
