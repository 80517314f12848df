// Package provisioner is lvm-agent's dynamic provisioner: the
// sig-storage-lib-external-provisioner Provisioner that turns a PVC of a
// StorageClass into a create request for the agent on the node the
// scheduler picked (kube.CreateVolume), and the agent's answer into a
// `local` PV; and a PV released under reclaim policy Delete into a delete
// request. Claim and volume workers, backoff, finalizers, events and the
// selected-node hand-shake are the library's. It knows StorageClass
// parameters and how a local PV is built, nothing about lvmd.
package provisioner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
)

// HostnameLabel is the Node label a local PV's node affinity matches.
const HostnameLabel = "kubernetes.io/hostname"

// CheckName refuses a provisioner name that no CSIDriver object can carry
// (a CSIDriver's name is a DNS-1123 subdomain, without the '/' a
// provisioner name may have): the scheduler reads the CSIStorageCapacity
// objects only for a provisioner with such a CSIDriver, and would ignore the
// capacity silently.
func CheckName(name string) error {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("provisioner name %q is not a DNS-1123 subdomain, so no CSIDriver object can enable capacity-aware scheduling for it: %s",
			name, strings.Join(errs, "; "))
	}
	return nil
}

// Config of a Provisioner.
type Config struct {
	// Name is the provisioner name the StorageClasses name.
	Name string
	// Timeout bounds the wait for an agent's answer in one call; after it,
	// provisioning continues in the background (the library calls again,
	// and the agent's create is idempotent).
	Timeout time.Duration
	// CapacityAnnotation is the Node annotation where the agents publish
	// their capacity, and the kind of clone they make and whether they grow
	// volumes in each volume group.
	CapacityAnnotation string
	// LostNodes is what the node-loss controller decided (nil: node loss
	// off): no volume is asked of a lost node, and a wait for its agent's
	// answer ends when it is lost.
	LostNodes *LostNodes
	// Nodes is the leader's cache of the Nodes (NewInformers), read for the selected
	// node's hostname label and capacity annotation instead of a round trip
	// to the API server before each request (nil: always that round trip).
	// A Node it does not hold, or holds without the label, is read from the
	// API server; so is the Node of a grow the cache does not say it can.
	Nodes corelisters.NodeLister
}

// selectedNode is the Node the scheduler picked, from the cache when it
// holds it with its hostname label (a Node just registered may not be there
// yet).
func (p *Provisioner) selectedNode(ctx context.Context, name string) (*corev1.Node, error) {
	if p.cfg.Nodes != nil {
		if n, err := p.cfg.Nodes.Get(name); err == nil && n.Labels[HostnameLabel] != "" {
			return n, nil
		}
	}
	return p.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
}

// Provisioner implements controller.Provisioner and controller.BlockProvisioner.
type Provisioner struct {
	client kubernetes.Interface
	api    apiclient.Interface // client, for kube's functions
	cfg    Config
	// made holds, by claim UID, the claims this process gave a PV in the
	// last madeFor (ShouldProvision).
	made *utilcache.LRUExpireCache
}

var (
	_ controller.BlockProvisioner = (*Provisioner)(nil)
	_ controller.Qualifier        = (*Provisioner)(nil)
)

// madeFor is how long a claim given a PV is not provisioned again: the
// window between the PV's save and kube-controller-manager's bind is
// seconds, minutes on a recovering cluster.
const madeFor = 5 * time.Minute

// New makes a Provisioner.
func New(client kubernetes.Interface, cfg Config) *Provisioner {
	if cfg.Name == "" {
		cfg.Name = kube.DefaultProvisioner
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Minute
	}
	if cfg.CapacityAnnotation == "" {
		cfg.CapacityAnnotation = kube.DefaultCapacityAnnotation
	}
	return &Provisioner{client: client, api: clientset.Wrap(client), cfg: cfg, made: utilcache.NewLRUExpireCache(4096)}
}

// ShouldProvision is false for a claim this process gave a PV in the last
// madeFor. The library calls Provision again for a claim that the request
// and the agent's answer updated while it was provisioned, when its PV
// informer does not show the PV it saved yet (and the claim is not bound
// yet): each such call wrote a second Provisioning event, a second create
// of the PV (AlreadyExists) and a second ProvisioningSucceeded event, for
// nothing (3 of the 8 claims of a make demo run). The library saves the PV
// in the background until it is saved (the queue store, which
// controller.CreateProvisionedPVLimiter chooses: cmd/lvm-agent sets it), so
// a PV given is a PV made; a claim evicted from this cache early costs only
// that call again.
func (p *Provisioner) ShouldProvision(_ context.Context, pvc *corev1.PersistentVolumeClaim) bool {
	if pv, ok := p.made.Get(pvc.UID); ok {
		klog.V(4).InfoS("Claim given its PV already; not provisioned again", "pvc", klog.KObj(pvc), "pv", pv)
		return false
	}
	return true
}

// SupportsBlock: a local PV hands the LV to a Pod raw in volumeMode Block.
func (p *Provisioner) SupportsBlock(context.Context) bool { return true }

// ErrImmediateBinding refuses classes whose volumes would be made before the
// scheduler picks a node: a local volume must be made where the Pod runs.
var ErrImmediateBinding = errors.New("lvm-agent volumes are local to a node: the StorageClass must have volumeBindingMode WaitForFirstConsumer, not Immediate; no volume is made")

// ErrNoDevice is an agent's "created" without volume.device (an agent of
// the original design): the provisioner never guesses a device path.
var ErrNoDevice = errors.New("the agent answered created without " + kube.AnnDevice + " (an agent of the original design?); lvm-agent's provisioner never guesses a device path: run lvm-agent on that node")

// Provision asks the selected node's agent for the LV and builds its PV.
func (p *Provisioner) Provision(ctx context.Context, opts controller.ProvisionOptions) (*corev1.PersistentVolume, controller.ProvisioningState, error) {
	class, pvc := opts.StorageClass, opts.PVC
	if class.VolumeBindingMode == nil || *class.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
		return nil, controller.ProvisioningFinished, fmt.Errorf("StorageClass %s: %w", class.Name, ErrImmediateBinding)
	}
	params, err := ParseParams(class.Parameters)
	if err != nil {
		return nil, controller.ProvisioningFinished, fmt.Errorf("StorageClass %s: %w", class.Name, err)
	}
	if opts.SelectedNodeName == "" {
		return nil, controller.ProvisioningFinished, fmt.Errorf("PVC %s/%s has no selected node", pvc.Namespace, pvc.Name)
	}
	size, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok || size.Sign() <= 0 {
		return nil, controller.ProvisioningFinished, fmt.Errorf("PVC %s/%s requests no storage size", pvc.Namespace, pvc.Name)
	}
	reclaim := corev1.PersistentVolumeReclaimDelete
	if class.ReclaimPolicy != nil {
		reclaim = *class.ReclaimPolicy
	}
	spec := kube.CreateSpec{VolumeGroup: params.VolumeGroup, Name: opts.PVName, Size: size.Value(), Tags: params.LVTags(), Striping: params.Striping}
	if reclaim == corev1.PersistentVolumeReclaimRetain {
		// The orphan collector never removes an LV that Kubernetes promised to keep.
		spec.Tags = append(append([]string(nil), spec.Tags...), kube.RetainedTag)
	}
	nodeLabel := kube.NodeLabelValue(opts.SelectedNodeName)
	if reason, lost := p.cfg.LostNodes.Lost(nodeLabel); lost {
		// The node-loss controller sends the claim back to the scheduler.
		return nil, controller.ProvisioningNoChange, fmt.Errorf("selected node %s: %w (%s)", opts.SelectedNodeName, ErrNodeLost, reason)
	}
	node, err := p.selectedNode(ctx, opts.SelectedNodeName)
	if err != nil {
		return nil, controller.ProvisioningNoChange, fmt.Errorf("selected node %s: %w", opts.SelectedNodeName, err)
	}
	hostname := node.Labels[HostnameLabel]
	if hostname == "" {
		return nil, controller.ProvisioningReschedule, fmt.Errorf("selected node %s has no %s label for a local PV's node affinity", node.Name, HostnameLabel)
	}

	var srcSize int64
	if dataSource(pvc) != nil {
		var state controller.ProvisioningState
		if spec.Source, srcSize, state, err = p.cloneFrom(ctx, opts, node, params.VolumeGroup); err != nil {
			return nil, state, err
		}
	}
	if err := params.Serves(capacityEntry(node, p.cfg.CapacityAnnotation, params.VolumeGroup)); err != nil {
		// Another node may (not a clone's: its source's node only); the
		// scheduler picks again: CSIStorageCapacity gives this node none
		// for the class.
		return nil, controller.ProvisioningReschedule, fmt.Errorf("StorageClass %s on node %s: %w", class.Name, node.Name, err)
	}

	wctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	wctx, stop := p.cfg.LostNodes.Watch(wctx, nodeLabel)
	defer stop()
	answered, err := kube.CreateVolumeFrom(wctx, p.api, pvc, spec, nil)
	var failed *kube.FailedError
	switch {
	case errors.Is(context.Cause(wctx), ErrNodeLost):
		// Not the library's reschedule: the node-loss controller already
		// removed selected-node, and the library would remove the node
		// the scheduler may have picked since.
		return nil, controller.ProvisioningNoChange, lostError(wctx, opts.SelectedNodeName, err)
	case errors.Is(err, kube.ErrInsufficientCapacity) && spec.Source == nil:
		// The scheduler's figures were stale: let it pick another node
		// (a clone has no other node: its failure is final, below).
		return nil, controller.ProvisioningReschedule, err
	case errors.As(err, &failed):
		return nil, controller.ProvisioningFinished, err
	case err != nil:
		// No answer yet (or the API server failed us after the request was
		// written): keep the claim in progress; the next call re-asks, and
		// the agent's create is idempotent, so there is never a second LV.
		klog.V(2).InfoS("No answer from the agent yet; provisioning continues in the background", "pvc", klog.KObj(pvc), "node", opts.SelectedNodeName, "err", err)
		return nil, controller.ProvisioningInBackground, err
	}
	device := answered.Annotations[kube.AnnDevice]
	if device == "" {
		return nil, controller.ProvisioningFinished, fmt.Errorf("PVC %s/%s on node %s: %w", pvc.Namespace, pvc.Name, opts.SelectedNodeName, ErrNoDevice)
	}
	pv := p.localPV(opts, params, reclaim, size, hostname, device)
	if srcSize > 0 && srcSize < size.Value() && pv.Spec.Local.FSType != nil {
		// The copy's filesystem is its source's size: see AnnPreResizeCapacity.
		pv.Annotations[AnnPreResizeCapacity] = resource.NewQuantity(srcSize, resource.BinarySI).String()
	}
	p.made.Add(pvc.UID, pv.Name, madeFor)
	return pv, controller.ProvisioningFinished, nil
}

// localPV is the PV of a created LV. The library adds the claimRef, the
// finalizer, the storage class and pv.kubernetes.io/provisioned-by.
func (p *Provisioner) localPV(opts controller.ProvisionOptions, params Params, reclaim corev1.PersistentVolumeReclaimPolicy,
	size resource.Quantity, hostname, device string) *corev1.PersistentVolume {
	pvc := opts.PVC
	annotations, labels := kube.PVRequestMeta(opts.SelectedNodeName, params.VolumeGroup, opts.PVName)
	local := &corev1.LocalVolumeSource{Path: device}
	if pvc.Spec.VolumeMode == nil || *pvc.Spec.VolumeMode == corev1.PersistentVolumeFilesystem {
		fs := params.FSType
		local.FSType = &fs
	}
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: opts.PVName, Annotations: annotations, Labels: labels},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   pvc.Spec.AccessModes,
			VolumeMode:                    pvc.Spec.VolumeMode,
			PersistentVolumeReclaimPolicy: reclaim,
			MountOptions:                  opts.StorageClass.MountOptions,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: local},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: HostnameLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{hostname}}},
			}}}},
		},
	}
}

// Delete asks the PV's agent to remove its LV and waits for "deleted". A
// "failed" (or no answer in time) is returned, so that the library retries
// with backoff and the PV stays.
func (p *Provisioner) Delete(ctx context.Context, pv *corev1.PersistentVolume) error {
	if pv.Spec.Local == nil {
		return &controller.IgnoredError{Reason: "not a local PV"}
	}
	vg, lv, err := kube.ParsePVSpec(pv.Annotations[kube.AnnSpec])
	if err != nil {
		return fmt.Errorf("PV %s: %w", pv.Name, err)
	}
	if lost := pv.Annotations[kube.AnnNodeLost]; lost != "" {
		// The node-loss controller marked it (and said so in an event):
		// nobody will answer, and the LV stays on the lost node's disks.
		klog.InfoS("PV of a lost node removed without its agent", "pv", pv.Name, "lv", vg+"/"+lv, "nodeLost", lost)
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	node := pv.Labels[kube.LabelNode]
	wctx, stop := p.cfg.LostNodes.Watch(wctx, node)
	defer stop()
	// Ended by the node's loss: the controller's mark on the PV brings the
	// library back here at once.
	err = lostError(wctx, node, kube.DeleteVolumeFrom(wctx, p.api, pv, vg, lv, nil))
	if apierrors.IsNotFound(err) {
		// The PV is gone from the API server: its delete is done. The
		// library calls again with the PV its cache still holds when the
		// agent's answer updated the PV during the first call; an error
		// here would be a VolumeFailedDelete warning on a deleted volume.
		return &controller.IgnoredError{Reason: "PV " + pv.Name + " is already deleted"}
	}
	return err
}
