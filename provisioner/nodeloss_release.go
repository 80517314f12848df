package provisioner

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/kube"
)

// What the node-loss controller does with each claim and PV of a lost
// node (nodeloss_rule.go says when a node is lost, nodeloss_controller.go
// decides it).

// releaseVolume handles one of our PVs on the lost node: its claim if it
// is bound, or the PV itself if it is released.
func (c *NodeLoss) releaseVolume(ctx context.Context, pv *corev1.PersistentVolume, node, reason string) error {
	if pv.DeletionTimestamp != nil {
		return nil
	}
	if ref := pv.Spec.ClaimRef; ref != nil && pv.Status.Phase == corev1.VolumeBound {
		pvc, err := c.pvcs.PersistentVolumeClaims(ref.Namespace).Get(ref.Name)
		if apierrors.IsNotFound(err) || err == nil && pvc.UID != ref.UID {
			return nil // the PV controller releases it; looked at then
		} else if err != nil {
			return err
		}
		if pvc.DeletionTimestamp != nil {
			return nil
		}
		return c.releaseClaim(ctx, pvc, pv, node, reason)
	}
	if pv.Status.Phase != corev1.VolumeReleased || pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete ||
		pv.Annotations[kube.AnnNodeLost] != "" {
		return nil // Retain keeps the PV; a marked one is the library's to remove
	}
	// Delete finishes a PV so marked without asking the agent.
	if err := kube.MarkPVNodeLost(ctx, c.client, pv, kube.NodeLostValue(node, reason)); err != nil {
		return err
	}
	lv := pv.Annotations[kube.AnnSpec]
	c.recorder.Eventf(pv, corev1.EventTypeWarning, ReasonNodeLost,
		"Node %s is lost (%s): the PV is removed without an answer from its agent. Its LV %s stays on that node's disks; if they come back, the node's orphan collector finds it.", node, reason, lv)
	c.metrics.claims.WithLabelValues("volume-released").Inc()
	klog.InfoS("Node lost: PV released without its agent", "node", node, "reason", reason, "pv", pv.Name, "lv", lv)
	return nil
}

// releaseClaim deletes a StatefulSet's claim of a recreate class, and
// keeps any other, with the event.
func (c *NodeLoss) releaseClaim(ctx context.Context, pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, node, reason string) error {
	value := kube.NodeLostValue(node, reason)
	if pvc.Annotations[kube.AnnNodeLost] == value {
		return nil // kept, and said so, already
	}
	lv := pv.Annotations[kube.AnnSpec]
	onNodeLoss, why := OnNodeLossKeep, "its StorageClass "+pv.Spec.StorageClassName+" cannot be read"
	if class, err := c.classes.Get(pv.Spec.StorageClassName); err == nil {
		if params, err := ParseParams(class.Parameters); err == nil {
			onNodeLoss, why = params.OnNodeLoss, "its StorageClass says onNodeLoss: "+params.OnNodeLoss
		}
	}
	if onNodeLoss == OnNodeLossRecreate {
		sets, err := c.sets.StatefulSets(pvc.Namespace).List(labels.Everything())
		if err != nil {
			return err
		}
		if set := StatefulSetOf(pvc, sets); set != nil {
			c.recorder.Eventf(pvc, corev1.EventTypeWarning, ReasonNodeLost,
				"Node %s is lost (%s): the claim is deleted so that StatefulSet %s makes a new one for its replica on another node. Its LV %s stays on that node's disks (PV %s, reclaim policy %s).",
				node, reason, set.Name, lv, pv.Name, pv.Spec.PersistentVolumeReclaimPolicy)
			if err := kube.DeleteLostClaim(ctx, c.client, pvc); err != nil {
				return err
			}
			c.metrics.claims.WithLabelValues("recreated").Inc()
			klog.InfoS("Node lost: StatefulSet claim deleted for a new one", "node", node, "reason", reason, "pvc", klog.KObj(pvc),
				"statefulSet", set.Name, "pv", pv.Name, "lv", lv, "reclaimPolicy", pv.Spec.PersistentVolumeReclaimPolicy)
			return nil
		}
		why = "no StatefulSet's volumeClaimTemplates made it"
	}
	c.recorder.Eventf(pvc, corev1.EventTypeWarning, ReasonNodeLost,
		"Node %s is lost (%s). The claim is kept (%s); its LV %s was on that node only. To release it: delete the Pods that use it "+
			"(kubectl -n %s delete pod POD --force --grace-period=0, as their node is down), then kubectl -n %s delete pvc %s; "+
			"its PV %s (reclaim policy %s) then goes without that node's agent.",
		node, reason, why, lv, pvc.Namespace, pvc.Namespace, pvc.Name, pv.Name, pv.Spec.PersistentVolumeReclaimPolicy)
	if err := kube.MarkClaimNodeLost(ctx, c.client, pvc, value); err != nil {
		return err
	}
	c.metrics.claims.WithLabelValues("kept").Inc()
	klog.InfoS("Node lost: claim kept", "node", node, "reason", reason, "pvc", klog.KObj(pvc), "why", why, "pv", pv.Name, "lv", lv)
	return nil
}

// unmarkKept removes the node-lost mark from the kept claims of a node
// that is back (its taint lifted, or its Node registered again): `volume
// status` no longer shows them NODE-LOST. (PVs marked stay marked: their
// delete was decided, and the orphan collector has their LVs.)
func (c *NodeLoss) unmarkKept(ctx context.Context, node string) error {
	prefix := node + ": "
	pvcs, err := c.pvcs.List(labels.Everything())
	if err != nil {
		return err
	}
	var errs []error
	for _, pvc := range pvcs {
		if strings.HasPrefix(pvc.Annotations[kube.AnnNodeLost], prefix) {
			if err := kube.ClearClaimNodeLost(ctx, c.client, pvc); err != nil {
				errs = append(errs, err)
				continue
			}
			klog.InfoS("Node back: kept claim no longer marked lost", "node", node, "pvc", klog.KObj(pvc))
		}
	}
	return errors.Join(errs...)
}

// sendBack returns an unbound claim whose selected node is lost to the
// scheduler, as the provisioner does for a node without room.
func (c *NodeLoss) sendBack(ctx context.Context, pvc *corev1.PersistentVolumeClaim, node, reason string) error {
	if err := kube.SendBackToScheduler(ctx, c.client, pvc); err != nil {
		return err
	}
	state := pvc.Annotations[kube.AnnLifecycle]
	c.recorder.Eventf(pvc, corev1.EventTypeWarning, ReasonNodeLost,
		"Node %s is lost (%s): the claim is sent back to the scheduler, which picks another node for its Pod.", node, reason)
	c.metrics.claims.WithLabelValues("rescheduled").Inc()
	klog.InfoS("Node lost: unbound claim sent back to the scheduler", "node", node, "reason", reason, "pvc", klog.KObj(pvc), "lifecycle", state)
	return nil
}

// lostError says that a wait for the node's agent ended because the node
// is lost.
func lostError(ctx context.Context, node string, err error) error {
	if err != nil && errors.Is(context.Cause(ctx), ErrNodeLost) {
		return fmt.Errorf("node %s: %w (%s)", node, ErrNodeLost, strings.TrimSpace(err.Error()))
	}
	return err
}
