package provisioner

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/lvm-agent/lvm-agent/kube"
)

// ErrCloneNotSupported refuses a claim that asks for a copy of data (a
// dataSource or dataSourceRef) that lvm-agent cannot make: an empty volume
// is not a copy, so no volume is made.
var ErrCloneNotSupported = errors.New("lvm-agent cannot make this copy; no volume is made (an empty volume is not a copy)")

// ErrCloneSource refuses a clone whose source cannot be copied (the
// message says why). Nothing is made; the claim is looked at again later,
// since the source may be bound or grown since.
var ErrCloneSource = errors.New("no volume is made")

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
// "VolumeSnapshot snap (snapshot.storage.k8s.io)".
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

// isClone: the source is a claim of the clone's namespace (the only data
// source lvm-agent can copy).
func isClone(pvc *corev1.PersistentVolumeClaim, r *corev1.TypedObjectReference) bool {
	return r.Kind == "PersistentVolumeClaim" && (r.APIGroup == nil || *r.APIGroup == "") &&
		(r.Namespace == nil || *r.Namespace == "" || *r.Namespace == pvc.Namespace)
}

// cloneSource is the LV a clone copies and the node it lives on.
type cloneSource struct {
	Node, VolumeGroup, Name string
	Size                    int64
}

// cloneSource checks that the claim's source can be copied into it by this
// provisioner on class, and says from what and where. A refusal wraps
// ErrCloneSource (or ErrCloneNotSupported for a source that is no claim);
// any other error is the API server's, to retry.
func (p *Provisioner) cloneSource(ctx context.Context, pvc *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) (cloneSource, error) {
	ref := dataSource(pvc)
	if !isClone(pvc, ref) {
		return cloneSource{}, fmt.Errorf("PVC %s/%s asks for a copy of %s: %w", pvc.Namespace, pvc.Name, describe(ref), ErrCloneNotSupported)
	}
	refuse := func(format string, a ...any) (cloneSource, error) {
		return cloneSource{}, fmt.Errorf("PVC %s/%s is a clone of PVC %s, which %s: %w",
			pvc.Namespace, pvc.Name, ref.Name, fmt.Sprintf(format, a...), ErrCloneSource)
	}
	src, err := p.client.CoreV1().PersistentVolumeClaims(pvc.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return refuse("does not exist")
	case err != nil:
		return cloneSource{}, fmt.Errorf("read the source of PVC %s/%s: %w", pvc.Namespace, pvc.Name, err)
	case src.DeletionTimestamp != nil:
		return refuse("is being deleted")
	case src.Status.Phase != corev1.ClaimBound || src.Spec.VolumeName == "":
		return refuse("is not bound to a volume yet (it is %s)", src.Status.Phase)
	case className(src) != class.Name:
		return refuse("is of StorageClass %q; a clone is of its source's class, not %q", className(src), class.Name)
	case volumeMode(src) != volumeMode(pvc):
		return refuse("is of volumeMode %s; a clone of it must be too, not %s", volumeMode(src), volumeMode(pvc))
	}
	pv, err := p.client.CoreV1().PersistentVolumes().Get(ctx, src.Spec.VolumeName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return refuse("is bound to PV %s, which does not exist", src.Spec.VolumeName)
	case err != nil:
		return cloneSource{}, fmt.Errorf("read the source volume of PVC %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	host, ok := kube.LocalPVHostname(pv)
	if !ok || pv.Annotations[kube.AnnProvisionedBy] != p.cfg.Name || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != src.UID {
		return refuse("is bound to PV %s, which is not a local volume of provisioner %s bound to it", pv.Name, p.cfg.Name)
	}
	vg, lv, err := kube.ParsePVSpec(pv.Annotations[kube.AnnSpec])
	if err != nil {
		return refuse("is bound to PV %s without a volume spec: %v", pv.Name, err)
	}
	params, err := ParseParams(class.Parameters)
	if err != nil {
		return cloneSource{}, fmt.Errorf("StorageClass %s: %w", class.Name, err)
	}
	if vg != params.VolumeGroup {
		return refuse("is in volume group %s, and StorageClass %s now makes volumes in %s", vg, class.Name, params.VolumeGroup)
	}
	have, want := pv.Spec.Capacity[corev1.ResourceStorage], pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if have.Cmp(want) > 0 {
		return refuse("is %s, larger than the %s the clone asks for", have.String(), want.String())
	}
	nodes, err := kube.NodesOfHostname(ctx, p.api, host)
	switch {
	case err != nil:
		return cloneSource{}, err
	case len(nodes) == 0:
		return refuse("is on node %s (hostname), which is gone", host)
	case len(nodes) > 1:
		return refuse("is on hostname %s, which %d Nodes carry", host, len(nodes))
	}
	return cloneSource{Node: nodes[0].Name, VolumeGroup: vg, Name: lv, Size: have.Value()}, nil
}

func className(pvc *corev1.PersistentVolumeClaim) string {
	if pvc.Spec.StorageClassName == nil {
		return ""
	}
	return *pvc.Spec.StorageClassName
}

func volumeMode(pvc *corev1.PersistentVolumeClaim) corev1.PersistentVolumeMode {
	if pvc.Spec.VolumeMode == nil {
		return corev1.PersistentVolumeFilesystem
	}
	return *pvc.Spec.VolumeMode
}

// cloneFrom is the source of a clone's create spec: only a source that
// checks out, on its own node, whose agent says it can make clones in the
// volume group vg. Another node is given back to the scheduler (the Placer
// then names the source's node), never used.
func (p *Provisioner) cloneFrom(ctx context.Context, opts controller.ProvisionOptions, node *corev1.Node, vg string) (*kube.CloneSource, int64, controller.ProvisioningState, error) {
	pvc := opts.PVC
	src, err := p.cloneSource(ctx, pvc, opts.StorageClass)
	switch {
	case errors.Is(err, ErrCloneSource), errors.Is(err, ErrCloneNotSupported):
		// Never Reschedule: no other node can copy it either.
		return nil, 0, controller.ProvisioningFinished, err
	case err != nil:
		return nil, 0, controller.ProvisioningNoChange, err
	case src.Node != node.Name:
		return nil, 0, controller.ProvisioningReschedule, fmt.Errorf("PVC %s/%s is a clone of a volume on node %s and can only be made there, not on %s: %w",
			pvc.Namespace, pvc.Name, src.Node, node.Name, ErrWrongNode)
	}
	kind := cloneKind(node, p.cfg.CapacityAnnotation, vg)
	if kind == "" {
		return nil, 0, controller.ProvisioningFinished, fmt.Errorf("PVC %s/%s is a clone of %s/%s on node %s, whose agent does not say it can clone volumes of volume group %s (annotation %s): %w",
			pvc.Namespace, pvc.Name, src.VolumeGroup, src.Name, src.Node, vg, p.cfg.CapacityAnnotation, ErrCloneNotSupported)
	}
	return &kube.CloneSource{Name: src.Name, Kind: kind}, src.Size, controller.ProvisioningFinished, nil
}

// cloneKind is the kind of clone the agent of node says it makes in vg (its
// capacity annotation's "clone" field), "" when it says none. An agent of
// the original design, or an older lvm-agent, says none: it would ignore
// or refuse the spec's source, and must never be sent one.
func cloneKind(node *corev1.Node, annotation, vg string) string {
	return capacityEntry(node, annotation, vg).Clone
}

// capacityEntry is vg's entry in node's capacity annotation (what its agent
// says of that volume group), the zero entry when there is none.
func capacityEntry(node *corev1.Node, annotation, vg string) kube.StorageCapacity {
	entries, _ := kube.DecodeStorageTopology(node.Annotations[annotation])
	for _, e := range entries {
		if e.Name == vg {
			return e
		}
	}
	return kube.StorageCapacity{}
}

// AnnPreResizeCapacity is Kubernetes' own way to say that a volume's
// filesystem is smaller than its device (k8s.io/kubernetes
// pkg/volume/util/resize_util.go): the PV controller, binding a claim to a
// PV that carries it, sets the claim's status capacity to its value rather
// than the PV's ("a discrepancy can be intentional": updateClaimStatus in
// pkg/controller/volume/persistentvolume/pv_controller.go), and kubelet,
// mounting a volume whose claim's capacity is below the PV's, grows the
// filesystem (expandVolumeDuringMount in
// pkg/volume/util/operationexecutor/operation_generator.go; the `local`
// plugin grows ext4 and xfs) and sets the claim's capacity. A Filesystem
// clone larger than its source carries the source's size in it.
const AnnPreResizeCapacity = "volume.alpha.kubernetes.io/pre-resize-capacity"

// ErrWrongNode: the scheduler picked a node for a clone (a Pod came before
// the Placer named the source's node); the selected node is given back.
var ErrWrongNode = errors.New("selected node given back to the scheduler")
