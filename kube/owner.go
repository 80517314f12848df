package kube

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// Node identifies one agent: its node name, the CSI drivers whose PVs it
// serves, and the provisioners whose local PVs it serves.
type Node struct {
	Name         string
	Drivers      []string
	Provisioners []string
}

// OwnsPVC: the PVC's selected-node is this node. The volume.node label never
// makes a PVC an agent's: it is a watch hint that anyone may write.
func (n Node) OwnsPVC(pvc *corev1.PersistentVolumeClaim) bool {
	return pvc.Annotations[AnnSelectedNode] == n.Name && n.Name != ""
}

// OwnsPV: the PV's required node affinity is a single term with a single
// expression naming only this node, and the PV is a CSI PV of a served
// driver or a local PV of a served provisioner. Like OwnsPVC, the label
// plays no part.
func (n Node) OwnsPV(pv *corev1.PersistentVolume) bool {
	switch {
	case pv.Spec.CSI != nil:
		if !slices.Contains(n.Drivers, pv.Spec.CSI.Driver) {
			return false
		}
	case pv.Spec.Local != nil:
		if by, ok := pv.Annotations[AnnProvisionedBy]; !ok || !slices.Contains(n.Provisioners, by) {
			return false
		}
	default:
		return false
	}
	node, ok := affinityNode(pv)
	return ok && node == n.Name
}

// Classify says whether a PVC or PV is this node's, and whether it is an
// open request of this node: a PVC "creating", a PV "deleting". Any other
// object is neither.
func (n Node) Classify(obj any) (owned, open bool) {
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		owned = n.OwnsPVC(o)
		return owned, owned && o.Annotations[AnnLifecycle] == StateCreating
	case *corev1.PersistentVolume:
		owned = n.OwnsPV(o)
		return owned, owned && o.Annotations[AnnLifecycle] == StateDeleting
	}
	return false, false
}

// Misdirected reports an open request labelled for this node that this node
// does not own: the label and the owner disagree, and the agent only warns.
// (In labelled or hybrid mode such a request may be seen by no other agent.)
func (n Node) Misdirected(obj any) bool {
	var labels, ann map[string]string
	var pending string
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		labels, ann, pending = o.Labels, o.Annotations, StateCreating
	case *corev1.PersistentVolume:
		labels, ann, pending = o.Labels, o.Annotations, StateDeleting
	default:
		return false
	}
	if ann[AnnLifecycle] != pending || !n.labelled(labels) {
		return false
	}
	owned, _ := n.Classify(obj)
	return !owned
}

// affinityNode is the node a PV's required node affinity names, when it is a
// single term with a single "In" expression of a single value.
func affinityNode(pv *corev1.PersistentVolume) (string, bool) {
	na := pv.Spec.NodeAffinity
	if na == nil || na.Required == nil || len(na.Required.NodeSelectorTerms) != 1 {
		return "", false
	}
	term := na.Required.NodeSelectorTerms[0]
	if len(term.MatchExpressions) != 1 || len(term.MatchFields) != 0 {
		return "", false
	}
	e := term.MatchExpressions[0]
	if e.Operator != corev1.NodeSelectorOpIn || len(e.Values) != 1 {
		return "", false
	}
	return e.Values[0], true
}

func (n Node) labelled(labels map[string]string) bool {
	v, ok := labels[LabelNode]
	return ok && v == NodeLabelValue(n.Name)
}
