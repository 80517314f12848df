package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/agent/luks2"
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
	size   int64  // with expanded: the LV's size in bytes
	// changed: the request changed while it was handled; no answer.
	changed bool
	// undo, with created: run when the answer does not land (made); gone
	// when it took the answer's place.
	undo func(context.Context) (out outcome, gone bool)
}

func final(state string) outcome { return outcome{state: state} }

func fail(reason string, err error) outcome {
	return outcome{state: kube.StateFailed, reason: reason, err: err}
}

func retry(err error) outcome { return outcome{err: err} }

// changed is the outcome of a request that changed, or went away, while it
// was handled: nothing is answered, and it is handled again as the API
// server has it now.
func changed() outcome { return outcome{changed: true} }

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
// The device class is listed first: a claim owns at most one LV, so an LV
// of ours for this PVC under another name (a renamed re-request) is a
// mismatch, not a reason for a second LV, and one under this name answers
// only if it is at least the asked size and whole (unfinished). lvmd's
// CreateLV is not idempotent, and the listing also makes a retry after a
// crash find its LV instead of reading "VG full" when the space is full of
// the very LV it asked for.
// The listing may be a shared one, up to --lvmd-list-max-age old: what it
// finds in the way is read again (again) before it is answered on.
// When lvcreate then fails, the failure is judged by a second look: our LV
// (made meanwhile by a killed agent's lvcreate) is judged as one found, a
// foreign one is a conflict, and only with no LV there does lvmd's error
// stand.
func (a *Agent) create(ctx context.Context, pvc *corev1.PersistentVolumeClaim, spec kube.CreateSpec, t target) outcome {
	if pvc.DeletionTimestamp != nil {
		return fail(kube.ReasonClaimTerminating, fmt.Errorf("PVC is being deleted (since %s); no LV is created for it", pvc.DeletionTimestamp.UTC().Format(time.RFC3339)))
	}
	st := stepsOf(ctx)
	tag := OwnerTag(pvc.UID)
	// An encrypted volume's key is read before anything is made: without
	// it the claim fails and nothing is left behind. Its LV holds the
	// header too (crypt.go).
	ref, encrypted, err := kube.EncryptionOf(spec.Tags)
	if err != nil {
		return fail(kube.ReasonInvalidSpec, err)
	}
	var key *kube.Key
	if encrypted {
		if key, err = a.key(ctx, ref); err != nil {
			if errors.Is(err, kube.ErrKeyUnavailable) {
				return fail(kube.ReasonKeyUnavailable, fmt.Errorf("%w; no LV is made", err))
			}
			return retry(err)
		}
		defer key.Clear()
		spec.Size += luks2.DataOffset
	}
	// A claim owns at most one LV on the node, so the other device classes
	// are read too (elsewhere). That runs beside this class's listing: a
	// create waits for the longer of the two, not for their sum (with
	// topolvm's lvmd each forks lvs: seconds on a loaded node). The answer
	// is the one they would give in turn: this class's findings first.
	type found struct {
		out outcome
		ok  bool
	}
	// A claim asked again after a create was answered (its volume.device
	// stays with the request) may have its LV from the node's other agent,
	// a rollout's second pod, made after this agent's kept listings began:
	// they would not show it, and a request under another name would get a
	// second LV. Its listings begin now.
	list := a.listWithin
	if pvc.Annotations[kube.AnnDevice] != "" {
		list = a.backend.ListVolumes
	}
	others := make(chan found, 1)
	go func() {
		out, ok := a.elsewhere(ctx, t, tag, list)
		others <- found{out, ok}
	}()
	lvs, err := list(ctx, t.deviceClass)
	st.done("lvmdList")
	switch {
	case errors.Is(err, lvmbackend.ErrUnknownDeviceClass):
		return fail(kube.ReasonUnknownVolumeGroup, fmt.Errorf("volume group %q (device class %q) is not served by lvmd on this node: %w", spec.VolumeGroup, t.deviceClass, err))
	case err != nil:
		return retry(err)
	}
	// done answers for the claim's LV, once made or found: a thick clone's
	// is filled from its source first, every time (a copy cut short by a
	// crash leaves no mark, so an LV found is copied again).
	done := func(lv *lvmbackend.Volume) outcome { return a.created(ctx, lv) }
	if encrypted {
		// A new LV holds nothing until an answer names it: its header is
		// written, and written again by an attempt that finds it made.
		format := pvc.Annotations[kube.AnnDevice] == "" && spec.Source == nil
		done = func(lv *lvmbackend.Volume) outcome { return a.sealed(ctx, lv, key, format) }
	}
	var src *lvmbackend.Volume
	copies := false
	if spec.Source != nil {
		var out outcome
		if src, out = a.cloneable(ctx, spec, t); src == nil {
			return out
		}
		if srcRef, srcEncrypted := encryption(src); srcEncrypted != encrypted || srcRef != ref {
			// A clone shares its source's header (a snapshot) or copies it.
			return fail(kube.ReasonCloneNotSupported, fmt.Errorf("the clone's source LV %s/%s is %s, and the clone's class asks for %s: a clone keeps its source's encryption and key; no LV is made",
				t.deviceClass, src.Name, encryptionText(srcEncrypted, srcRef), encryptionText(encrypted, ref)))
		}
		if copies = spec.Source.Kind == kube.CloneCopy; copies {
			sealed := done
			done = func(lv *lvmbackend.Volume) outcome {
				if out := a.fill(ctx, pvc, src, lv); out.state != kube.StateCreated || !encrypted {
					return out
				}
				return sealed(lv)
			}
		}
	}
	// foundDone answers for the claim's LV found made, not by this attempt's
	// lvcreate: unless it is half made or may hold old bytes (unfinished).
	foundDone := func(lv *lvmbackend.Volume) outcome {
		if out, cut := a.unfinished(ctx, pvc, lv, copies); cut {
			return out
		}
		if out, ok := a.zeroingPool(ctx, pvc, lv); !ok {
			return out
		}
		return done(lv)
	}
	for i := range lvs {
		if lvs[i].Name != t.name && !lvs[i].HasTag(tag) {
			continue
		}
		lv, err := a.again(ctx, t.deviceClass, lvs[i].Name)
		switch {
		case err != nil:
			return retry(err)
		case lv == nil:
			continue
		}
		if out, found := a.existing(lv, spec, t, tag, foundDone); found {
			return out
		}
	}
	if f := <-others; f.ok {
		return f.out
	}
	st.done("checks")
	// Only the claim as the API server has it now gets an LV, not the one an
	// informer last showed: that may have been answered by another agent of
	// the node, its LV made and removed, and the claim deleted meanwhile
	// (issue 29: an LV left after "deleted").
	switch now, err := a.claimNow(ctx, pvc); {
	case err != nil:
		return retry(err)
	case now == nil || now.ResourceVersion != pvc.ResourceVersion:
		return changed()
	}
	st.done("claimCheck")
	req := lvmbackend.CreateRequest{DeviceClass: t.deviceClass, Name: t.name, SizeBytes: spec.Size,
		Tags: append(append([]string(nil), spec.Tags...), tag)}
	if spec.Striping {
		req.OptionClass = a.cfg.StripedOptionClass
	}
	if src != nil {
		// At least the source's size: the LV LVM made for a claim of the
		// same size may be up to an extent larger than the claim asked.
		req.SizeBytes = max(spec.Size, src.SizeBytes)
	}
	var vol *lvmbackend.Volume
	var createErr error
	if spec.Source != nil && spec.Source.Kind == kube.CloneSnapshot {
		vol, createErr = a.backend.SnapshotVolume(ctx, lvmbackend.SnapshotRequest{DeviceClass: t.deviceClass, Name: t.name,
			Source: src.Name, SizeBytes: req.SizeBytes, Tags: req.Tags})
	} else {
		vol, createErr = a.backend.CreateVolume(ctx, req)
	}
	st.done("lvmdCreate")
	if createErr == nil {
		if out, ok := a.zeroingPool(ctx, pvc, vol); !ok {
			return out
		}
		return a.made(ctx, pvc, vol, t, done, copies)
	}
	if errors.Is(createErr, lvmbackend.ErrUnavailable) {
		return retry(createErr)
	}
	lv, err := a.backend.GetVolume(ctx, t.deviceClass, t.name)
	switch {
	case err == nil:
		if out, found := a.existing(lv, spec, t, tag, foundDone); found {
			return out
		}
		return retry(createErr)
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
	case errors.Is(createErr, lvmbackend.ErrUnsupported):
		return fail(kube.ReasonCloneNotSupported, fmt.Errorf("%w: no LV is made", createErr))
	case errors.Is(createErr, lvmbackend.ErrNotFound):
		// Only a snapshot answers NotFound for a class it listed: the source.
		return fail(kube.ReasonVolumeNotFound, fmt.Errorf("the clone's source went away: %w", createErr))
	case errors.Is(createErr, lvmbackend.ErrExists):
		// The name is taken in the volume group by an LV this device class
		// does not list (a thin LV, when a thick class is asked).
		return fail(kube.ReasonNameConflict, fmt.Errorf("%w: the name is held by an LV outside device class %q; it is left untouched", createErr, t.deviceClass))
	}
	return retry(createErr)
}

// cloneable reads a clone's source afresh (its tags say whose data it
// holds, and a copy reads its device): only an LV that lvm-agent made for a
// claim is copied (never a foreign
// LV's data into a claim), and only by the kinds this agent makes (a copy
// needs the kernel's open counts). The source is nil with the answer
// otherwise.
func (a *Agent) cloneable(ctx context.Context, spec kube.CreateSpec, t target) (*lvmbackend.Volume, outcome) {
	src := spec.Source
	if src.Kind == kube.CloneCopy && a.cfg.openCounts == nil {
		return nil, fail(kube.ReasonCloneNotSupported, fmt.Errorf("this agent makes no thick copy: it cannot read device-mapper (it needs privileged: true) to see that the source is not in use; no LV is made"))
	}
	lv, err := a.again(ctx, t.deviceClass, src.Name)
	switch {
	case err != nil:
		return nil, retry(err)
	case lv == nil:
		return nil, fail(kube.ReasonVolumeNotFound, fmt.Errorf("the clone's source LV %s/%s does not exist; no LV is made", t.deviceClass, src.Name))
	}
	if _, ok := OwnerUID(lv); !ok {
		return nil, fail(kube.ReasonNameConflict, fmt.Errorf("the clone's source LV %s/%s was not made by lvm-agent for a claim; it is not copied", t.deviceClass, src.Name))
	}
	return lv, outcome{}
}

// again reads an LV afresh (nil when there is none): a create's listing may
// be up to --lvmd-list-max-age old (lvmbackend.Shared), so it decides alone
// only that nothing stands in the way, which lvcreate checks again (it
// refuses a name that is taken). Whatever the listing shows in the way (an
// LV of the name, an LV of the claim) is read again before the create is
// answered on it, and so is a clone's source: the node's other agent, or an
// operator, may have made, changed or removed it since.
// Those are the rare creates (a retry, a re-request, a clone); the others
// read no listing of their own.
func (a *Agent) again(ctx context.Context, deviceClass, name string) (*lvmbackend.Volume, error) {
	lv, err := a.backend.GetVolume(ctx, deviceClass, name)
	if errors.Is(err, lvmbackend.ErrNotFound) {
		return nil, nil
	}
	return lv, err
}

// existing judges an LV already there for a create: found is false when lv
// neither has the asked name nor belongs to this claim.
func (a *Agent) existing(lv *lvmbackend.Volume, spec kube.CreateSpec, t target, tag string, done func(*lvmbackend.Volume) outcome) (out outcome, found bool) {
	ours := lv.HasTag(tag)
	switch {
	case lv.Name != t.name && !ours:
		return outcome{}, false
	case !ours:
		return fail(kube.ReasonNameConflict, fmt.Errorf("LV %s exists and was not created by lvm-agent for this PVC (no tag %s); it is left untouched", t, tag)), true
	case lv.Name != t.name:
		return fail(kube.ReasonVolumeMismatch, fmt.Errorf("this PVC already has LV %s/%s; a claim owns at most one LV, so none is made under the name %q", t.deviceClass, lv.Name, t.name)), true
	case lv.SizeBytes < spec.Size:
		return fail(kube.ReasonVolumeMismatch, fmt.Errorf("LV %s of this PVC is %d bytes, smaller than the %d asked; it is not resized", t, lv.SizeBytes, spec.Size)), true
	}
	return done(lv), true
}

// elsewhere finds this claim's LV in the node's other device classes: a
// claim owns at most one LV on a node, so a re-request for another volume
// group is refused, not answered with a second LV. A class that cannot be
// listed for any reason but lvmd being down (google/lvmd cannot list a VG
// that holds a thin pool) is logged and passed over, so that it cannot
// block every create on the node. list reads each class (the create's).
func (a *Agent) elsewhere(ctx context.Context, t target, tag string, list func(context.Context, string) ([]lvmbackend.Volume, error)) (outcome, bool) {
	caps, err := a.capacityWithin(ctx)
	if err != nil {
		return retry(err), true
	}
	for _, c := range caps {
		if c.DeviceClass == t.deviceClass {
			continue
		}
		lvs, err := list(ctx, c.DeviceClass)
		switch {
		case errors.Is(err, lvmbackend.ErrUnavailable):
			return retry(err), true
		case err != nil:
			klog.ErrorS(err, "Device class not checked for a second LV of the claim", "deviceClass", c.DeviceClass, "lv", t)
			continue
		}
		for _, lv := range lvs {
			if !lv.HasTag(tag) {
				continue
			}
			switch lv, err := a.again(ctx, c.DeviceClass, lv.Name); {
			case err != nil:
				return retry(err), true
			case lv != nil && lv.HasTag(tag):
				return fail(kube.ReasonVolumeMismatch, fmt.Errorf("this PVC already has LV %s/%s; a claim owns at most one LV on a node, so none is made in device class %q", c.DeviceClass, lv.Name, t.deviceClass)), true
			}
		}
	}
	return outcome{}, false
}

// remove deletes a PV's LV if, and only if, it is ours to delete: a plain
// volume without dependents, and no live claim's.
func (a *Agent) remove(ctx context.Context, pv *corev1.PersistentVolume, t target) outcome {
	st := stepsOf(ctx)
	lv, err := a.backend.GetVolume(ctx, t.deviceClass, t.name)
	st.done("read")
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
	if out, ok := a.plain(ctx, lv, t); !ok {
		return out
	}
	st.done("checks")
	if out, ok := a.claimGone(ctx, pv, lv, t); !ok {
		return out
	}
	st.done("claimCheck")
	if _, encrypted := encryption(lv); encrypted {
		// Crypto-erase first: from here on nothing opens the volume, however
		// long the wipe takes or whatever cuts the delete short.
		if err := a.erase(ctx, lv); err != nil {
			return retry(err)
		}
		st.done("erase")
	}
	if out, ok := a.wipeBeforeRemove(ctx, pv, lv, t); !ok {
		return out
	}
	dmName := a.cfg.Devices.name(ctx, lv)
	err = a.backend.RemoveVolume(ctx, t.deviceClass, t.name)
	st.done("lvmdRemove")
	if err == nil || errors.Is(err, lvmbackend.ErrNotFound) {
		defer st.done("deviceCheck")
		if !a.cfg.Devices.gone(ctx, dmName) {
			// LVM no longer knows the LV; the kernel still has its device.
			klog.ErrorS(nil, "LV removed, but its device-mapper device is still present", "lv", t, "device", dmName)
		}
		return final(kube.StateDeleted)
	}
	return retry(err)
}

// plain checks that lvremove would take lv alone: lvmd removes with -f,
// which takes an origin's snapshots and a thin pool's thin LVs with it. When
// the dialect reports no lv_attr, the device class is listed for LVs that
// name lv as their origin or pool.
func (a *Agent) plain(ctx context.Context, lv *lvmbackend.Volume, t target) (outcome, bool) {
	plain, known := lv.Plain()
	if known && !plain {
		return fail(kube.ReasonNotPlainVolume, fmt.Errorf("LV %s is not a plain volume (lv_attr %s): removing it would remove more than one volume, or LVM's own sub-volumes; it is left untouched", t, lv.Attr)), false
	}
	if known {
		return outcome{}, true
	}
	// The listing remove's GetVolume has just read (it is kept): as fresh
	// as lv itself.
	lvs, err := a.listWithin(ctx, t.deviceClass)
	if err != nil {
		return retry(err), false
	}
	for _, o := range lvs {
		if o.Origin == lv.Name || o.Pool == lv.Name {
			return fail(kube.ReasonNotPlainVolume, fmt.Errorf("LV %s has dependents (%s); it is left untouched", t, o.Name)), false
		}
	}
	return outcome{}, true
}

// claimGone checks, against the API server, that no PVC owns lv any more: a
// delete while one does would take a live claim's data (a mistyped
// "lvm-agent volume delete", a provisioner bug, a PV with no claimRef or
// one without a UID). A cluster deletes the claim, releases the PV, and
// only then asks for the delete. The owner is the UID of lv's ownership
// tag; a claimRef with that UID and a name is a Get of that PVC (a PVC's
// name never changes), anything else a paged list of the PVCs. An untagged
// LV (--allow-untagged-delete) has only the claimRef to go by.
func (a *Agent) claimGone(ctx context.Context, pv *corev1.PersistentVolume, lv *lvmbackend.Volume, t target) (outcome, bool) {
	ref := pv.Spec.ClaimRef
	uid, tagged := OwnerUID(lv)
	if !tagged {
		if ref == nil || ref.UID == "" || ref.Name == "" {
			return outcome{}, true
		}
		uid = string(ref.UID)
	}
	var owner string
	if ref != nil && ref.Name != "" && string(ref.UID) == uid {
		gctx, cancel := context.WithTimeout(ctx, a.cfg.OpTimeout)
		pvc, err := a.client.PVCs(ref.Namespace).Get(gctx, ref.Name, metav1.GetOptions{})
		cancel()
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return retry(fmt.Errorf("check that claim %s/%s is gone: %w", ref.Namespace, ref.Name, err)), false
		case string(pvc.UID) == uid:
			owner = "PVC " + ref.Namespace + "/" + ref.Name
		} // else another claim of that name since
	} else {
		refs, err := a.liveRefs(ctx, false)
		if err != nil {
			return retry(fmt.Errorf("check that no PVC of UID %s exists: %w", uid, err)), false
		}
		owner = refs.Claim(uid)
	}
	if owner == "" {
		return outcome{}, true
	}
	return fail(kube.ReasonClaimInUse, fmt.Errorf("%s (UID %s), the owner of LV %s, still exists: the LV is left untouched; delete the claim first", owner, uid, t)), false
}

// claimNow reads pvc from the API server (a consistent read): nil when it
// is gone or another claim has its name now.
func (a *Agent) claimNow(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (*corev1.PersistentVolumeClaim, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.OpTimeout)
	defer cancel()
	now, err := a.client.PVCs(pvc.Namespace).Get(ctx, pvc.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read claim %s/%s around its lvcreate: %w", pvc.Namespace, pvc.Name, err)
	case now.UID != pvc.UID:
		return nil, nil
	}
	return now, nil
}

// made is the answer for the LV this create has just made (done: filled
// first, for a thick clone). If the claim went away, began to be deleted
// or moved on to another request or answer while the lvcreate was on its
// way (a call held by lvmd or the VG lock), the LV is removed again, since
// no answer names it (judgeMade).
//
// The claim is not read again for that: the answer is a merge patch
// conditional on the version the claim had when it was read just before
// the lvcreate (create's claimNow), so it lands only if the claim did not
// change, go away or begin to be deleted since; when it does not land, the
// answer's undo judges the LV (Agent.answer). One API read less on every
// create's path. A thick clone is judged first: its copy takes minutes,
// which a claim that went away does not get.
func (a *Agent) made(ctx context.Context, pvc *corev1.PersistentVolumeClaim, vol *lvmbackend.Volume, t target, done func(*lvmbackend.Volume) outcome, copies bool) outcome {
	st := stepsOf(ctx)
	if copies {
		if out, gone := a.judgeMade(ctx, pvc, vol, t, ""); gone {
			return out
		}
	}
	out := done(vol)
	st.done("device")
	if copies {
		return out
	}
	if out.state != kube.StateCreated {
		// No answer to make conditional (the device not active yet).
		if u, gone := a.judgeMade(ctx, pvc, vol, t, ""); gone {
			return u
		}
		return out
	}
	out.undo = func(ctx context.Context) (outcome, bool) { return a.judgeMade(ctx, pvc, vol, t, out.device) }
	return out
}

// judgeMade reads the claim whose LV was just made (device: the path its
// answer names, "" when not known yet). gone is false while the claim lives,
// is not being deleted and still carries the request the LV was made for.
// Otherwise the LV is removed and the request handled as it is now (gone,
// answered ClaimTerminating, or as it asks now), with two exceptions that
// keep it: a protected tag, and a claim that says created with this LV (or
// is being deleted and says created): the node's other agent, a rollout's
// second pod, listed the LV in between and answered with it, and a Pod may
// hold such a claim (pvc-protection keeps it while one does). A request
// answered otherwise meanwhile (the other agent's failed, say, or created
// with another LV), or re-asked for another LV, names no LV this agent
// made: kept, it would be a second LV of the claim. When the claim cannot
// be read, the LV stays and the create is retried: the next attempt finds
// the LV by its tag.
func (a *Agent) judgeMade(ctx context.Context, pvc *corev1.PersistentVolumeClaim, vol *lvmbackend.Volume, t target, device string) (out outcome, gone bool) {
	st := stepsOf(ctx)
	now, err := a.claimNow(ctx, pvc)
	st.done("claimCheckAfter")
	switch {
	case err != nil:
		return retry(err), true
	case now != nil && now.DeletionTimestamp == nil && !requestChanged(pvc, now):
		return outcome{}, false
	case vol.HasTag(ProtectedTag):
		klog.InfoS("Claim went away or moved on while its LV was made; the LV is tagged protected and stays", "request", klog.KObj(pvc), "lv", t)
		return changed(), true
	case now != nil && now.Annotations[kube.AnnLifecycle] == kube.StateCreated &&
		(now.DeletionTimestamp != nil || device == "" || now.Annotations[kube.AnnDevice] == device):
		klog.InfoS("Another agent answered the claim with the LV just made; the LV stays", "request", klog.KObj(pvc), "lv", t)
		return changed(), true
	}
	if err := a.removeLV(ctx, vol); err != nil {
		return retry(fmt.Errorf("claim went away or moved on while its LV %s was made; removing the LV: %w", t, err)), true
	}
	klog.InfoS("Claim went away or moved on while its LV was made; LV removed", "request", klog.KObj(pvc), "lv", t)
	return changed(), true
}

// created is the answer for the claim's LV, once the kernel confirms its
// device is active (when device-mapper is readable).
func (a *Agent) created(ctx context.Context, lv *lvmbackend.Volume) outcome {
	if err := a.cfg.Devices.confirmActive(ctx, lv); err != nil {
		return retry(err)
	}
	device, err := a.devicePath(ctx, lv)
	if err != nil {
		return retry(err)
	}
	return outcome{state: kube.StateCreated, device: device}
}

// half reports whether lvm lists an LV without a live device: lv_attr's
// state '-' (inactive: no device-mapper device), 'i' (an inactive table
// only) or 'd' (no table). An lvcreate killed with lvmd's container leaves
// its LV so when the kill falls between its commit and the device's resume
// (/dev/VG/LV is made after the resume). lvmd has no call that activates it,
// so the answer would name a path that never appears, and kubelet's mount
// fails for good. An lvcreate still running holds the volume group's lock,
// which the lvs behind a listing waits for, so a listing never shows one
// midway. The direct metadata reader shows all three as '-'.
func half(lv *lvmbackend.Volume) bool {
	return len(lv.Attr) >= 5 && strings.IndexByte("-id", lv.Attr[4]) >= 0
}

// unfinished judges the claim's LV found made (not by this attempt's own
// lvcreate, whose success lvmd reported) and reports cut when it is not to
// be answered with:
//   - half made (half);
//   - a thick LV, unless a copy fills it: lvcreate wipes the first blocks
//     of a new LV after it activates it, so one cut short in between
//     leaves a live LV holding what its extents held before, another
//     volume's filesystem, which kubelet would mount (or fail to fsck for
//     good). Nothing in LVM tells the two apart. (A thin LV reads zeros
//     where nothing was written.)
//
// A claim asked again after an answer (its volume.device stays) has its
// LV judged only for the first: the answer named a whole LV.
// Such an LV is removed through lvmd and the request's next attempt makes
// it again, as long as no answer ever named it (then it never held data):
// first the error is written on the claim, conditional on the version
// read, so that an answer of the node's other agent (a rollout's second
// pod) that named it since wins and the LV stays, and one that agent is
// about to write does not land. One tagged protected,
// and one of a claim asked again after an answer (it may hold a PV's
// data), are left as they are, their request open with the error.
func (a *Agent) unfinished(ctx context.Context, pvc *corev1.PersistentVolumeClaim, lv *lvmbackend.Volume, copies bool) (out outcome, cut bool) {
	answered := pvc.Annotations[kube.AnnDevice] != ""
	var what error
	switch {
	case half(lv):
		what = fmt.Errorf("LV %s/%s is half made, as an interrupted lvcreate leaves one: it has no live device (lv_attr %s)", lv.DeviceClass, lv.Name, lv.Attr)
	case !lv.Thin() && !copies && !answered:
		what = fmt.Errorf("thick LV %s/%s was found made, not by this request's own lvcreate: one cut short before it wiped the LV's first blocks leaves another volume's bytes there", lv.DeviceClass, lv.Name)
	default:
		return outcome{}, false
	}
	switch {
	case lv.HasTag(ProtectedTag):
		return retry(fmt.Errorf("%w; it is tagged %s and is left as it is", what, ProtectedTag)), true
	case answered:
		return retry(fmt.Errorf("%w; the claim was answered with a device before, so the LV may hold its data and is left as it is", what)), true
	}
	// The mark names its moment: the node's other agent may have written
	// the same words at the same version, then made the LV again, and a
	// patch that changes nothing leaves the version as it was, which would
	// let that agent's answer land on a claim whose LV this agent removes
	// (the chaos suite, seed 1). A write that still moved nothing fences
	// nothing: the claim is read again.
	msg := fmt.Sprintf("%v; no answer named it, so it held no data: it is removed and made again (%s)", what, time.Now().UTC().Format(time.RFC3339Nano))
	k := Key{Kind: KindPVC, Namespace: pvc.Namespace, Name: pvc.Name}
	stored, err := a.patch(ctx, k, pvc.ResourceVersion, kube.Change{kube.AnnError: &msg})
	switch {
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		return changed(), true
	case err != nil:
		return retry(fmt.Errorf("%w; recording its removal: %v", what, err)), true
	case stored == pvc.ResourceVersion:
		return changed(), true
	}
	if err := a.removeLV(ctx, lv); err != nil {
		return retry(fmt.Errorf("%w; removing it: %v", what, err)), true
	}
	klog.InfoS("LV found made removed, to be made again", "lv", lv.DeviceClass+"/"+lv.Name, "why", what)
	return changed(), true // the error is on the claim; the next attempt makes the LV
}

// zeroingPool checks that an LV just made or found made, not yet answered,
// if it is thin (its device-mapper table says so: lvmd's CreateLV answers
// with no lv_attr), is in a pool that zeroes new chunks: in one that does not
// (lvcreate -Z n, or lvchange -Z n since), a new volume reads whatever
// a deleted one left in the chunks it is given. Such an LV is removed
// (no answer named it, so it holds nothing) and the claim fails with
// PoolNotZeroing, unless it carries kube.NoWipeTag (its class said
// wipe: none). A claim answered before keeps its LV: it may hold data.
// Without device-mapper the pool cannot be read, and the Node says so
// (no "wipe"), so no class that asks for zeros is sent here.
func (a *Agent) zeroingPool(ctx context.Context, pvc *corev1.PersistentVolumeClaim, lv *lvmbackend.Volume) (outcome, bool) {
	// Without device numbers (a dialect that reports none) the kernel
	// cannot be asked, as created's check of the device cannot.
	if lv.HasTag(kube.NoWipeTag) || a.cfg.Devices == nil || pvc.Annotations[kube.AnnDevice] != "" || lv.DevMajor == 0 && lv.DevMinor == 0 {
		return outcome{}, true
	}
	thin, zeroes, err := a.cfg.Devices.poolZeroes(ctx, lv)
	switch {
	case err != nil:
		return retry(err), false
	case !thin || zeroes:
		return outcome{}, true
	}
	what := fmt.Errorf("the thin pool of LV %s/%s does not zero new chunks (lvchange -Z y turns it on), so a new volume could read a deleted one's bytes; the class's wipe: none accepts that", lv.DeviceClass, lv.Name)
	if err := a.removeLV(ctx, lv); err != nil {
		return retry(fmt.Errorf("%w; removing the LV made: %v", what, err)), false
	}
	klog.InfoS("Thin LV refused: its pool does not zero new chunks; LV removed", "request", klog.KObj(pvc), "lv", lv.DeviceClass+"/"+lv.Name)
	return fail(kube.ReasonPoolNotZeroing, what), false
}
