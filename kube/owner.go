package kube

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// Node identifies one agent: its node name and the CSI drivers whose PVs it serves.
type Node struct {
	Name    string
	Drivers []string
}

// OwnsPVC: the PVC's selected-node is this node, or its volume.node label names it.
func (n Node) OwnsPVC(pvc *corev1.PersistentVolumeClaim) bool {
	if sel, ok := pvc.Annotations[AnnSelectedNode]; ok {
		return sel == n.Name
	}
	return n.labelled(pvc.Labels)
}

// OwnsPV: the PV belongs to one of our drivers and its required node affinity
// is a single term with a single expression naming only this node, or its
// volume.node label names this node.
func (n Node) OwnsPV(pv *corev1.PersistentVolume) bool {
	if n.labelled(pv.Labels) {
		return true
	}
	if pv.Spec.CSI == nil || !slices.Contains(n.Drivers, pv.Spec.CSI.Driver) {
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
