package harness

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// PV creates a CSI PV of driver pinned to node by node affinity, bound to
// claim when not nil.
func PV(t TB, c kubernetes.Interface, name, node, driver string, claim *corev1.PersistentVolumeClaim) *corev1.PersistentVolume {
	t.Helper()
	pv := NewPV(name, node, driver, nil, "")
	if claim != nil {
		pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID}
	}
	out, err := c.CoreV1().PersistentVolumes().Create(context.Background(), pv, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create PV %s: %v", name, err)
	}
	return out
}

// DeleteClaim deletes a PVC and waits until the API server no longer has it
// (see RemoveClaim), or fails the test.
func DeleteClaim(t TB, c kubernetes.Interface, pvc *corev1.PersistentVolumeClaim) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := RemoveClaim(ctx, c, pvc.Namespace, pvc.Name, pvc.UID); err != nil {
		t.Fatalf("%v", err)
	}
}

// RemoveClaim deletes the PVC of that UID and waits until the API server no
// longer has it: what a cluster does before a PV is released and its delete
// asked (the agent refuses the delete of a PV whose claim still exists). The
// API server adds the pvc-protection finalizer to every PVC; with no
// controller to drop it once no pod uses the claim, RemoveClaim drops it.
func RemoveClaim(ctx context.Context, c kubernetes.Interface, ns, name string, uid types.UID) error {
	pvcs := c.CoreV1().PersistentVolumeClaims(ns)
	if err := pvcs.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete PVC %s/%s: %w", ns, name, err)
	}
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		got, err := pvcs.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || err == nil && got.UID != uid {
			return true, nil
		}
		if err == nil && len(got.Finalizers) > 0 {
			_, _ = pvcs.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("PVC %s/%s still exists: %w", ns, name, err)
	}
	return nil
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

// HostClass is a StorageClass's parameters for the host's agents, which
// cannot write block devices (the host has no device-mapper): their Nodes
// say no "wipe", so a class that asks for zeroed volumes (the default) is
// made nowhere; wipe: none unless params says otherwise.
func HostClass(params map[string]string) map[string]string {
	out := map[string]string{"wipe": "none"}
	for k, v := range params {
		out[k] = v
	}
	return out
}
