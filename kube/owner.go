package kube

import (
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
	if pv.Spec.CSI == nil || !n.serves(pv.Spec.CSI.Driver) {
		return false
	}
	na := pv.Spec.NodeAffinity
	if na == nil || na.Required == nil || len(na.Required.NodeSelectorTerms) != 1 {
		return false
	}
	term := na.Required.NodeSelectorTerms[0]
	if len(term.MatchExpressions) != 1 || len(term.MatchFields) != 0 {
		return false
	}
	e := term.MatchExpressions[0]
	return e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 && e.Values[0] == n.Name
}

func (n Node) labelled(labels map[string]string) bool {
	v, ok := labels[LabelNode]
	return ok && v == NodeLabelValue(n.Name)
}

func (n Node) serves(driver string) bool {
	for _, d := range n.Drivers {
		if d == driver {
			return true
		}
	}
	return false
}
