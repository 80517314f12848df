// Package provisioning runs lvm-agent's provisioner end to end: a real etcd,
// kube-apiserver, kube-scheduler and kube-controller-manager, the real
// `lvm-agent` (one per node, each with the fake lvmd on a socket) and the
// real `lvm-agent provisioner`. Pods with claims are scheduled by the real
// scheduler and their claims bound by the real PV controller. It has a
// control plane of its own: the PV controller would bind the hand-made PVs
// of the other integration tests.
package provisioning

import (
	"context"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

const namespace = "lvm-agent" // the provisioner's

var (
	cluster  *harness.Cluster
	agentBin string
	// small has a 1 GiB volume group and the most CPU and memory (the
	// scheduler's scoring prefers it); big has 100 GiB.
	small, big *node
	prov       *harness.Process
	provHealth string
	// mainTB owns what outlives one test, such as a restarted provisioner.
	mainTB *harness.ProgramTB
)

// node is a Node object with a real agent and its fake lvmd.
type node struct {
	name  string
	lvm   *lvmdfake.LVM
	agent *harness.Process
}

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	tb := &harness.ProgramTB{Log: os.Stderr}
	defer tb.Close()
	mainTB = tb
	agentBin = harness.AgentBinary(tb, tb.TempDir())
	cluster = harness.StartCluster(tb, 2*time.Minute)
	ctx := context.Background()
	if _, err := cluster.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("%v", err)
	}
	createCSIDriver(tb)
	small = startNode(tb, "small", 1<<30, "64", "256Gi")
	big = startNode(tb, "big", 100<<30, "4", "8Gi")
	prov = startProvisioner(tb)
	return m.Run()
}

// createCSIDriver is deploy/base's CSIDriver object: with storageCapacity,
// the scheduler reads the provisioner's CSIStorageCapacity objects.
func createCSIDriver(t harness.TB) {
	_, err := cluster.Client.StorageV1().CSIDrivers().Create(context.Background(), &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: kube.DefaultProvisioner},
		Spec:       storagev1.CSIDriverSpec{AttachRequired: ptr(false), PodInfoOnMount: ptr(false), StorageCapacity: ptr(true)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("CSIDriver: %v", err)
	}
}

func startNode(t harness.TB, name string, vgBytes uint64, cpu, memory string) *node {
	return startNodeNamed(t, name, name, vgBytes, cpu, memory)
}

// startNodeNamed is startNode for a Node whose kubernetes.io/hostname label
// is hostname (kubelet's --hostname-override makes such Nodes).
func startNodeNamed(t harness.TB, name, hostname string, vgBytes uint64, cpu, memory string) *node {
	n0 := harness.ReadyNode(t, cluster.ControlPlane, name, cpu, memory)
	if hostname != name {
		n0.Labels[corev1.LabelHostname] = hostname
		if _, err := cluster.Client.CoreV1().Nodes().Update(context.Background(), n0, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("node %s: %v", name, err)
		}
	}
	n := &node{name: name, lvm: lvmdfake.NewLVM(lvmdfake.Class{Name: "vg1", SizeBytes: vgBytes})}
	_, socket := harness.ServeLVMD(t, n.lvm)
	n.agent = harness.StartAgent(t, agentBin, "--node-name", name, "--kubeconfig", cluster.Kubeconfig, "--lvmd-socket", socket,
		"--metrics-address", "", "--v", "2")
	return n
}

// startProvisioner starts a provisioner; provHealth is the health address
// of the last one started.
func startProvisioner(t harness.TB, extra ...string) *harness.Process {
	provHealth = harness.FreeAddr(t)
	args := append([]string{"provisioner", "--kubeconfig", cluster.Kubeconfig, "--namespace", namespace, "--metrics-port", "0",
		"--health-address", provHealth,
		"--timeout", "20s", "--leader-election-lease-duration", "4s", "--leader-election-renew-deadline", "3s", "--v", "2"}, extra...)
	return harness.StartAgent(t, agentBin, args...)
}

func ptr[T any](v T) *T { return &v }
