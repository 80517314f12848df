// Package nodeloss runs the provisioner's node-loss controller (issue 44)
// end to end: a real etcd, kube-apiserver, kube-scheduler and
// kube-controller-manager with its StatefulSet, pod-GC and taint-eviction
// controllers, the real `lvm-agent` on each node (with the fake lvmd) and
// the real `lvm-agent provisioner` with a short --node-loss-grace. Each
// scenario has its own pair of nodes, so the scenarios run side by side on
// one cluster. There is no kubelet: a scheduled Pod stays Pending on its
// node, and a lost node's Pods go the way the control plane sends them
// (taint eviction and pod GC).
package nodeloss

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

const (
	namespace = "lvm-agent" // the provisioner's
	// grace is the provisioner's --node-loss-grace here: short, so that a
	// deleted node is lost within the test's time.
	grace = 4 * time.Second
)

var (
	cluster  *harness.Cluster
	agentBin string
	prov     *harness.Process
	// provMetrics is the provisioner's --metrics-port address.
	provMetrics string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	tb := &harness.ProgramTB{Log: os.Stderr}
	defer tb.Close()
	agentBin = harness.AgentBinary(tb, tb.TempDir())
	// The node lifecycle controller gives the Pod informer the index by node
	// that taint eviction reads (without it, a tainted node's Pods are
	// evicted only when they change); with no kubelet to renew the Nodes'
	// heartbeats, its grace is long enough never to mark one unhealthy.
	cluster = harness.StartClusterWith(tb, 2*time.Minute, harness.ClusterOptions{
		Controllers:           []string{"statefulset-controller", "pod-garbage-collector-controller", "taint-eviction-controller", "node-lifecycle-controller"},
		ControllerManagerArgs: []string{"--node-monitor-grace-period", "1h", "--node-startup-grace-period", "1h"},
	})
	ctx := context.Background()
	if _, err := cluster.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("%v", err)
	}
	// deploy/base's CSIDriver: the scheduler reads the capacity objects.
	if _, err := cluster.Client.StorageV1().CSIDrivers().Create(ctx, &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: kube.DefaultProvisioner},
		Spec:       storagev1.CSIDriverSpec{AttachRequired: ptr(false), PodInfoOnMount: ptr(false), StorageCapacity: ptr(true)},
	}, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("CSIDriver: %v", err)
	}
	provMetrics = harness.FreeAddr(tb)
	_, port, _ := strings.Cut(provMetrics, ":")
	if _, err := strconv.Atoi(port); err != nil {
		tb.Fatalf("metrics address %s", provMetrics)
	}
	prov = harness.StartAgent(tb, agentBin, "provisioner", "--kubeconfig", cluster.Kubeconfig, "--namespace", namespace,
		"--metrics-port", port, "--health-address", "", "--timeout", "20s",
		"--leader-election-lease-duration", "4s", "--leader-election-renew-deadline", "3s",
		// Its node-loss decisions logged, each (nodeloss_controller.go's V(4)):
		// the NotLost scenario waits for the one on its node.
		"--node-loss-grace", grace.String(), "--v", "2", "--vmodule", "nodeloss_controller=4")
	return m.Run()
}

// node is a Node object with a real agent and its fake lvmd, which
// outlives the agent (a node's disks outlive its processes).
type node struct {
	name, socket string
	lvm          *lvmdfake.LVM
	agent        *harness.Process
}

// pairLabel puts a scenario's two nodes apart from the others' for its Pods.
const pairLabel = "nodeloss.lvm-agent.io/pair"

func startNode(t *testing.T, name, pair string) *node {
	t.Helper()
	registerNode(t, name, pair)
	n := &node{name: name, lvm: lvmdfake.NewLVM(lvmdfake.Class{Name: "vg1", SizeBytes: 100 << 30})}
	_, n.socket = harness.ServeLVMD(t, n.lvm)
	n.startAgent(t)
	return n
}

// waitCapacity waits for the provisioner's CSIStorageCapacity of each of
// the nodes and classes: without one, the scheduler leaves a node out, and
// a Pod's placement would depend on which object came first.
func waitCapacity(t *testing.T, nodes []string, classes ...string) {
	t.Helper()
	for _, n := range nodes {
		for _, class := range classes {
			waitFor(t, "CSIStorageCapacity of "+n+" and "+class, func() bool {
				list, err := cluster.Client.StorageV1().CSIStorageCapacities(namespace).List(context.Background(), metav1.ListOptions{})
				if err != nil {
					return false
				}
				for _, c := range list.Items {
					if c.StorageClassName == class && c.NodeTopology != nil && c.NodeTopology.MatchLabels[corev1.LabelHostname] == n &&
						c.Capacity != nil && c.Capacity.Sign() > 0 {
						return true
					}
				}
				return false
			})
		}
	}
}

func (n *node) startAgent(t *testing.T, extra ...string) {
	t.Helper()
	n.agent = harness.StartAgent(t, agentBin, append([]string{"--node-name", n.name, "--kubeconfig", cluster.Kubeconfig,
		"--lvmd-socket", n.socket, "--metrics-address", "", "--v", "2"}, extra...)...)
}

// registerNode registers a Ready Node as a kubelet would, in its pair
// (harness.ReadyNode's steps, each retried: the node lifecycle controller
// writes a new Node too).
func registerNode(t *testing.T, name, pair string) {
	t.Helper()
	ctx := context.Background()
	nodes := cluster.Client.CoreV1().Nodes()
	_, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{corev1.LabelHostname: name, pairLabel: pair}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods: resource.MustParse("110")}
	update := func(what string, change func(*corev1.Node) error) {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := nodes.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			return change(n)
		})
		if err != nil {
			t.Fatalf("node %s %s: %v", name, what, err)
		}
	}
	update("status", func(n *corev1.Node) error {
		n.Status = corev1.NodeStatus{Capacity: res, Allocatable: res, Phase: corev1.NodeRunning,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}}
		_, err := nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	// The API server taints a new Node not-ready; its Ready status lifts it.
	update("taints", func(n *corev1.Node) error {
		n.Spec.Taints = nil
		_, err := nodes.Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

func ptr[T any](v T) *T { return &v }
