package kube

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"github.com/lvm-agent/lvm-agent/kube/apiclient"
)

// Node identifies one agent: its node name, its Node's kubernetes.io/hostname
// label ("" when unknown), the CSI drivers whose PVs it serves, and the
// provisioners whose local PVs it serves.
type Node struct {
	Name         string
	Hostname     string
	Drivers      []string
	Provisioners []string
}

// NodeHostname reads the kubernetes.io/hostname label of the Node named
// name, retrying for a few seconds while the API server is unreachable ("",
// nil when the Node has no such label). The agent reads it once at start: a
// local PV's node affinity names that label's value, which may differ from
// the node name.
func NodeHostname(ctx context.Context, c apiclient.Interface, name string) (string, error) {
	var node *corev1.Node
	backoff := wait.Backoff{Steps: 5, Duration: 200 * time.Millisecond, Factor: 2}
	transient := func(err error) bool { return !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) }
	err := retry.OnError(backoff, transient, func() error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var err error
		node, err = c.Nodes().Get(ctx, name, metav1.GetOptions{})
		return err
	})
	if err != nil {
		return "", fmt.Errorf("read Node %s: %w", name, err)
	}
	return node.Labels[corev1.LabelHostname], nil
}

// OwnsPVC: the PVC's selected-node is this node. The volume.node label never
// makes a PVC an agent's: it is a watch hint that anyone may write.
func (n Node) OwnsPVC(pvc *corev1.PersistentVolumeClaim) bool {
	return pvc.Annotations[AnnSelectedNode] == n.Name && n.Name != ""
}

// OwnsPV: the PV's required node affinity is a single term with a single
// expression naming only this node, and the PV is a CSI PV of a served
// driver or a local PV of a served provisioner. Like OwnsPVC, the label
// plays no part.
//
// A CSI PV's expression has its driver's topology key, whose value is the
// node name. A local PV's key must be kubernetes.io/hostname, and its value
// is matched with this Node's hostname label when the agent knows it, else
// with the node name: where the two differ, the label is what the scheduler
// and kubelet match, and matching the name as well could make a second
// agent (one whose node name is this node's hostname) an owner too.
func (n Node) OwnsPV(pv *corev1.PersistentVolume) bool {
	switch {
	case pv.Spec.CSI != nil:
		if !slices.Contains(n.Drivers, pv.Spec.CSI.Driver) {
			return false
		}
		_, node, ok := affinityNode(pv)
		return ok && node == n.Name
	case pv.Spec.Local != nil:
		if by, ok := pv.Annotations[AnnProvisionedBy]; !ok || !slices.Contains(n.Provisioners, by) {
			return false
		}
		key, host, ok := affinityNode(pv)
		return ok && key == corev1.LabelHostname && host == n.hostname()
	}
	return false
}

// hostname is the kubernetes.io/hostname value of this node: its label, or
// the node name when the label is unknown (kubelet's default value).
func (n Node) hostname() string {
	if n.Hostname != "" {
		return n.Hostname
	}
	return n.Name
}

// Classify says whether a PVC or PV is this node's, and whether it is an
// open request of this node: a PVC "creating", a PV "deleting" or
// "expanding". Any other object is neither.
func (n Node) Classify(obj any) (owned, open bool) {
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		owned = n.OwnsPVC(o)
		return owned, owned && o.Annotations[AnnLifecycle] == StateCreating
	case *corev1.PersistentVolume:
		owned = n.OwnsPV(o)
		return owned, owned && PVRequest(o.Annotations[AnnLifecycle])
	}
	return false, false
}

// Route is the node an open request is for, by the rules the owners read
// (OwnsPVC, OwnsPV), for whoever labels it: a PVC "creating" goes to its
// selected-node; a PV "deleting" or "expanding" to the value of its node
// affinity (a single term, expression and value), which is the node name for a CSI PV (its
// driver's topology key) and the Node's kubernetes.io/hostname label for a
// local PV (byHostname: the caller finds the Node that carries it). ok is
// false for anything else: no one is asked to answer it.
func Route(obj any) (node string, byHostname, ok bool) {
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		node = o.Annotations[AnnSelectedNode]
		return node, false, node != "" && o.Annotations[AnnLifecycle] == StateCreating
	case *corev1.PersistentVolume:
		if !PVRequest(o.Annotations[AnnLifecycle]) {
			return "", false, false
		}
		key, value, ok := affinityNode(o)
		switch {
		case !ok:
		case o.Spec.CSI != nil:
			return value, false, true
		case o.Spec.Local != nil && key == corev1.LabelHostname:
			return value, true, true
		}
	}
	return "", false, false
}

// Misdirected reports an open request labelled for this node that this node
// does not own: the label and the owner disagree, and the agent only warns.
// (In labelled or hybrid mode such a request may be seen by no other agent.)
func (n Node) Misdirected(obj any) bool {
	var labels map[string]string
	var open bool
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		labels, open = o.Labels, o.Annotations[AnnLifecycle] == StateCreating
	case *corev1.PersistentVolume:
		labels, open = o.Labels, PVRequest(o.Annotations[AnnLifecycle])
	default:
		return false
	}
	if !open || !n.labelled(labels) {
		return false
	}
	owned, _ := n.Classify(obj)
	return !owned
}

// LocalPVHostname is the kubernetes.io/hostname value of a local PV's node
// affinity, in the one form OwnsPV accepts (a single term, expression and
// value): the node the PV's LV lives on, by its label.
func LocalPVHostname(pv *corev1.PersistentVolume) (string, bool) {
	key, value, ok := affinityNode(pv)
	return value, ok && pv.Spec.Local != nil && key == corev1.LabelHostname
}

// NodesOfHostname is the Nodes whose kubernetes.io/hostname label is host
// (kubelet's --hostname-override makes it differ from the node name).
func NodesOfHostname(ctx context.Context, c apiclient.Interface, host string) ([]corev1.Node, error) {
	nodes, err := c.Nodes().List(ctx, metav1.ListOptions{
		LabelSelector: labels.Set{corev1.LabelHostname: host}.AsSelector().String()})
	if err != nil {
		return nil, fmt.Errorf("list the Nodes of hostname %s: %w", host, err)
	}
	return nodes.Items, nil
}

// affinityNode is the key and the value of a PV's required node affinity,
// when it is a single term with a single "In" expression of a single value.
func affinityNode(pv *corev1.PersistentVolume) (key, value string, ok bool) {
	na := pv.Spec.NodeAffinity
	if na == nil || na.Required == nil || len(na.Required.NodeSelectorTerms) != 1 {
		return "", "", false
	}
	term := na.Required.NodeSelectorTerms[0]
	if len(term.MatchExpressions) != 1 || len(term.MatchFields) != 0 {
		return "", "", false
	}
	e := term.MatchExpressions[0]
	if e.Operator != corev1.NodeSelectorOpIn || len(e.Values) != 1 || e.Key == "" {
		return "", "", false
	}
	return e.Key, e.Values[0], true
}

func (n Node) labelled(labels map[string]string) bool {
	v, ok := labels[LabelNode]
	return ok && v == NodeLabelValue(n.Name)
}
