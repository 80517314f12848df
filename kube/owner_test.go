package kube

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
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
	// A CSI PV's key is its driver's topology key, whose value is the node name.
	renamed := Node{Name: "node-a", Hostname: "host-a", Drivers: []string{DefaultDriver}}
	assert.True(t, renamed.OwnsPV(pv(DefaultDriver, term(corev1.NodeSelectorOpIn, "node-a"))), "CSI: the node name, whatever the hostname label")
	assert.False(t, renamed.OwnsPV(pv(DefaultDriver, term(corev1.NodeSelectorOpIn, "host-a"))), "CSI: not the hostname label")
	noKey := pv(DefaultDriver, term(corev1.NodeSelectorOpIn, "node-a"))
	noKey.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Key = ""
	assert.False(t, n.OwnsPV(noKey), "an expression without a key")
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
	key, node, ok := affinityNode(pv(DefaultDriver, term(corev1.NodeSelectorOpIn, "node-a")))
	assert.True(t, ok)
	assert.Equal(t, "node-a", node)
	assert.Equal(t, corev1.LabelHostname, key)
	_, _, ok = affinityNode(pv(DefaultDriver, term(corev1.NodeSelectorOpNotIn, "node-a")))
	assert.False(t, ok, "NotIn")
}

func TestOwnsLocalPV(t *testing.T) {
	n := Node{Name: "node-a", Drivers: []string{DefaultDriver}, Provisioners: []string{DefaultProvisioner}}
	// Its Node's kubernetes.io/hostname label is not its name.
	renamed := n
	renamed.Hostname = "host-a"
	local := func(by, key, value string) *corev1.PersistentVolume {
		p := &corev1.PersistentVolume{}
		p.Spec.Local = &corev1.LocalVolumeSource{Path: "/dev/vg0/pvc-1"}
		if by != "" {
			p.Annotations = map[string]string{AnnProvisionedBy: by}
		}
		p.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{value}}}}}}}
		return p
	}
	const host = corev1.LabelHostname
	for _, c := range []struct {
		name string
		node Node
		pv   *corev1.PersistentVolume
		want bool
	}{
		{"ours", n, local(DefaultProvisioner, host, "node-a"), true},
		{"another node", n, local(DefaultProvisioner, host, "node-b"), false},
		{"a local PV of another provisioner", n, local("kubernetes.io/no-provisioner", host, "node-a"), false},
		{"a static local PV", n, local("", host, "node-a"), false},
		{"provisioner not served", Node{Name: "node-a"}, local(DefaultProvisioner, host, "node-a"), false},
		{"another key naming this node", n, local(DefaultProvisioner, "example.com/rack", "node-a"), false},
		{"hostname label differs from the name: its value", renamed, local(DefaultProvisioner, host, "host-a"), true},
		// The name is another Node's hostname then; matching it too would make two owners.
		{"hostname label differs from the name: the name", renamed, local(DefaultProvisioner, host, "node-a"), false},
		{"hostname label differs, another key with its value", renamed, local(DefaultProvisioner, "example.com/rack", "host-a"), false},
	} {
		assert.Equal(t, c.want, c.node.OwnsPV(c.pv), c.name)
	}
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

func TestNodeHostname(t *testing.T) {
	c := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{corev1.LabelHostname: "host-a"}}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}})
	got, err := NodeHostname(context.Background(), clientset.Wrap(c), "node-a")
	require.NoError(t, err)
	assert.Equal(t, "host-a", got)
	got, err = NodeHostname(context.Background(), clientset.Wrap(c), "node-b")
	require.NoError(t, err)
	assert.Empty(t, got, "no label")
	_, err = NodeHostname(context.Background(), clientset.Wrap(c), "node-c")
	assert.True(t, apierrors.IsNotFound(err), "a missing Node is not retried: %v", err)
}
