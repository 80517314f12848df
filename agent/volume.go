package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// OwnerTagPrefix starts the tag the agent puts on every LV it creates; the
// rest is the UID of the PVC it was created for. The tag is written by the
// same lvcreate that makes the LV, so a crash can never leave an LV of ours
// without it.
const OwnerTagPrefix = "lvm-agent.pvc."

// ProtectedTag marks an LV the agent must never remove.
const ProtectedTag = "protected"

// OwnerTag is the ownership tag for a PVC.
func OwnerTag(uid types.UID) string { return OwnerTagPrefix + string(uid) }

// OwnerUID returns the PVC UID an LV's ownership tag names, if any.
func OwnerUID(lv *lvmbackend.Volume) (string, bool) {
	for _, t := range lv.Tags {
		if uid, ok := strings.CutPrefix(t, OwnerTagPrefix); ok {
			return uid, true
		}
	}
	return "", false
}

// outcome is the answer to a request: a final state (with a reason when
// failed), or a transient error to retry.
type outcome struct {
	state  string
	reason string
	err    error
	device string // with created: the LV's device path, when known
}

func final(state string) outcome { return outcome{state: state} }

func fail(reason string, err error) outcome {
	return outcome{state: kube.StateFailed, reason: reason, err: err}
}

func retry(err error) outcome { return outcome{err: err} }

// target is the LV a request is about.
type target struct{ deviceClass, name string }

func (t target) String() string { return t.deviceClass + "/" + t.name }

// createTarget validates a PVC's spec.
func (a *Agent) createTarget(pvc *corev1.PersistentVolumeClaim) (kube.CreateSpec, target, error) {
	spec, err := kube.ParseCreateSpec(pvc.Annotations[kube.AnnSpec])
	if err != nil {
		return spec, target{}, err
	}
	for _, t := range spec.Tags {
		if strings.HasPrefix(t, OwnerTagPrefix) {
			return spec, target{}, fmt.Errorf("%w: tag %q uses the agent's ownership prefix", kube.ErrInvalidSpec, t)
		}
	}
	if spec.Striping && a.cfg.StripedOptionClass == "" {
		return spec, target{}, fmt.Errorf("%w: striping requested, but this node has no lvcreate option class for it (--striped-option-class)", kube.ErrInvalidSpec)
	}
	return spec, target{a.deviceClass(spec.VolumeGroup), spec.Name}, nil
}

// deleteTarget validates a PV's spec.
func (a *Agent) deleteTarget(pv *corev1.PersistentVolume) (target, error) {
	vg, lv, err := kube.ParsePVSpec(pv.Annotations[kube.AnnSpec])
	if err != nil {
		return target{}, err
	}
	return target{a.deviceClass(vg), lv}, nil
}

func (a *Agent) deviceClass(vg string) string { return DeviceClass(a.cfg.DeviceClasses, vg) }

// DeviceClass is the lvmd device class of a spec's volume group: its entry
// in classes (volume group to device class), or else the class of that name.
func DeviceClass(classes map[string]string, vg string) string {
	if dc, ok := classes[vg]; ok {
		return dc
	}
	return vg
}

// create makes the LV for a PVC, or finds the one it made before.
//
// lvmd's CreateLV is not idempotent, but it is safe to call for a name that
// exists: lvcreate refuses it and touches nothing. So the agent creates
// first and looks only when that fails — one lvm run per create instead of a
// listing before each — and judges every failure by what the listing shows:
// our LV (an earlier attempt, perhaps by a killed agent) is success, a
// foreign one is a conflict, and only with no LV there does lvmd's error
// stand. This also keeps a retry after a crash from reading "VG full" when
// the space is full of the very LV it asked for.
func (a *Agent) create(ctx context.Context, pvc *corev1.PersistentVolumeClaim, spec kube.CreateSpec, t target) outcome {
	tag := OwnerTag(pvc.UID)
	req := lvmbackend.CreateRequest{DeviceClass: t.deviceClass, Name: t.name, SizeBytes: spec.Size,
		Tags: append(append([]string(nil), spec.Tags...), tag)}
	if spec.Striping {
		req.OptionClass = a.cfg.StripedOptionClass
	}
	vol, createErr := a.backend.CreateVolume(ctx, req)
	if createErr == nil {
		return a.created(ctx, vol)
	}
	if errors.Is(createErr, lvmbackend.ErrUnavailable) {
		return retry(createErr)
	}
	lv, err := a.backend.GetVolume(ctx, t.deviceClass, t.name)
	switch {
	case err == nil && lv.HasTag(tag):
		return a.created(ctx, lv)
	case err == nil:
		return fail(kube.ReasonNameConflict, fmt.Errorf("LV %s exists and was not created by lvm-agent for this PVC (no tag %s); it is left untouched", t, tag))
	case errors.Is(err, lvmbackend.ErrUnknownDeviceClass):
		return fail(kube.ReasonUnknownVolumeGroup, fmt.Errorf("volume group %q (device class %q) is not served by lvmd on this node: %w", spec.VolumeGroup, t.deviceClass, err))
	case !errors.Is(err, lvmbackend.ErrNotFound):
		return retry(fmt.Errorf("%w (and the check that followed: %v)", createErr, err))
	}
	switch {
	case errors.Is(createErr, lvmbackend.ErrInsufficientCapacity):
		return fail(kube.ReasonInsufficientCapacity, createErr)
	case errors.Is(createErr, lvmbackend.ErrUnknownDeviceClass):
		return fail(kube.ReasonUnknownVolumeGroup, createErr)
	case errors.Is(createErr, lvmbackend.ErrInvalidArgument):
		return fail(kube.ReasonInvalidSpec, createErr)
	}
	return retry(createErr)
}

// remove deletes a PV's LV if, and only if, it is ours to delete.
func (a *Agent) remove(ctx context.Context, pv *corev1.PersistentVolume, t target) outcome {
	lv, err := a.backend.GetVolume(ctx, t.deviceClass, t.name)
	switch {
	case errors.Is(err, lvmbackend.ErrNotFound):
		return final(kube.StateDeleted)
	case errors.Is(err, lvmbackend.ErrUnknownDeviceClass):
		return fail(kube.ReasonUnknownVolumeGroup, fmt.Errorf("device class %q is not served by lvmd on this node: %w", t.deviceClass, err))
	case err != nil:
		return retry(err)
	}
	if lv.HasTag(ProtectedTag) {
		return fail(kube.ReasonProtected, fmt.Errorf("LV %s is tagged %q and is never removed", t, ProtectedTag))
	}
	uid, tagged := OwnerUID(lv)
	switch {
	case !tagged && !a.cfg.AllowUntagged:
		return fail(kube.ReasonNameConflict, fmt.Errorf("LV %s has no lvm-agent ownership tag and is left untouched (start the agent with --allow-untagged-delete for volumes of the original agent)", t))
	case tagged && pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.UID != "" && uid != string(pv.Spec.ClaimRef.UID):
		return fail(kube.ReasonNameConflict, fmt.Errorf("LV %s belongs to PVC UID %s, not to this PV's claim %s; it is left untouched", t, uid, pv.Spec.ClaimRef.UID))
	}
	dmName := a.cfg.Devices.name(ctx, lv)
	err = a.backend.RemoveVolume(ctx, t.deviceClass, t.name)
	if err == nil || errors.Is(err, lvmbackend.ErrNotFound) {
		if !a.cfg.Devices.gone(ctx, dmName) {
			// LVM no longer knows the LV; the kernel still has its device.
			klog.ErrorS(nil, "LV removed, but its device-mapper device is still present", "lv", t, "device", dmName)
		}
		return final(kube.StateDeleted)
	}
	return retry(err)
}

// created is the answer for an LV of ours, once the kernel confirms its
// device is active (when device-mapper is readable).
func (a *Agent) created(ctx context.Context, lv *lvmbackend.Volume) outcome {
	if err := a.cfg.Devices.confirmActive(ctx, lv); err != nil {
		return retry(err)
	}
	return outcome{state: kube.StateCreated, device: a.devicePath(ctx, lv)}
}
