// Package integration runs the real lvm-agent binary against a real etcd +
// kube-apiserver, with the fake lvmd (topolvm's real wire protocol and error
// semantics) on a unix socket in the test process.
package integration

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

var (
	cp       *harness.ControlPlane
	agentBin string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// A failure here panics and aborts the run.
	tb := &harness.ProgramTB{Log: os.Stderr}
	defer tb.Close()
	agentBin = harness.AgentBinary(tb, tb.TempDir())
	cp = harness.StartControlPlane(tb, 2*time.Minute)
	return m.Run()
}

// node is one agent under test with its own fake lvmd.
type node struct {
	name   string
	lvm    *lvmdfake.LVM
	lvmd   *lvmdfake.Topolvm
	socket string
	args   []string
	agent  *harness.Process
}

// startNode starts a fake lvmd (a 1 GiB thick class "vg1" and a thin class
// "thin") and an agent for a node named after the test.
func startNode(t *testing.T, extraArgs ...string) *node {
	t.Helper()
	n := &node{name: "node-" + sanitize(t.Name())}
	n.lvm = lvmdfake.NewLVM(lvmdfake.Class{Name: "vg1", SizeBytes: 1 << 30},
		lvmdfake.Class{Name: "thin", VG: "vg1", SizeBytes: 1 << 30, Thin: true, Overprovision: 2})
	n.lvmd, n.socket = harness.ServeLVMD(t, n.lvm)
	n.args = append([]string{"--node-name", n.name, "--kubeconfig", cp.Kubeconfig, "--lvmd-socket", n.socket,
		"--metrics-address", "", "--v", "2"}, extraArgs...)
	n.start(t)
	return n
}

func (n *node) start(t *testing.T) { n.agent = harness.StartAgent(t, agentBin, n.args...) }

// create makes a PVC on this node and requests a volume for it through the
// provisioner helper, which watches for the answer.
func (n *node) create(t *testing.T, ns, pvc string, spec kube.CreateSpec) error {
	t.Helper()
	harness.PVC(t, cp.Client, ns, pvc, n.name)
	return n.request(t, ns, pvc, spec)
}

func (n *node) request(t *testing.T, ns, pvc string, spec kube.CreateSpec) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return kube.CreateVolumeWithAnnotations(ctx, clientset.Wrap(cp.Client), ns, pvc, spec, nil)
}

func (n *node) lvs(t *testing.T, class string) []lvmdfake.LV {
	t.Helper()
	lvs, err := n.lvm.List(class)
	require.NoError(t, err)
	return lvs
}

func spec(name string, size string) kube.CreateSpec {
	q := resource.MustParse(size)
	return kube.CreateSpec{VolumeGroup: "vg1", Name: name, Size: q.Value()}
}

func pvcAnnotations(t *testing.T, ns, name string) map[string]string {
	t.Helper()
	pvc, err := cp.Client.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return pvc.Annotations
}

// rawRequest makes a PVC on node and writes a create request with spec as
// it is (kube.CreateVolumeWithAnnotations takes only a valid CreateSpec,
// and waits for the answer), with the node label when labelled.
func rawRequest(t *testing.T, c kubernetes.Interface, ns, pvc, node, spec string, labelled bool) {
	t.Helper()
	harness.PVC(t, c, ns, pvc, node)
	var labels kube.Change
	if labelled {
		labels = kube.Set(map[string]string{kube.LabelNode: kube.NodeLabelValue(node)})
	}
	_, err := kube.UpdatePvcWithAnnotations(context.Background(), clientset.Wrap(c), ns, pvc, "",
		kube.Set(map[string]string{kube.AnnLifecycle: kube.StateCreating, kube.AnnSpec: spec}), labels)
	require.NoError(t, err)
}

func sanitize(s string) string {
	out := []byte{}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			out = append(out, c)
		case c >= 'A' && c <= 'Z':
			out = append(out, c+'a'-'A')
		default:
			out = append(out, '-')
		}
	}
	return string(out)
}
