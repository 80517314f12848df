package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/lvm-agent/lvm-agent/kube/apiclient"
)

// Errors of the provisioner helpers. A *FailedError matches the sentinel of
// its reason with errors.Is, so a CSI controller can answer
// ResourceExhausted for ErrInsufficientCapacity and let the scheduler move on.
var (
	ErrInsufficientCapacity = errors.New(ReasonInsufficientCapacity)
	ErrUnknownVolumeGroup   = errors.New(ReasonUnknownVolumeGroup)
	ErrNameConflict         = errors.New(ReasonNameConflict)
	ErrProtected            = errors.New(ReasonProtected)
	ErrClaimInUse           = errors.New(ReasonClaimInUse)
	ErrVolumeMismatch       = errors.New(ReasonVolumeMismatch)
	ErrNotPlainVolume       = errors.New(ReasonNotPlainVolume)
	ErrClaimTerminating     = errors.New(ReasonClaimTerminating)
	ErrVolumeNotFound       = errors.New(ReasonVolumeNotFound)
	ErrResizeNotSupported   = errors.New(ReasonResizeNotSupported)
	ErrCloneNotSupported    = errors.New(ReasonCloneNotSupported)
	// ErrGone: the object was deleted while waiting.
	ErrGone = errors.New("object deleted while waiting for the agent")
)

// FailedError is an agent's "failed" answer.
type FailedError struct {
	Object  string
	Reason  string
	Message string
}

func (e *FailedError) Error() string {
	return fmt.Sprintf("%s: failed (%s): %s", e.Object, e.Reason, e.Message)
}

var reasonErrors = map[string]error{
	ReasonInsufficientCapacity: ErrInsufficientCapacity,
	ReasonUnknownVolumeGroup:   ErrUnknownVolumeGroup,
	ReasonNameConflict:         ErrNameConflict,
	ReasonProtected:            ErrProtected,
	ReasonClaimInUse:           ErrClaimInUse,
	ReasonVolumeMismatch:       ErrVolumeMismatch,
	ReasonNotPlainVolume:       ErrNotPlainVolume,
	ReasonClaimTerminating:     ErrClaimTerminating,
	ReasonInvalidSpec:          ErrInvalidSpec,
	ReasonVolumeNotFound:       ErrVolumeNotFound,
	ReasonResizeNotSupported:   ErrResizeNotSupported,
	ReasonCloneNotSupported:    ErrCloneNotSupported,
}

// Is matches the sentinel of the reason.
func (e *FailedError) Is(target error) bool {
	s, ok := reasonErrors[e.Reason]
	return ok && s == target
}

// StateFunc is told every lifecycle state seen while waiting, with the volume.error if any.
type StateFunc func(state, errMsg string)

// CreateVolumeWithAnnotations asks the agent on the PVC's selected node for a
// volume: it writes "creating", the spec and the volume.node label in one
// merge patch (which also clears the volume.reason and volume.error of an
// earlier answer), then watches the PVC until the agent answers or ctx ends.
// A PVC that already carries lvm-agent's "created" answer to the same spec
// from its selected node is not asked again: that answer is returned.
func CreateVolumeWithAnnotations(ctx context.Context, c apiclient.Interface, namespace, pvcName string, spec CreateSpec, onState StateFunc) error {
	_, err := CreateVolume(ctx, c, namespace, pvcName, spec, onState)
	return err
}

// CreateVolume is CreateVolumeWithAnnotations that also returns the PVC as
// the agent answered it, for its volume.device.
func CreateVolume(ctx context.Context, c apiclient.Interface, namespace, pvcName string, spec CreateSpec, onState StateFunc) (*corev1.PersistentVolumeClaim, error) {
	pvc, err := c.PVCs(namespace).Get(ctx, pvcName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return createVolume(ctx, c, pvc, "", spec, onState)
}

// CreateVolumeFrom is CreateVolume for a claim the caller has read already
// (a provisioner library's cache): a claim with a node chosen and no request
// yet gets it without a read first, in a merge patch conditional on the
// claim's resourceVersion. Anything else (the claim changed since, carries a
// request or an answer already, or names no node) is CreateVolume, which
// reads the claim.
func CreateVolumeFrom(ctx context.Context, c apiclient.Interface, pvc *corev1.PersistentVolumeClaim, spec CreateSpec, onState StateFunc) (*corev1.PersistentVolumeClaim, error) {
	if pvc.Annotations[AnnLifecycle] == "" && pvc.Annotations[AnnSelectedNode] != "" && pvc.ResourceVersion != "" {
		out, err := createVolume(ctx, c, pvc, pvc.ResourceVersion, spec, onState)
		if !apierrors.IsConflict(err) {
			return out, err
		}
	}
	return CreateVolume(ctx, c, pvc.Namespace, pvc.Name, spec, onState)
}

// createVolume asks for spec on pvc as read; resourceVersion, when not
// empty, is the request's precondition.
func createVolume(ctx context.Context, c apiclient.Interface, pvc *corev1.PersistentVolumeClaim, resourceVersion string, spec CreateSpec, onState StateFunc) (*corev1.PersistentVolumeClaim, error) {
	namespace, pvcName := pvc.Namespace, pvc.Name
	node := pvc.Annotations[AnnSelectedNode]
	if node == "" {
		return nil, fmt.Errorf("PVC %s/%s has no %s annotation: no node is chosen yet", namespace, pvcName, AnnSelectedNode)
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if answeredCreate(pvc, node, string(raw)) {
		// Asked and answered already: a caller that asks again (a
		// provisioner restarted before its PV was saved or bound; one
		// whose library takes the claim up again, which lvm-agent's own
		// provisioner tells it not to: its ShouldProvision) gets the
		// answer that stands, and the agent is not sent a second create
		// of the same volume.
		if onState != nil {
			onState(StateCreated, "")
		}
		return pvc, nil
	}
	if !openCreate(pvc, node, string(raw)) {
		pvc, err = UpdatePvcWithAnnotations(ctx, c, namespace, pvcName, resourceVersion, request(StateCreating, string(raw)),
			Set(map[string]string{LabelNode: NodeLabelValue(node)}))
		if err != nil {
			return nil, err
		}
	}
	lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", pvcName).String()
		return c.PVCs(namespace).Watch(ctx, o)
	}}
	answered, err := waitForAnswer(ctx, lw, pvc, "PVC "+namespace+"/"+pvcName, StateCreating, onState)
	if err != nil {
		return nil, err
	}
	return answered.(*corev1.PersistentVolumeClaim), nil
}

// openCreate: the PVC carries this very request, still open. A caller whose
// deadline passed while the agent had it queued (a busy node answers a
// burst in turn) asks again: it then waits for the answer to the request
// that stands, without writing it a second time, which would only clear
// the agent's last transient error and wake the agent for nothing.
func openCreate(pvc *corev1.PersistentVolumeClaim, node, spec string) bool {
	return pvc.Annotations[AnnLifecycle] == StateCreating && sameCreate(pvc, node, spec)
}

// sameCreate: the PVC's request is spec, asked of node (the volume.node
// label written with it).
func sameCreate(pvc *corev1.PersistentVolumeClaim, node, spec string) bool {
	return pvc.Annotations[AnnSpec] == spec && pvc.Labels[LabelNode] == NodeLabelValue(node)
}

// answeredCreate: the PVC carries lvm-agent's "created" answer (with the
// device) to exactly this spec, asked of the node it selects now (the
// volume.node label written with the request), so that a new request would
// get the same answer. A failed answer, another spec, another node or an
// answer without a device (an agent of the original design) is asked again.
func answeredCreate(pvc *corev1.PersistentVolumeClaim, node, spec string) bool {
	return pvc.Annotations[AnnLifecycle] == StateCreated && pvc.Annotations[AnnDevice] != "" && sameCreate(pvc, node, spec)
}

// request is the change a provisioner writes to ask: the state and spec, and
// the removal of the reason and error of an earlier answer, so that a stale
// reason never stands beside a new request.
func request(state, spec string) Change {
	return Set(map[string]string{AnnLifecycle: state, AnnSpec: spec}).Remove(AnnReason, AnnError)
}

// DeleteVolumeWithAnnotations asks the agent that owns a PV to remove its LV
// vg/lv: it writes "deleting" and the spec, then watches until the answer.
// A PV that already carries the "deleted" answer to the same vg/lv is not
// asked again (the provisioner library calls Delete again for a PV that the
// request and its answer updated, when its informer does not show the PV's
// deletion yet).
func DeleteVolumeWithAnnotations(ctx context.Context, c apiclient.Interface, pvName, vg, lv string, onState StateFunc) error {
	_, err := askPV(ctx, c, pvName, request(StateDeleting, vg+"/"+lv), StateDeleting, StateDeleted, onState)
	return err
}

// ExpandVolumeWithAnnotations asks the agent that owns a PV to grow its LV
// to spec.Size: it writes "expanding" and the JSON spec (and removes the
// volume.size of an earlier answer), then watches until the answer, and
// returns the LV's size as the agent read it after the grow.
func ExpandVolumeWithAnnotations(ctx context.Context, c apiclient.Interface, pvName string, spec CreateSpec, onState StateFunc) (int64, error) {
	return ExpandVolumeFrom(ctx, c, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pvName}}, spec, onState)
}

// ExpandVolumeFrom is ExpandVolumeWithAnnotations for a PV the caller has
// read already (the resizer's cache): the request is written without a
// read first, in a merge patch conditional on the PV's resourceVersion; a
// PV changed since (or one without a resourceVersion) is read first.
func ExpandVolumeFrom(ctx context.Context, c apiclient.Interface, pv *corev1.PersistentVolume, spec CreateSpec, onState StateFunc) (int64, error) {
	raw, err := json.Marshal(spec)
	if err != nil {
		return 0, err
	}
	req := request(StateExpanding, string(raw)).Remove(AnnSize)
	if pv.ResourceVersion != "" {
		answered, err := askPVAsRead(ctx, c, pv, pv.ResourceVersion, req, StateExpanding, onState)
		if !apierrors.IsConflict(err) {
			return expanded(answered, err)
		}
	}
	return expanded(askPV(ctx, c, pv.Name, req, StateExpanding, "", onState))
}

// expanded is the LV's size the agent's answer on pv says.
func expanded(pv *corev1.PersistentVolume, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	size, err := strconv.ParseInt(pv.Annotations[AnnSize], 10, 64)
	if err != nil || size <= 0 {
		return 0, fmt.Errorf("PV %s: expanded, but %s is %q, not a size in bytes", pv.Name, AnnSize, pv.Annotations[AnnSize])
	}
	return size, nil
}

// askPV writes a request on a PV and waits for the agent's answer. A PV
// that already carries the answer reused (its final state, if not empty) to
// the same spec is returned as it is, unasked.
func askPV(ctx context.Context, c apiclient.Interface, pvName string, req Change, pending, reused string, onState StateFunc) (*corev1.PersistentVolume, error) {
	pv, err := c.PVs().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if spec := req[AnnSpec]; reused != "" && spec != nil && pv.Annotations[AnnLifecycle] == reused && pv.Annotations[AnnSpec] == *spec {
		if onState != nil {
			onState(reused, "")
		}
		return pv, nil
	}
	return askPVAsRead(ctx, c, pv, "", req, pending, onState)
}

// DeleteVolumeFrom is DeleteVolumeWithAnnotations for a PV the caller has
// read already (a provisioner library's cache): a PV without a delete
// request or answer gets the request without a read first, in a merge patch
// conditional on the PV's resourceVersion. Anything else (the PV changed
// since, or it carries a delete request or answer) is
// DeleteVolumeWithAnnotations, which reads the PV.
func DeleteVolumeFrom(ctx context.Context, c apiclient.Interface, pv *corev1.PersistentVolume, vg, lv string, onState StateFunc) error {
	if s := pv.Annotations[AnnLifecycle]; s != StateDeleting && s != StateDeleted && pv.ResourceVersion != "" {
		_, err := askPVAsRead(ctx, c, pv, pv.ResourceVersion, request(StateDeleting, vg+"/"+lv), StateDeleting, onState)
		if !apierrors.IsConflict(err) {
			return err
		}
	}
	return DeleteVolumeWithAnnotations(ctx, c, pv.Name, vg, lv, onState)
}

// askPVAsRead writes a request on pv as read (resourceVersion, when not
// empty, the precondition) and waits for the agent's answer.
func askPVAsRead(ctx context.Context, c apiclient.Interface, pv *corev1.PersistentVolume, resourceVersion string, req Change, pending string, onState StateFunc) (*corev1.PersistentVolume, error) {
	pvName := pv.Name
	// A PV labelled at creation keeps its label: a local PV's affinity names
	// the Node's hostname label, which may differ from the node name the
	// label holds. Only an unlabelled PV is labelled from its affinity.
	var labels Change
	if _, labelled := pv.Labels[LabelNode]; !labelled {
		if _, node, ok := affinityNode(pv); ok {
			labels = Set(map[string]string{LabelNode: NodeLabelValue(node)})
		}
	}
	pv, err := UpdatePvWithAnnotations(ctx, c, pvName, resourceVersion, req, labels)
	if err != nil {
		return nil, err
	}
	lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", pvName).String()
		return c.PVs().Watch(ctx, o)
	}}
	answered, err := waitForAnswer(ctx, lw, pv, "PV "+pvName, pending, onState)
	if err != nil {
		return nil, err
	}
	return answered.(*corev1.PersistentVolume), nil
}

// waitForAnswer watches from the version the request was written at (no
// polling) until the lifecycle leaves the pending state, and returns the
// object as answered.
func waitForAnswer(ctx context.Context, lw cache.Watcher, written runtime.Object, what, pending string, onState StateFunc) (runtime.Object, error) {
	m, err := metaOf(written)
	if err != nil {
		return nil, err
	}
	if onState != nil {
		onState(pending, "")
	}
	lastErr := ""
	last, err := watchtools.Until(ctx, m.GetResourceVersion(), lw, func(ev watch.Event) (bool, error) {
		if ev.Type == watch.Deleted {
			return false, fmt.Errorf("%s: %w", what, ErrGone)
		}
		o, err := metaOf(ev.Object)
		if err != nil || o.GetName() != m.GetName() {
			return false, nil // (the field selector already keeps other objects out)
		}
		ann := o.GetAnnotations()
		state := ann[AnnLifecycle]
		if state == pending {
			if e := ann[AnnError]; e != lastErr && e != "" && onState != nil {
				onState(state, e)
			}
			lastErr = ann[AnnError]
			return false, nil
		}
		if onState != nil {
			onState(state, ann[AnnError])
		}
		switch state {
		case StateFailed:
			return true, &FailedError{Object: what, Reason: ann[AnnReason], Message: ann[AnnError]}
		case StateCreated, StateDeleted, StateExpanded:
			return true, nil
		}
		return true, fmt.Errorf("%s: lifecycle changed to %q by someone else", what, state)
	})
	if err != nil && ctx.Err() != nil {
		// The watch reports its own timeout error; callers test for the context's.
		if lastErr != "" {
			return nil, fmt.Errorf("%s: no answer before the deadline (last error: %s): %w", what, lastErr, ctx.Err())
		}
		return nil, fmt.Errorf("%s: no answer before the deadline: %w", what, ctx.Err())
	}
	if err != nil {
		return nil, err
	}
	return last.Object, nil
}

func metaOf(obj runtime.Object) (metav1.Object, error) {
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		return o, nil
	case *corev1.PersistentVolume:
		return o, nil
	}
	return nil, fmt.Errorf("unexpected object %T", obj)
}
