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
	// The label is a watch hint: it never makes an agent the owner.
	assert.False(t, n.OwnsPVC(pvc(nil, map[string]string{LabelNode: "node-a"})))
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
	assert.False(t, n.OwnsPV(labelled), "a label without affinity")
	mislabelled := pv(DefaultDriver, term(corev1.NodeSelectorOpIn, "node-b"))
	mislabelled.Labels = map[string]string{LabelNode: "node-a"}
	assert.False(t, n.OwnsPV(mislabelled), "the label must not override the affinity")
	hostPath := pv("", term(corev1.NodeSelectorOpIn, "node-a"))
	hostPath.Spec.HostPath = &corev1.HostPathVolumeSource{Path: "/data"}
	hostPath.Labels = map[string]string{LabelNode: "node-a"}
	assert.False(t, n.OwnsPV(hostPath), "a hostPath PV is never ours")

	// The provisioner helper labels a PV for the node affinityNode names: a
	// NotIn must never label (and so hand the PV to) the node it excludes.
	node, ok := affinityNode(pv(DefaultDriver, term(corev1.NodeSelectorOpIn, "node-a")))
	assert.True(t, ok)
	assert.Equal(t, "node-a", node)
	_, ok = affinityNode(pv(DefaultDriver, term(corev1.NodeSelectorOpNotIn, "node-a")))
	assert.False(t, ok, "NotIn")
}

func TestOwnsLocalPV(t *testing.T) {
	n := Node{Name: "node-a", Drivers: []string{DefaultDriver}, Provisioners: []string{DefaultProvisioner}}
	local := func(by, node string) *corev1.PersistentVolume {
		p := &corev1.PersistentVolume{}
		p.Spec.Local = &corev1.LocalVolumeSource{Path: "/dev/vg0/pvc-1"}
		if by != "" {
			p.Annotations = map[string]string{AnnProvisionedBy: by}
		}
		p.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}}
		return p
	}
	assert.True(t, n.OwnsPV(local(DefaultProvisioner, "node-a")))
	assert.False(t, n.OwnsPV(local(DefaultProvisioner, "node-b")), "another node")
	assert.False(t, n.OwnsPV(local("kubernetes.io/no-provisioner", "node-a")), "a local PV of another provisioner")
	assert.False(t, n.OwnsPV(local("", "node-a")), "a static local PV")
	assert.False(t, Node{Name: "node-a"}.OwnsPV(local(DefaultProvisioner, "node-a")), "provisioner not served")
}

func TestMisdirected(t *testing.T) {
	n := Node{Name: "node-a", Drivers: []string{DefaultDriver}}
	pvc := func(state, selected, label string) *corev1.PersistentVolumeClaim {
		p := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnLifecycle: state}}}
		if selected != "" {
			p.Annotations[AnnSelectedNode] = selected
		}
		if label != "" {
			p.Labels = map[string]string{LabelNode: label}
		}
		return p
	}
	for _, c := range []struct {
		name string
		pvc  *corev1.PersistentVolumeClaim
		want bool
	}{
		{"labelled here, selected elsewhere", pvc(StateCreating, "node-b", "node-a"), true},
		{"labelled here, no selected node", pvc(StateCreating, "", "node-a"), true},
		{"ours", pvc(StateCreating, "node-a", "node-a"), false},
		{"labelled elsewhere", pvc(StateCreating, "node-a", "node-b"), false},
		{"answered", pvc(StateFailed, "node-b", "node-a"), false},
	} {
		assert.Equal(t, c.want, n.Misdirected(c.pvc), c.name)
	}
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{
		Labels: map[string]string{LabelNode: "node-a"}, Annotations: map[string]string{AnnLifecycle: StateDeleting}}}
	pv.Spec.HostPath = &corev1.HostPathVolumeSource{Path: "/data"}
	assert.True(t, n.Misdirected(pv), "a labelled hostPath PV")
	assert.False(t, n.Misdirected(&corev1.Pod{}))
}
