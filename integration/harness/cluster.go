package harness

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Cluster is a control plane with the real kube-scheduler and
// kube-controller-manager (its PV binder, the expander that hands a growing
// local PV's claim to an external resizer, and the protection controllers):
// Pods are scheduled, claims are bound, and deleted objects lose their
// protection finalizers, as in a cluster. There is no kubelet: a scheduled
// Pod stays Pending on its node.
type Cluster struct {
	*ControlPlane
	Scheduler, ControllerManager *Process
}

// StartCluster starts etcd, kube-apiserver, kube-scheduler and
// kube-controller-manager from $KUBEBUILDER_ASSETS (scripts/kube-assets.sh
// kube-scheduler kube-controller-manager builds all four there).
func StartCluster(t TB, startTimeout time.Duration) *Cluster {
	return StartClusterWith(t, startTimeout, ClusterOptions{})
}

// ClusterOptions adds to StartCluster's kube-controller-manager.
type ClusterOptions struct {
	// Controllers run beside the PV ones (e.g. statefulset-controller).
	Controllers []string
	// ControllerManagerArgs are more of its flags.
	ControllerManagerArgs []string
}

// StartClusterWith is StartCluster with more of kube-controller-manager.
func StartClusterWith(t TB, startTimeout time.Duration, o ClusterOptions) *Cluster {
	t.Helper()
	cp := StartControlPlane(t, startTimeout)
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	bin := func(name string) string {
		p := filepath.Join(assets, name)
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s not in KUBEBUILDER_ASSETS (%s): run scripts/kube-assets.sh kube-scheduler kube-controller-manager: %v", name, assets, err)
		}
		return p
	}
	c := &Cluster{ControlPlane: cp}
	// No serving ports (nothing scrapes them here) and no leader election
	// (one of each).
	c.Scheduler = StartAgent(t, bin("kube-scheduler"), "--kubeconfig", cp.Kubeconfig,
		"--authentication-kubeconfig", cp.Kubeconfig, "--authorization-kubeconfig", cp.Kubeconfig,
		"--secure-port", "0", "--leader-elect=false", "--v", "2")
	c.ControllerManager = StartAgent(t, bin("kube-controller-manager"), append([]string{"--kubeconfig", cp.Kubeconfig,
		"--secure-port", "0", "--leader-elect=false", "--use-service-account-credentials=false",
		"--controllers", strings.Join(append([]string{"persistentvolume-binder-controller", "persistentvolume-expander-controller",
			"persistentvolume-protection-controller", "persistentvolumeclaim-protection-controller"}, o.Controllers...), ","),
		"--v", "2"}, o.ControllerManagerArgs...)...)
	return c
}

// ReadyNode registers a Ready, schedulable Node as a kubelet would, with
// the given allocatable CPU and memory (the scheduler prefers the node with
// more left) and its hostname label.
func ReadyNode(t TB, c *ControlPlane, name, cpu, memory string) *corev1.Node {
	t.Helper()
	ctx := context.Background()
	n, err := c.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{"kubernetes.io/hostname": name}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory),
		corev1.ResourcePods: resource.MustParse("110")}
	n.Status = corev1.NodeStatus{Capacity: res, Allocatable: res, Phase: corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}}
	n, err = c.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("node %s status: %v", name, err)
	}
	// The API server taints a new Node not-ready; the node lifecycle
	// controller would lift it once the Node reports Ready.
	n.Spec.Taints = nil
	n, err = c.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("node %s taints: %v", name, err)
	}
	return n
}
