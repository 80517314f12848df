package provisioner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	resizecontroller "github.com/kubernetes-csi/external-resizer/v2/pkg/controller"
	"github.com/kubernetes-csi/external-resizer/v2/pkg/resizer"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient"
)

// Resizer grows the local PVs this provisioner made: external-resizer's
// controller (the one csi-resizer runs) drives it, and Resize asks the PV's
// agent to extend the LV (kube.ExpandVolumeWithAnnotations). The controller
// does what Kubernetes defines around it: the claim's
// status.allocatedResources and allocatedResourceStatuses
// (ControllerResizeInProgress, then NodeResizePending for a Filesystem
// volume, whose filesystem kubelet's local plugin grows online; for Block
// the claim's status capacity at once), the PV's capacity, recovery when
// the user lowers the request of an infeasible expansion, and the events
// Resizing, FileSystemResizeRequired, VolumeResizeFailed.
// kube-controller-manager's expand controller leaves a local PV to such an
// external resizer ("waiting for an external controller to expand this
// PVC"), without annotating the claim, so the controller's own CanSupport
// check is what picks our PVs.
type Resizer struct {
	client apiclient.Interface
	cfg    Config
}

var _ resizer.Resizer = (*Resizer)(nil)

// NewResizer makes a Resizer for the local PVs provisioned under cfg.Name.
func NewResizer(client kubernetes.Interface, cfg Config) *Resizer {
	p := New(client, cfg)
	return &Resizer{client: p.api, cfg: p.cfg}
}

// Name is the provisioner's name (the controller's event source and queue).
func (r *Resizer) Name() string { return r.cfg.Name }

// DriverSupportsControlPlaneExpansion: the LV grows on the controller side
// (through the node's agent); kubelet only grows the filesystem.
func (r *Resizer) DriverSupportsControlPlaneExpansion() bool { return true }

// CanSupport: a local PV this provisioner made. Other PVs (an original
// agent's CSI PVs, other provisioners' local PVs) are never asked to grow.
func (r *Resizer) CanSupport(pv *corev1.PersistentVolume, _ *corev1.PersistentVolumeClaim) bool {
	return pv.Spec.Local != nil && pv.Annotations[kube.AnnProvisionedBy] == r.cfg.Name
}

// Resize asks the PV's agent to grow the LV to at least size and returns
// the LV's size as the agent read it (whole extents), and whether kubelet
// must grow a filesystem on it. Errors are gRPC statuses because that is
// how the controller tells them apart: OutOfRange (the node cannot hold the
// size) and InvalidArgument (any other "failed" answer: the same size would
// fail again) end the expansion ControllerResizeInfeasible, which the user
// recovers from by asking for less; Unavailable (no answer in time) is
// retried with backoff, the grow being idempotent.
func (r *Resizer) Resize(pv *corev1.PersistentVolume, size resource.Quantity) (resource.Quantity, bool, error) {
	vg, lv, err := kube.ParsePVSpec(pv.Annotations[kube.AnnSpec])
	if err != nil {
		return resource.Quantity{}, false, status.Error(codes.InvalidArgument, fmt.Sprintf("PV %s: %v", pv.Name, err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Timeout)
	defer cancel()
	if err := r.agentGrows(ctx, pv, vg); err != nil {
		return resource.Quantity{}, false, err
	}
	// The PV as the controller's cache holds it: one round trip fewer on
	// the grow's path than a read first (a PV changed since is read).
	got, err := kube.ExpandVolumeFrom(ctx, r.client, pv, kube.CreateSpec{VolumeGroup: vg, Name: lv, Size: size.Value()}, nil)
	var failed *kube.FailedError
	switch {
	case errors.Is(err, kube.ErrInsufficientCapacity):
		return resource.Quantity{}, false, status.Error(codes.OutOfRange, err.Error())
	case errors.As(err, &failed):
		return resource.Quantity{}, false, status.Error(codes.InvalidArgument, err.Error())
	case err != nil:
		return resource.Quantity{}, false, status.Error(codes.Unavailable, err.Error())
	}
	klog.V(2).InfoS("Volume grown", "pv", pv.Name, "asked", size.Value(), "size", got)
	fs := pv.Spec.VolumeMode == nil || *pv.Spec.VolumeMode == corev1.PersistentVolumeFilesystem
	return *resource.NewQuantity(got, resource.BinarySI), fs, nil
}

// agentGrows checks that the agent of the PV's node says it grows volumes
// of vg (the "grow" field of its capacity annotation): an agent of the
// original design, or one in front of google/lvmd (no resize), or an older
// lvm-agent, says nothing, and would never answer an expand request or
// answer it "failed" only after a round trip; the claim ends
// ControllerResizeInfeasible at once with the reason instead.
func (r *Resizer) agentGrows(ctx context.Context, pv *corev1.PersistentVolume, vg string) error {
	host, ok := kube.LocalPVHostname(pv)
	if !ok {
		return status.Error(codes.InvalidArgument, fmt.Sprintf("PV %s names no node (kubernetes.io/hostname affinity)", pv.Name))
	}
	grows := func(n *corev1.Node) bool { return capacityEntry(n, r.cfg.CapacityAnnotation, vg).Grow }
	if r.cfg.Nodes != nil {
		// The Node cache, when it says so; a refusal is only ever made
		// on the API server's Nodes (a cache behind an upgraded agent).
		if cached, err := r.cfg.Nodes.List(labels.SelectorFromSet(labels.Set{HostnameLabel: host})); err == nil && slices.ContainsFunc(cached, grows) {
			return nil
		}
	}
	nodes, err := kube.NodesOfHostname(ctx, r.client, host)
	if err != nil {
		return status.Error(codes.Unavailable, err.Error())
	}
	for i := range nodes {
		if grows(&nodes[i]) {
			return nil
		}
	}
	return status.Error(codes.InvalidArgument, fmt.Sprintf("PV %s cannot grow: the agent on node %s does not say it grows volumes of volume group %s (annotation %s has no \"grow\": an agent of the original design, one in front of google/lvmd, or an older lvm-agent)",
		pv.Name, host, vg, r.cfg.CapacityAnnotation))
}

// resizeResync: external-resizer's controller looks again at every claim
// this often, for a claim whose resize is still pending (csi-resizer's
// default); the nudger at the same pace, for a Pod it could not nudge.
const resizeResync = 10 * time.Minute

// ResizeController is external-resizer's controller over a Resizer, with
// the Nudger beside it.
type ResizeController struct {
	rc      resizecontroller.ResizeController
	nudger  *Nudger
	workers int
}

// NewResizeController wires external-resizer's controller over r, and the
// nudger, to the leader's informers (NewInformers), workers claims at a
// time; Run runs them.
func NewResizeController(client kubernetes.Interface, factory informers.SharedInformerFactory, r *Resizer, workers int) *ResizeController {
	// Its claim handler resyncs (resizeResync): the factory's claim
	// informer checks often enough for it (resyncCheck).
	rc := resizecontroller.NewResizeController(r.Name(), r, client, resizeResync, factory,
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, 5*time.Minute),
		false /* no offline-only volumes: the LV grows under a running Pod */, 5*time.Minute)
	nudger, err := NewNudger(client, r.Name(), factory, prometheus.DefaultRegisterer)
	if err != nil {
		klog.ErrorS(err, "Kubelet will not be nudged after a grow: filesystems grow at its next sync of the Pod")
	}
	return &ResizeController{rc: rc, nudger: nudger, workers: max(workers, 1)}
}

// Run grows volumes until ctx ends (the controller waits for the informers).
func (c *ResizeController) Run(ctx context.Context) {
	if c.nudger != nil {
		go c.nudger.Run(ctx)
	}
	var wg sync.WaitGroup
	c.rc.Run(c.workers, ctx, &wg)
	wg.Wait()
}
