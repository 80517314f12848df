package provisioner

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
)

// ErrCloneNotSupported refuses a claim that asks for a copy of data (a
// dataSource or dataSourceRef): an empty volume is not a copy, so no volume
// is made until the kind of copy it asks for can be made.
var ErrCloneNotSupported = errors.New("lvm-agent cannot make this copy yet; no volume is made (an empty volume is not a copy)")

// dataSource is what a claim asks to be filled from, nil for an empty
// volume. The API server copies a dataSource of a core kind into
// dataSourceRef and back (AnyVolumeDataSource), but a volume populator's
// source is only in dataSourceRef, so that one is read first.
func dataSource(pvc *corev1.PersistentVolumeClaim) *corev1.TypedObjectReference {
	if r := pvc.Spec.DataSourceRef; r != nil {
		return r
	}
	if r := pvc.Spec.DataSource; r != nil {
		return &corev1.TypedObjectReference{APIGroup: r.APIGroup, Kind: r.Kind, Name: r.Name}
	}
	return nil
}

// describe names a data source for people: "PersistentVolumeClaim data" or
// "VolumeSnapshot snap.snapshot.storage.k8s.io".
func describe(r *corev1.TypedObjectReference) string {
	s := r.Kind + " " + r.Name
	if r.APIGroup != nil && *r.APIGroup != "" {
		s += " (" + *r.APIGroup + ")"
	}
	if r.Namespace != nil && *r.Namespace != "" {
		s += " in namespace " + *r.Namespace
	}
	return s
}

// refuseDataSource is the error for a claim with a data source.
func refuseDataSource(pvc *corev1.PersistentVolumeClaim, src *corev1.TypedObjectReference) error {
	return fmt.Errorf("PVC %s/%s asks for a copy of %s: %w", pvc.Namespace, pvc.Name, describe(src), ErrCloneNotSupported)
}
