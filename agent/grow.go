package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/lvm-agent/lvm-agent/agent/luks2"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmmeta"
)

// growStep is the step of a PV "expanding": its validated target and the grow.
func (a *Agent) growStep(pv *corev1.PersistentVolume) (target, func(context.Context) outcome, error) {
	spec, err := kube.ParseGrowSpec(pv.Annotations[kube.AnnSpec])
	t := target{a.deviceClass(spec.VolumeGroup), spec.Name}
	return t, func(ctx context.Context) outcome { return a.grow(ctx, pv, spec, t) }, err
}

// grow extends the LV of a PV's claim to at least spec.Size. Only the LV
// that the PV's claim owns (its ownership tag names the claimRef's UID) is
// touched; a grow never shrinks: an LV already at least that large is the
// answer as it is, with no lvmd call, which also makes a retry after a
// crash (the LV grown, the answer not written) answer at once. The size
// answered is the one LVM made, rounded up to whole extents.
func (a *Agent) grow(ctx context.Context, pv *corev1.PersistentVolume, spec kube.CreateSpec, t target) outcome {
	st := stepsOf(ctx)
	ref := pv.Spec.ClaimRef
	if ref == nil || ref.UID == "" {
		return fail(kube.ReasonInvalidSpec, fmt.Errorf("PV %s is bound to no claim (no claimRef with a UID): only a claim's own LV is grown", pv.Name))
	}
	lv, err := a.growRead(ctx, t)
	st.done("read")
	switch {
	case errors.Is(err, lvmbackend.ErrNotFound):
		return fail(kube.ReasonVolumeNotFound, fmt.Errorf("LV %s does not exist on node %s: nothing to grow", t, a.cfg.Node.Name))
	case errors.Is(err, lvmbackend.ErrUnknownDeviceClass):
		return fail(kube.ReasonUnknownVolumeGroup, fmt.Errorf("volume group %q (device class %q) is not served by lvmd on this node: %w", spec.VolumeGroup, t.deviceClass, err))
	case err != nil:
		return retry(err)
	}
	tag := OwnerTag(ref.UID)
	if !lv.HasTag(tag) {
		return fail(kube.ReasonNameConflict, fmt.Errorf("LV %s was not created by lvm-agent for claim %s/%s (no tag %s); it is left untouched", t, ref.Namespace, ref.Name, tag))
	}
	// An encrypted LV holds its header too, and the size answered is its
	// mapping's: grown after the LV (kubelet grows the filesystem on it).
	keyRef, encrypted := encryption(lv)
	if encrypted {
		spec.Size += luks2.DataOffset
	}
	if lv.SizeBytes >= spec.Size {
		if encrypted {
			return a.mappingGrown(ctx, lv, keyRef)
		}
		return expanded(lv.SizeBytes)
	}
	size, err := a.backend.ResizeVolume(ctx, t.deviceClass, t.name, spec.Size)
	st.done("lvmdResize")
	switch {
	case err == nil:
	case errors.Is(err, lvmbackend.ErrInsufficientCapacity):
		return fail(kube.ReasonInsufficientCapacity, fmt.Errorf("LV %s (%d bytes) cannot grow to %d bytes: %w; it is left as it was", t, lv.SizeBytes, spec.Size, err))
	case errors.Is(err, lvmbackend.ErrUnsupported):
		return fail(kube.ReasonResizeNotSupported, fmt.Errorf("LV %s cannot grow on node %s: %w", t, a.cfg.Node.Name, err))
	case errors.Is(err, lvmbackend.ErrNotFound):
		return fail(kube.ReasonVolumeNotFound, fmt.Errorf("LV %s went away during the grow: %w", t, err))
	case errors.Is(err, lvmbackend.ErrInvalidArgument):
		return fail(kube.ReasonInvalidSpec, err)
	default:
		return retry(err)
	}
	if size < spec.Size {
		return retry(fmt.Errorf("lvmd reports LV %s at %d bytes after a grow to %d; asking again", t, size, spec.Size))
	}
	if encrypted {
		lv.SizeBytes = size
		return a.mappingGrown(ctx, lv, keyRef)
	}
	return expanded(size)
}

// mappingGrown answers an encrypted LV's grow once its mapping has the LV's
// size (loaded again every time: a grow cut short after the LV's may have
// left it at the old one).
func (a *Agent) mappingGrown(ctx context.Context, lv *lvmbackend.Volume, ref kube.KeyRef) outcome {
	size, err := a.mapped(ctx, lv, ref, true)
	switch {
	case errors.Is(err, kube.ErrKeyUnavailable):
		return fail(kube.ReasonKeyUnavailable, fmt.Errorf("%w; LV %s/%s is grown, its mapping is not yet", err, lv.DeviceClass, lv.Name))
	case err != nil:
		return retry(err)
	}
	stepsOf(ctx).done("mapping")
	return expanded(size)
}

func expanded(size int64) outcome { return outcome{state: kube.StateExpanded, size: size} }

// growRead is the LV a grow is asked of. With shared reads, the class's
// kept listing (lvmbackend.Shared.Listed) answers when the kernel confirms
// it: the device-mapper device of the listed numbers has the LV's name, and
// the size is the device's own, read now (sysfs, readable unprivileged). So
// what the listing alone answers is the LV's tags, which only an lvchange
// alters, and the LV's identity is the kernel's: a grow starts no `lvs`.
// Otherwise (no listing younger than --lvmd-list-max-age, the LV inactive or
// not listed, a device that does not match) it reads a fresh listing, as a
// delete does.
func (a *Agent) growRead(ctx context.Context, t target) (*lvmbackend.Volume, error) {
	if a.shared != nil {
		if lv := a.shared.Listed(t.deviceClass, t.name); lv != nil {
			if size, ok := a.kernelSize(lv); ok {
				lv.SizeBytes = size
				return lv, nil
			}
		}
	}
	return a.backend.GetVolume(ctx, t.deviceClass, t.name)
}

// kernelSize is the size of lv's device-mapper device, when the device of
// lv's numbers is lv's: its name is LVM's for lv's path (/dev/VG/NAME).
func (a *Agent) kernelSize(lv *lvmbackend.Volume) (int64, bool) {
	rest, ok := strings.CutPrefix(lv.Path, "/dev/")
	vg, name, _ := strings.Cut(rest, "/")
	if !ok || lv.DevMajor == 0 || name != lv.Name {
		return 0, false
	}
	dir := filepath.Join(a.cfg.sysRoot, "/sys/dev/block", fmt.Sprintf("%d:%d", lv.DevMajor, lv.DevMinor))
	dmName, err := os.ReadFile(filepath.Join(dir, "dm", "name"))
	if err != nil || string(bytes.TrimSpace(dmName)) != lvmmeta.DMName(vg, lv.Name) {
		return 0, false
	}
	raw, err := os.ReadFile(filepath.Join(dir, "size"))
	if err != nil {
		return 0, false
	}
	sectors, err := strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 64)
	if err != nil || sectors <= 0 {
		return 0, false
	}
	return sectors * 512, true
}
