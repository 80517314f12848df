package provisioner

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lvm-agent/lvm-agent/kube"
)

func TestDesiredCapacity(t *testing.T) {
	node := func(name, hostname, topology string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}, Annotations: map[string]string{}}}
		if hostname != "" {
			n.Labels[HostnameLabel] = hostname
		}
		if topology != "" {
			n.Annotations[kube.DefaultCapacityAnnotation] = topology
		}
		return n
	}
	sc := func(name, provisioner, vg string, params ...string) *storagev1.StorageClass {
		p := map[string]string{"volumeGroup": vg}
		for i := 0; i+1 < len(params); i += 2 {
			p[params[i]] = params[i+1]
		}
		return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner, Parameters: p}
	}
	nodes := []*corev1.Node{
		node("small", "small", `[{"type":"lvm","name":"vg0","capacity":1073741824,"free":536870912,"deviceClass":"vg0","wipe":"zero"}]`),
		node("big", "big-host", `[{"type":"lvm","name":"vg0","capacity":107374182400,"free":107374182400,"deviceClass":"vg0","wipe":"zero"},{"type":"lvm","name":"thin","capacity":10,"free":50,"deviceClass":"thin","wipe":"zero"}]`),
		// An agent that cannot zero (unprivileged): only classes with wipe: none.
		node("no-wipe", "no-wipe", `[{"type":"lvm","name":"vg0","capacity":1073741824,"free":1024,"deviceClass":"vg0"}]`),
		node("no-agent", "no-agent", ""),
		node("garbled", "garbled", `not json`),
		node("no-hostname", "", `[{"type":"lvm","name":"vg0","capacity":1,"free":1}]`),
		node("original", "original", `[{"type":"lvm","name":"vg0","capacity":3000}]`),
	}
	classes := []*storagev1.StorageClass{sc("thick", kube.DefaultProvisioner, "vg0"), sc("thin", kube.DefaultProvisioner, "thin"),
		sc("thick-nowipe", kube.DefaultProvisioner, "vg0", "wipe", "none"),
		sc("other", "ebs.csi.aws.com", "vg0"), {ObjectMeta: metav1.ObjectMeta{Name: "broken"}, Provisioner: kube.DefaultProvisioner}}
	got := Desired(kube.DefaultProvisioner, "lvm-agent", kube.DefaultCapacityAnnotation, nodes, classes)
	type row struct {
		class, host string
		free        int64
	}
	var rows []row
	for name, c := range got {
		assert.Equal(t, capacityName(nodeOf(t, nodes, c.NodeTopology.MatchLabels[HostnameLabel]), c.StorageClassName), name)
		assert.Equal(t, "lvm-agent", c.Namespace)
		assert.Equal(t, kube.DefaultProvisioner, c.Labels[LabelProvisioner])
		rows = append(rows, row{c.StorageClassName, c.NodeTopology.MatchLabels[HostnameLabel], c.Capacity.Value()})
	}
	assert.ElementsMatch(t, []row{{"thick", "small", 536870912}, {"thick", "big-host", 107374182400}, {"thin", "big-host", 50},
		{"thick-nowipe", "small", 536870912}, {"thick-nowipe", "big-host", 107374182400},
		{"thick-nowipe", "no-wipe", 1024}, {"thick-nowipe", "original", 3000}}, rows)
}

func nodeOf(t *testing.T, nodes []*corev1.Node, hostname string) string {
	for _, n := range nodes {
		if n.Labels[HostnameLabel] == hostname {
			return n.Name
		}
	}
	require.Fail(t, "no node with hostname "+hostname)
	return ""
}
