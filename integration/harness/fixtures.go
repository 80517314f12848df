package harness

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// PVC creates a PVC whose selected node is node (a scheduler's choice).
func PVC(t TB, c kubernetes.Interface, ns, name, node string) *corev1.PersistentVolumeClaim {
	t.Helper()
	ctx := context.Background()
	if _, err := c.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
		_, _ = c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	}
	pvc := NewPVC(ns, name, node)
	out, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create PVC %s/%s: %v", ns, name, err)
	}
	return out
}

// PV creates a CSI PV of driver pinned to node by node affinity, bound to claimUID when not empty.
func PV(t TB, c kubernetes.Interface, name, node, driver string, claimUID types.UID) *corev1.PersistentVolume {
	t.Helper()
	pv := NewPV(name, node, driver, nil, "")
	if claimUID != "" {
		pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "default", Name: "claim", UID: claimUID}
	}
	out, err := c.CoreV1().PersistentVolumes().Create(context.Background(), pv, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create PV %s: %v", name, err)
	}
	return out
}

// WaitFor polls get until cond holds or timeout passes, and returns the
// annotations last seen. Tests use the provisioner helpers (which watch) for
// the protocol itself; this is for checks on objects they did not write.
func WaitFor(t TB, timeout time.Duration, get func(context.Context) (metav1.Object, error), cond func(map[string]string) bool) map[string]string {
	t.Helper()
	var last map[string]string
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		o, err := get(ctx)
		if err != nil {
			return false, nil
		}
		last = o.GetAnnotations()
		return cond(last), nil
	})
	if err != nil {
		t.Fatalf("condition not reached in %v; annotations: %v", timeout, last)
	}
	return last
}
