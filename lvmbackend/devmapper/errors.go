package devmapper

import (
	"errors"
	"fmt"
)

// Sentinel kinds. Every error this package returns from a kernel operation is
// an *Error whose Kind is at most one of these, so callers decide with
// errors.Is without parsing strings or errnos.
var (
	// ErrNoControl: the control node does not exist or no device-mapper
	// driver is behind it (ENOENT, ENODEV, ENXIO on open). Expected on nodes
	// without dm-mod; the agent logs it once and carries on.
	ErrNoControl = errors.New("device-mapper control node missing")
	// ErrPermission: the node exists but this process may not use it
	// (EACCES/EPERM on open, or on the first ioctl when CAP_SYS_ADMIN is
	// missing, which the kernel checks per ioctl rather than at open).
	ErrPermission = errors.New("device-mapper control node not accessible")
	// ErrUnsupported: the node is not a device-mapper control node (ENOTTY)
	// or the kernel speaks an interface other than 4.x.
	ErrUnsupported = errors.New("device-mapper interface not supported")
	// ErrNotFound: no device with that name (ENXIO from a device ioctl).
	// Devices come and go; StatusAll skips the ones that vanished.
	ErrNotFound = errors.New("device-mapper device not found")
	// ErrInvalidName: the name cannot be sent to the kernel (empty, too
	// long for dm_ioctl.name, or containing NUL).
	ErrInvalidName = errors.New("invalid device-mapper device name")
	// ErrReplyTooLarge: the kernel still reported DM_BUFFER_FULL_FLAG with
	// the largest buffer this package is willing to allocate.
	ErrReplyTooLarge = errors.New("device-mapper reply exceeds buffer cap")
	// ErrMalformed: the kernel reply does not have the layout the ABI
	// promises (offsets out of range, missing terminators).
	ErrMalformed = errors.New("malformed device-mapper reply")
	// ErrInvalidStatus: a target status or table string does not parse.
	ErrInvalidStatus = errors.New("invalid device-mapper target status")
	// ErrClosed: the Control was closed.
	ErrClosed = errors.New("device-mapper control closed")
	// ErrBusy: the device is in use (EBUSY): Remove of a device that is
	// still open (mounted, or held by a process or another mapping), or a
	// table naming a device someone else holds exclusively. Worth retrying
	// once the holder lets go; udev's probe after a change event is a
	// common short-lived holder.
	ErrBusy = errors.New("device-mapper device busy")
	// ErrExists: Create found a device with that name or uuid (EBUSY from
	// DM_DEV_CREATE). Create leaves that device alone.
	ErrExists = errors.New("device-mapper device already exists")
	// ErrInvalidTable: the targets given to Create or Reload cannot be
	// sent to the kernel (see validateTargets); nothing was sent.
	ErrInvalidTable = errors.New("invalid device-mapper table")
)

// ErrNotThinPool is the cause (Error.Err, not a Kind) when ThinPoolZeroing
// finds no active device with a thin-pool target under the names LVM uses
// for the pool; the Kind of that error is ErrNotFound, so errors.Is
// matches both.
var ErrNotThinPool = errors.New("no thin-pool target")

// Error is the error type of every kernel-facing operation.
type Error struct {
	// Op is "open" or the ioctl name (e.g. "DM_TABLE_STATUS").
	Op string
	// Target is the control path for "open", the device name for device
	// ioctls, and empty otherwise.
	Target string
	// Kind is one of the sentinel errors above, or nil.
	Kind error
	// Err is the underlying cause (usually a syscall.Errno), or nil.
	Err error
}

func (e *Error) Error() string {
	msg := "devmapper: " + e.Op
	if e.Target != "" {
		msg += " " + e.Target
	}
	switch {
	case e.Kind != nil && e.Err != nil:
		return fmt.Sprintf("%s: %v: %v", msg, e.Kind, e.Err)
	case e.Kind != nil:
		return fmt.Sprintf("%s: %v", msg, e.Kind)
	case e.Err != nil:
		return fmt.Sprintf("%s: %v", msg, e.Err)
	}
	return msg
}

// Unwrap exposes both the kind and the cause, so errors.Is works for
// ErrNotFound as well as for syscall.ENXIO or fs.ErrNotExist.
func (e *Error) Unwrap() []error {
	var errs []error
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

func malformed(op, target, format string, args ...any) error {
	return &Error{Op: op, Target: target, Kind: ErrMalformed, Err: fmt.Errorf(format, args...)}
}

func invalidStatus(target, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidStatus, target, fmt.Sprintf(format, args...))
}
