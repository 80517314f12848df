// Package lvmbackend is the agent's only way to touch LVM: a Backend talks to
// an lvmd daemon over gRPC (topolvm's lvmd on a unix socket, or google/lvmd
// over TCP) and turns the daemon's answers into typed errors the agent can act
// on. Nothing here forks LVM tools.
package lvmbackend

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// Typed errors. Every error a Backend returns wraps at most one of them, so
// that callers can decide between "retry", "fail the request" and "done".
var (
	// ErrNotFound: the logical volume does not exist.
	ErrNotFound = errors.New("logical volume not found")
	// ErrUnknownDeviceClass: lvmd has no such device class / volume group.
	ErrUnknownDeviceClass = errors.New("unknown device class")
	// ErrInsufficientCapacity: the volume group (or thin pool) has not enough free space.
	ErrInsufficientCapacity = errors.New("insufficient capacity")
	// ErrUnavailable: lvmd cannot be reached or timed out; retrying may help.
	ErrUnavailable = errors.New("lvmd unavailable")
	// ErrInvalidArgument: lvmd rejected the request itself (bad name, size, option class).
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrExists: lvcreate refused the name because an LV of that name is in
	// the volume group (perhaps one another device class of it lists).
	ErrExists = errors.New("logical volume exists")
	// ErrUnsupported: this lvmd dialect cannot do the operation at all
	// (google/lvmd has no resize); retrying never helps.
	ErrUnsupported = errors.New("not supported by this lvmd")
)

// Volume is one logical volume as lvmd reports it.
type Volume struct {
	DeviceClass string
	Name        string
	SizeBytes   int64
	Tags        []string
	// DevMajor and DevMinor are the device-mapper device numbers (0:0 when inactive or unknown).
	DevMajor, DevMinor uint32
	// Attr is lvm's lv_attr string when the dialect reports it ("" otherwise).
	Attr string
	// Origin is the LV this one is a snapshot of, and Pool the thin pool of a
	// thin volume, when the reader knows them ("" otherwise).
	Origin, Pool string
	// Path is the LV's device path on the node ("/dev/vg/lv") when the
	// dialect reports it ("" otherwise: topolvm's CreateLV does not).
	Path string
}

// HasTag reports whether the volume carries tag.
func (v *Volume) HasTag(tag string) bool { return slices.Contains(v.Tags, tag) }

// Plain reports whether lvm's lv_attr says the volume is a plain volume:
// linear or striped ('-' for its type) or thin ('V'), which lvremove takes
// alone. Anything else (a thin pool, an origin with snapshots, a snapshot, a
// mirror, raid, cache or VDO LV) is not. known is false when the dialect did
// not report lv_attr.
func (v *Volume) Plain() (plain, known bool) {
	if v.Attr == "" {
		return false, false
	}
	return v.Attr[0] == '-' || v.Attr[0] == 'V', true
}

// Active reports whether lvm's lv_attr says the volume's device is active:
// its fifth character, the state, is 'a' ('-' is inactive; the others are
// a device suspended, or present without a live table). known is false
// when the dialect did not report lv_attr.
func (v *Volume) Active() (active, known bool) {
	if len(v.Attr) < 5 {
		return false, false
	}
	return v.Attr[4] == 'a', true
}

// Thin reports whether the volume is a thin volume: in a pool, or lvm's
// lv_attr type 'V' (topolvm's lvmd names no pool; a dialect may report no
// lv_attr).
func (v *Volume) Thin() bool { return v.Pool != "" || len(v.Attr) > 0 && v.Attr[0] == 'V' }

// CreateRequest asks for a new logical volume.
type CreateRequest struct {
	DeviceClass string
	Name        string
	// SizeBytes must be a positive multiple of 4096.
	SizeBytes int64
	Tags      []string
	// OptionClass names an lvcreate option class of the daemon ("" for the device class default).
	OptionClass string
}

// SnapshotRequest asks for a thin snapshot of a thin volume, activated
// read-write: a new volume that starts with the source's data and is
// independent of it from then on (either may be removed).
type SnapshotRequest struct {
	DeviceClass string
	Name        string
	// Source is the thin volume of the same device class to snapshot.
	Source string
	// SizeBytes must be a positive multiple of 4096, at least the source's.
	SizeBytes int64
	Tags      []string
}

// Capacity is the size and free space of one device class.
type Capacity struct {
	DeviceClass string
	SizeBytes   uint64
	FreeBytes   uint64
	// Thin: the class makes thin volumes in a thin pool.
	Thin bool
	// ThinPool is the fill of a thin class's pool, where the daemon reports
	// it (topolvm's lvmd does; nil otherwise).
	ThinPool *ThinPoolUsage
}

// ThinPoolUsage is a thin pool's fill as lvmd reports it, in percent.
type ThinPoolUsage struct {
	DataPercent, MetadataPercent float64
}

// Backend is one lvmd dialect. Its reads answer as the node is after the
// call began, never from an earlier read: a reader that may take an older
// answer asks Shared's Within reads for one, with the bound on its age.
type Backend interface {
	// GetVolume returns the named volume, or an error wrapping ErrNotFound.
	GetVolume(ctx context.Context, deviceClass, name string) (*Volume, error)
	// ListVolumes returns every volume of a device class.
	ListVolumes(ctx context.Context, deviceClass string) ([]Volume, error)
	// CreateVolume creates a volume. It is not idempotent: lvmd fails for an
	// existing name (ErrExists, or lvm's own refusal). The agent lists the
	// device class before it creates (a claim owns at most one LV) and
	// judges a failed create by a GetVolume after it, which finds the LV an
	// interrupted earlier attempt made (agent.Agent's create).
	CreateVolume(ctx context.Context, req CreateRequest) (*Volume, error)
	// RemoveVolume removes a volume; a missing volume wraps ErrNotFound.
	RemoveVolume(ctx context.Context, deviceClass, name string) error
	// ResizeVolume grows a volume to at least sizeBytes (a positive multiple
	// of SizeUnit) and returns its size after LVM's rounding. A volume
	// already that large is left as it is (lvmd never shrinks); a missing
	// one wraps ErrNotFound, too little space ErrInsufficientCapacity, and
	// a dialect without resize ErrUnsupported.
	ResizeVolume(ctx context.Context, deviceClass, name string, sizeBytes int64) (int64, error)
	// SnapshotVolume makes a thin snapshot (SnapshotRequest). Like
	// CreateVolume it is not idempotent. A missing source wraps
	// ErrNotFound; a thick class or source, or a dialect without
	// snapshots, ErrUnsupported; too little room ErrInsufficientCapacity;
	// a size below the source's ErrInvalidArgument.
	SnapshotVolume(ctx context.Context, req SnapshotRequest) (*Volume, error)
	// Capacity reports every device class the daemon serves.
	Capacity(ctx context.Context) ([]Capacity, error)
	// WatchCapacity calls fn with the capacity of every device class at once
	// and after each change, until ctx ends or the stream fails.
	WatchCapacity(ctx context.Context, fn func([]Capacity)) error
	// Close releases the connection.
	Close() error
}

// Error is a Backend error: the operation, the typed cause and the daemon's message.
type Error struct {
	Op    string
	Kind  error
	Cause error
}

func (e *Error) Error() string {
	if e.Cause == nil {
		return fmt.Sprintf("%s: %v", e.Op, e.Kind)
	}
	return fmt.Sprintf("%s: %v", e.Op, e.Cause)
}

// Is matches the typed kind.
func (e *Error) Is(target error) bool { return e.Kind != nil && target == e.Kind }

// Unwrap exposes the daemon's error.
func (e *Error) Unwrap() error { return e.Cause }

// dialDefaults keep gRPC's reconnect backoff short: lvmd restarts are
// routine, and gRPC's default (up to 120 s between attempts) would leave
// every request failing long after lvmd is back.
func dialDefaults(creds credentials.TransportCredentials) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
}

// checkSize refuses what topolvm's lvmd refuses: a size that is not a
// positive multiple of SizeUnit.
func checkSize(size int64) error {
	if size <= 0 || size%SizeUnit != 0 {
		return fmt.Errorf("size %d is not a positive multiple of %d", size, SizeUnit)
	}
	return nil
}

// rpcError is the error mapping both dialects share: an error that is not a
// gRPC status is unavailable when it is the context's and untyped otherwise,
// and gRPC's codes for a daemon out of reach are unavailable. For any other
// code it returns a nil *Error, for the dialect to classify the status. The
// status is never nil (for a non-status error its message is err's text).
func rpcError(op string, err error) (*Error, *status.Status) {
	st, ok := status.FromError(err)
	if !ok {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return &Error{Op: op, Kind: ErrUnavailable, Cause: err}, st
		}
		return &Error{Op: op, Cause: err}, st
	}
	switch st.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted:
		return &Error{Op: op, Kind: ErrUnavailable, Cause: errors.New(st.Message())}, st
	}
	return nil, st
}
