package devmapper

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// The writes below exist for the devices the agent owns (the dm-crypt
// mappings over encrypted LVs): make one live, grow it, take it away.
// Each is a short sequence of single ioctls through roundTrip, like the
// reads. None of them sends a udev cookie (dm_ioctl.event_nr stays 0), so
// udev treats the uevents as spurious ones: it still adds the
// /dev/mapper/<name> link, but nobody can wait for that; callers use the
// major:minor that Create returns (where /dev is a devtmpfs, the kernel's
// own /dev/dm-N node exists by the time Create returns).

// maxTableSize bounds the DM_TABLE_LOAD buffer. A crypt or linear table is
// a few hundred bytes; a megabyte means a caller bug, not a table.
const maxTableSize = 1 << 20

// Create makes the device name (uuid may be empty), loads targets as its
// table and resumes it, so the device is live when Create returns; readOnly
// loads the table read-only. It returns the device's Info, whose
// Major:Minor name the block device.
//
// The sequence is DM_DEV_CREATE (name, uuid), DM_TABLE_LOAD (with
// DM_SECURE_DATA_FLAG, and DM_READONLY_FLAG when readOnly), DM_DEV_SUSPEND
// without DM_SUSPEND_FLAG (a resume, which makes the loaded table live). If
// a step after DM_DEV_CREATE fails, or ctx ends between steps, Create
// removes the device it made before returning that step's error. A name or
// uuid that is taken is an *Error with Kind ErrExists, and that device is
// left alone. Targets that cannot be sent are ErrInvalidTable before any
// ioctl. No error carries a target's Params.
func (c *Control) Create(ctx context.Context, name, uuid string, targets []Target, readOnly bool) (Info, error) {
	if err := checkNewName(name, uuid); err != nil {
		return Info{}, err
	}
	if err := validateTargets(name, targets); err != nil {
		return Info{}, err
	}
	r, err := c.roundTrip(ctx, ioctlDevCreate, request{name: name, uuid: uuid}, sizeofDmIoctl)
	if err != nil {
		return Info{}, err
	}
	r.release()

	info, err := c.loadAndResume(ctx, name, targets, readOnly)
	if err == nil {
		return info, nil
	}
	// The device is ours and never went live, so nothing should hold it
	// open (udev leaves dm devices alone until their first resume). The
	// removal runs even when ctx has ended, and takes a loaded table
	// with it.
	if rmErr := c.Remove(context.WithoutCancel(ctx), name); rmErr != nil {
		return Info{}, fmt.Errorf("%w; removing the half-made device also failed: %v", err, rmErr)
	}
	return Info{}, err
}

// loadAndResume is Create's DM_TABLE_LOAD and resume.
func (c *Control) loadAndResume(ctx context.Context, name string, targets []Target, readOnly bool) (Info, error) {
	if err := c.load(ctx, name, targets, readOnly); err != nil {
		return Info{}, err
	}
	return c.resume(ctx, name, 0)
}

// Reload replaces the table of the existing device name with targets and
// makes it live: used to grow a mapping after the LV under it grew. The
// device keeps its read-only state.
//
// The sequence is DM_TABLE_STATUS (the live table's length and read-only
// flag; DM_SECURE_DATA_FLAG set, since the device may be a crypt one),
// DM_TABLE_LOAD (DM_SECURE_DATA_FLAG), then one DM_DEV_SUSPEND without
// DM_SUSPEND_FLAG: a resume of a device with an inactive table makes the
// kernel suspend it, swap the tables and resume it inside that one ioctl.
// There is no separate suspend ioctl on purpose: if the agent died
// between a suspend and its resume, every I/O to the mounted filesystem
// would hang until someone resumed the device by hand.
//
// Flags of that resume, as cryptsetup's resize does: when the new table is
// longer than the live one, DM_SKIP_LOCKFS_FLAG and DM_NOFLUSH_FLAG. A
// grow keeps every existing sector where it was, so freezing the
// filesystem on top (lockfs) and flushing its dirty data buys nothing and
// would stall a busy volume for the length of a sync; the kernel still
// waits for in-flight I/O before it swaps tables. A table that is not
// longer (a shrink, or a retried Reload) gets the default: freeze and
// flush, so nothing in flight or cached is lost at the old end.
//
// If the load succeeds but the resume fails (or ctx ends in between), the
// inactive table, which holds the key, is cleared (DM_TABLE_CLEAR) and the
// device is resumed on its old table, in case the failed resume left it
// suspended.
func (c *Control) Reload(ctx context.Context, name string, targets []Target) error {
	if err := checkName("DM_TABLE_LOAD", name); err != nil {
		return err
	}
	if err := validateTargets(name, targets); err != nil {
		return err
	}
	live, err := c.tableStatus(ctx, name, flagNoFlush|flagSecureData)
	if err != nil {
		return err
	}
	var oldLen uint64
	for _, t := range live.Targets {
		oldLen += t.Length
	}
	last := targets[len(targets)-1]
	var resumeFlags uint32
	if last.Start+last.Length > oldLen {
		resumeFlags = flagSkipLockFS | flagNoFlush
	}
	if err := c.load(ctx, name, targets, live.Info.ReadOnly); err != nil {
		return err
	}
	if _, err := c.resume(ctx, name, resumeFlags); err != nil {
		return c.restore(ctx, name, err)
	}
	return nil
}

// Remove removes the device name (DM_DEV_REMOVE, no flags: the removal is
// not deferred). A device that is still open is an *Error with Kind
// ErrBusy, for the caller to retry later; a device that does not exist is
// ErrNotFound.
func (c *Control) Remove(ctx context.Context, name string) error {
	if err := checkName("DM_DEV_REMOVE", name); err != nil {
		return err
	}
	r, err := c.roundTrip(ctx, ioctlDevRemove, request{name: name}, sizeofDmIoctl)
	if err != nil {
		return err
	}
	r.release()
	return nil
}

// load sends targets as the device's inactive table (DM_TABLE_LOAD) with
// DM_SECURE_DATA_FLAG; the request buffer is zeroed after the call.
func (c *Control) load(ctx context.Context, name string, targets []Target, readOnly bool) error {
	flags := uint32(flagSecureData)
	if readOnly {
		flags |= flagReadOnly
	}
	r, err := c.roundTrip(ctx, ioctlTableLoad, request{name: name, flags: flags, targets: targets}, sizeofDmIoctl+tableSize(targets))
	if err != nil {
		return err
	}
	r.release()
	return nil
}

// resume is DM_DEV_SUSPEND without DM_SUSPEND_FLAG: it makes an inactive
// table live (suspending the device around the swap with flags' lockfs
// and flush choices) and resumes a suspended device.
func (c *Control) resume(ctx context.Context, name string, flags uint32) (Info, error) {
	r, err := c.roundTrip(ctx, ioctlDevSuspend, request{name: name, flags: flags}, sizeofDmIoctl)
	if err != nil {
		return Info{}, err
	}
	defer r.release()
	return infoFromHeader(r.hdr), nil
}

// restore undoes a load whose resume failed: DM_TABLE_CLEAR drops the
// inactive table (it holds the key, and a later resume would make it live
// unasked), then a plain resume brings the device back on its old table if
// the failed resume had suspended it (resuming a running device is a
// no-op). It runs even when ctx has ended.
func (c *Control) restore(ctx context.Context, name string, cause error) error {
	ctx = context.WithoutCancel(ctx)
	var errs []error
	if r, err := c.roundTrip(ctx, ioctlTableClear, request{name: name}, sizeofDmIoctl); err != nil {
		errs = append(errs, err)
	} else {
		r.release()
	}
	if _, err := c.resume(ctx, name, 0); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w; restoring the old table also failed: %v", cause, errors.Join(errs...))
	}
	return cause
}

// checkNewName is checkName plus what DM_DEV_CREATE refuses on top: a
// slash (the name becomes /dev/mapper/<name>), the names ".", ".." and
// "control", and a uuid the kernel would truncate.
func checkNewName(name, uuid string) error {
	const op = "DM_DEV_CREATE"
	if err := checkName(op, name); err != nil {
		return err
	}
	var why string
	switch {
	case strings.IndexByte(name, '/') >= 0:
		why = "contains '/'"
	case name == "." || name == ".." || name == "control":
		why = "reserved"
	case len(uuid) > uuidLen-1:
		why = fmt.Sprintf("uuid of %d bytes, at most %d", len(uuid), uuidLen-1)
	case strings.IndexByte(uuid, 0) >= 0:
		why = "uuid contains NUL"
	default:
		return nil
	}
	return &Error{Op: op, Target: name, Kind: ErrInvalidName, Err: errors.New(why)}
}

// validateTargets checks what the kernel would otherwise reject with a
// bare EINVAL, or what this encoding cannot carry: at least one target; a
// type of 1 to 15 bytes without NUL; params without NUL; targets that
// start at sector 0 and follow each other without gaps or overlaps, none
// empty; and a table that fits maxTableSize. Errors name the target by
// index and type, never by its params.
func validateTargets(name string, targets []Target) error {
	bad := func(format string, args ...any) error {
		return &Error{Op: "DM_TABLE_LOAD", Target: name, Kind: ErrInvalidTable, Err: fmt.Errorf(format, args...)}
	}
	if len(targets) == 0 {
		return bad("no targets")
	}
	var next uint64
	size := sizeofDmIoctl
	for i, t := range targets {
		switch {
		case t.Type == "" || len(t.Type) > targetTypeLen-1 || strings.IndexByte(t.Type, 0) >= 0:
			return bad("target %d: type of %d bytes, want 1 to %d without NUL", i, len(t.Type), targetTypeLen-1)
		case strings.IndexByte(t.Params, 0) >= 0:
			return bad("target %d (%s): params contain NUL", i, t.Type)
		case t.Start != next:
			return bad("target %d (%s) starts at sector %d, want %d: targets must cover the device from sector 0 without gaps", i, t.Type, t.Start, next)
		case t.Length == 0:
			return bad("target %d (%s) is empty", i, t.Type)
		case t.Length > ^uint64(0)-t.Start:
			return bad("target %d (%s): start + length overflows", i, t.Type)
		case len(t.Params) > maxTableSize:
			return bad("target %d (%s): params of %d bytes exceed %d", i, t.Type, len(t.Params), maxTableSize)
		}
		next = t.Start + t.Length
		size += specSize(t)
		if size > maxTableSize {
			return bad("table exceeds %d bytes at target %d", maxTableSize, i)
		}
	}
	return nil
}
