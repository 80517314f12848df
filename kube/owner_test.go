package kube

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestOwnsPVC(t *testing.T) {
	n := Node{Name: "node-a", Drivers: []string{DefaultDriver}}
	pvc := func(ann, labels map[string]string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Annotations: ann, Labels: labels}}
	}
	assert.True(t, n.OwnsPVC(pvc(map[string]string{AnnSelectedNode: "node-a"}, nil)))
	assert.False(t, n.OwnsPVC(pvc(map[string]string{AnnSelectedNode: "node-b"}, nil)))
	assert.False(t, n.OwnsPVC(pvc(nil, nil)))
	assert.True(t, n.OwnsPVC(pvc(nil, map[string]string{LabelNode: "node-a"})))
	// The scheduler's choice wins over a label that disagrees: two agents must never both act.
	assert.False(t, n.OwnsPVC(pvc(map[string]string{AnnSelectedNode: "node-b"}, map[string]string{LabelNode: "node-a"})))
}

func TestOwnsPV(t *testing.T) {
	n := Node{Name: "node-a", Drivers: []string{DefaultDriver}}
	pv := func(driver string, terms ...corev1.NodeSelectorTerm) *corev1.PersistentVolume {
		p := &corev1.PersistentVolume{}
		if driver != "" {
			p.Spec.CSI = &corev1.CSIPersistentVolumeSource{Driver: driver}
		}
		if terms != nil {
			p.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: terms}}
		}
		return p
	}
	term := func(op corev1.NodeSelectorOperator, values ...string) corev1.NodeSelectorTerm {
		return corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: op, Values: values}}}
	}
	assert.True(t, n.OwnsPV(pv(DefaultDriver, term(corev1.NodeSelectorOpIn, "node-a"))))
	assert.False(t, n.OwnsPV(pv("other.csi", term(corev1.NodeSelectorOpIn, "node-a"))), "other driver")
	assert.False(t, n.OwnsPV(pv(DefaultDriver, term(corev1.NodeSelectorOpIn, "node-b"))))
	assert.False(t, n.OwnsPV(pv(DefaultDriver, term(corev1.NodeSelectorOpIn, "node-a", "node-b"))), "several nodes")
	assert.False(t, n.OwnsPV(pv(DefaultDriver, term(corev1.NodeSelectorOpNotIn, "node-a"))))
	assert.False(t, n.OwnsPV(pv(DefaultDriver, term(corev1.NodeSelectorOpIn, "node-a"), term(corev1.NodeSelectorOpIn, "node-a"))), "two terms")
	assert.False(t, n.OwnsPV(pv(DefaultDriver)), "no affinity")
	labelled := pv("")
	labelled.Labels = map[string]string{LabelNode: "node-a"}
	assert.True(t, n.OwnsPV(labelled))

	// The provisioner helper labels a PV for the node affinityNode names: a
	// NotIn must never label (and so hand the PV to) the node it excludes.
	node, ok := affinityNode(pv(DefaultDriver, term(corev1.NodeSelectorOpIn, "node-a")))
	assert.True(t, ok)
	assert.Equal(t, "node-a", node)
	_, ok = affinityNode(pv(DefaultDriver, term(corev1.NodeSelectorOpNotIn, "node-a")))
	assert.False(t, ok, "NotIn")
}
