package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lvm-agent/lvm-agent/kube/apiclient"
)

// AnnNodeLost is written by the provisioner's leader on a claim it keeps
// although its node is lost (onNodeLoss: keep, or a claim no StatefulSet
// made), and on a PV of a lost node whose delete it finishes without the
// node's agent: "<node>: <reason>". `lvm-agent volume status` shows such a
// claim NODE-LOST. It is not a protocol key: no agent reads it.
const AnnNodeLost = "lvm-agent.io/node-lost"

// NodeLostValue is AnnNodeLost's value for a node lost for reason.
func NodeLostValue(node, reason string) string { return node + ": " + reason }

// MarkClaimNodeLost writes AnnNodeLost on a claim, conditional on the
// resourceVersion it was read at: a merge patch of that one key.
func MarkClaimNodeLost(ctx context.Context, c apiclient.Interface, pvc *corev1.PersistentVolumeClaim, value string) error {
	_, err := UpdatePvcWithAnnotations(ctx, c, pvc.Namespace, pvc.Name, pvc.ResourceVersion, Set(map[string]string{AnnNodeLost: value}), nil)
	return err
}

// ClearClaimNodeLost removes AnnNodeLost from a claim whose node is back,
// conditional on the resourceVersion it was read at.
func ClearClaimNodeLost(ctx context.Context, c apiclient.Interface, pvc *corev1.PersistentVolumeClaim) error {
	_, err := UpdatePvcWithAnnotations(ctx, c, pvc.Namespace, pvc.Name, pvc.ResourceVersion, Change{}.Remove(AnnNodeLost), nil)
	return err
}

// MarkPVNodeLost writes AnnNodeLost on a PV, conditional on the
// resourceVersion it was read at. The write is also what makes the
// provisioner library look at the PV again at once, so that a delete
// waiting for the lost node's agent is finished without it.
func MarkPVNodeLost(ctx context.Context, c apiclient.Interface, pv *corev1.PersistentVolume, value string) error {
	_, err := UpdatePvWithAnnotations(ctx, c, pv.Name, pv.ResourceVersion, Set(map[string]string{AnnNodeLost: value}), nil)
	return err
}

// SendBackToScheduler removes selected-node from an unbound claim (and the
// volume.node label of its request, so that the lost node's agent, if it
// ever comes back, does not see the request as its own), conditional on
// the resourceVersion it was read at. It is the hand-shake
// sig-storage-lib-external-provisioner uses for a node without room: the
// scheduler then picks a node again for the claim's Pod.
func SendBackToScheduler(ctx context.Context, c apiclient.Interface, pvc *corev1.PersistentVolumeClaim) error {
	var labels Change
	if _, ok := pvc.Labels[LabelNode]; ok {
		labels = Change{}.Remove(LabelNode)
	}
	_, err := UpdatePvcWithAnnotations(ctx, c, pvc.Namespace, pvc.Name, pvc.ResourceVersion, Change{}.Remove(AnnSelectedNode), labels)
	return err
}

// DeleteLostClaim deletes a claim, on the condition that it is still the
// claim (UID) and the version that was decided on: a claim changed since
// is looked at again rather than deleted.
func DeleteLostClaim(ctx context.Context, c apiclient.Interface, pvc *corev1.PersistentVolumeClaim) error {
	uid, rv := pvc.UID, pvc.ResourceVersion
	err := c.PVCs(pvc.Namespace).Delete(ctx, pvc.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	if err != nil {
		return fmt.Errorf("delete PVC %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	return nil
}
