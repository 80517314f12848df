package devmapper

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// DefaultControlPath is where udev (or libdevmapper) puts the control node.
const DefaultControlPath = "/dev/mapper/control"

// Buffer sizes for replies that carry data. libdevmapper starts list and
// status queries at 16 KiB too, which fits a few hundred devices, so the
// retry on DM_BUFFER_FULL_FLAG is rare. The cap bounds what a confused or
// hostile reply can make us allocate; 32 MiB is far more than a list of
// tens of thousands of devices needs (a record is ~100-250 bytes).
const (
	initialBufferSize = 16 << 10
	maxBufferSize     = 32 << 20
)

// ioctlFunc performs one DM ioctl: req is the ioctl number, buf the whole
// dm_ioctl buffer (header + payload), updated in place by the kernel. It is
// a function value so tests can stand in for the kernel.
type ioctlFunc func(req uintptr, buf []byte) error

// Control is an open device-mapper control node. It is safe for concurrent
// use; ioctls on the control node do not share state between calls.
type Control struct {
	path   string
	ioctl  ioctlFunc
	close  func() error
	closed atomic.Bool
}

// Open opens the device-mapper control node at path (DefaultControlPath when
// empty) and checks that it answers as a 4.x interface. Failures are *Error
// with Kind ErrNoControl, ErrPermission or ErrUnsupported when the reason is
// known, so a caller can report "no device-mapper on this node" once and
// carry on without it.
func Open(path string) (*Control, error) {
	if path == "" {
		path = DefaultControlPath
	}
	ioctl, closeFn, err := openControl(path)
	if err != nil {
		return nil, err
	}
	c := newControl(path, ioctl, closeFn)
	// The kernel checks CAP_SYS_ADMIN and the interface version on every
	// ioctl, not at open, so a node we may open can still be useless to us.
	// One DM_VERSION now turns that into an Open error instead of a
	// surprise on the first real query.
	if err := c.checkVersion(context.Background()); err != nil {
		_ = c.Close()
		var e *Error
		if errors.As(err, &e) && e.Target == "" {
			e.Target = path
		}
		return nil, err
	}
	return c, nil
}

// newControl wires a Control around an ioctl function; tests use it with a
// fake kernel.
func newControl(path string, ioctl ioctlFunc, closeFn func() error) *Control {
	if closeFn == nil {
		closeFn = func() error { return nil }
	}
	return &Control{path: path, ioctl: ioctl, close: closeFn}
}

// Path is the control node this Control was opened on.
func (c *Control) Path() string { return c.path }

// Close releases the control node. Calls after the first return nil.
func (c *Control) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	return c.close()
}

// checkVersion is Version plus the refusal of a non-4.x kernel.
func (c *Control) checkVersion(ctx context.Context) error {
	v, err := c.Version(ctx)
	if err != nil {
		return err
	}
	if v.Major != interfaceMajor {
		return &Error{Op: "DM_VERSION", Kind: ErrUnsupported, Err: fmt.Errorf("kernel interface %s, want %d.x", v, interfaceMajor)}
	}
	return nil
}

// reply is a kernel answer: the buffer it was written into and its decoded
// header. release hands a pooled buffer back; nothing may keep a reference
// into buf afterwards (decoders copy strings out).
type reply struct {
	buf    []byte
	hdr    header
	pooled *[]byte
	// wipe: the request carried DM_SECURE_DATA_FLAG, so the buffer may
	// hold a key (a table we loaded, or a crypt table the kernel
	// returned); release zeroes it rather than leave it to the pool or
	// the garbage collector.
	wipe bool
}

func (r *reply) release() {
	if r.wipe {
		clear(r.buf)
	}
	if r.pooled != nil {
		bufferPool.Put(r.pooled)
		r.pooled = nil
	}
	r.buf = nil
}

// bufferPool recycles initial-size buffers: StatusAll issues one 16 KiB
// status query per device, and without reuse that is the bulk of its
// allocations. Grown buffers are not pooled; they are the rare case.
var bufferPool = sync.Pool{New: func() any {
	b := make([]byte, initialBufferSize)
	return &b
}}

func getBuffer(size int) ([]byte, *[]byte) {
	if size != initialBufferSize {
		return make([]byte, size), nil
	}
	p := bufferPool.Get().(*[]byte)
	clear(*p)
	return *p, p
}

// roundTrip sends one request, growing the buffer while the kernel says it
// did not fit (DM_BUFFER_FULL_FLAG), as libdevmapper does: the kernel then
// returns success with a partial or empty payload, and the only fix is to
// ask again with more room. The size doubles up to maxBufferSize. The
// reply is returned by value so a query costs no allocation of its own.
func (c *Control) roundTrip(ctx context.Context, req uintptr, r request, size int) (reply, error) {
	op := ioctlNames[req]
	for {
		if c.closed.Load() {
			return reply{}, &Error{Op: op, Target: r.name, Kind: ErrClosed}
		}
		if err := ctx.Err(); err != nil {
			return reply{}, err
		}
		var rep reply
		rep.buf, rep.pooled = getBuffer(size)
		rep.wipe = r.flags&flagSecureData != 0
		encodeRequest(rep.buf, r)
		err := c.ioctl(req, rep.buf)
		rep.hdr = decodeHeader(rep.buf)
		switch {
		case err != nil:
			rep.release()
			return reply{}, &Error{Op: op, Target: r.name, Kind: ioctlErrorKind(req, err, rep.hdr), Err: err}
		case rep.hdr.flags&flagBufferFull == 0:
			// The kernel copies back data_size bytes of what we offered,
			// so more than that is not a reply we can trust.
			if uint64(rep.hdr.dataSize) > uint64(size) {
				rep.release()
				return reply{}, malformed(op, r.name, "data_size %d exceeds the %d-byte buffer", rep.hdr.dataSize, size)
			}
			return rep, nil
		}
		rep.release()
		if size >= maxBufferSize {
			return reply{}, &Error{Op: op, Target: r.name, Kind: ErrReplyTooLarge, Err: fmt.Errorf("still full at %d bytes", size)}
		}
		size = min(size*2, maxBufferSize)
	}
}

// ioctlErrorKind maps the errnos dm-ioctl.c returns to the package's kinds.
func ioctlErrorKind(req uintptr, err error, hdr header) error {
	switch {
	case errors.Is(err, syscall.ENXIO):
		return ErrNotFound
	case errors.Is(err, syscall.EBUSY) && req == ioctlDevCreate:
		// dm_hash_insert: the name or the uuid is taken.
		return ErrExists
	case errors.Is(err, syscall.EBUSY):
		// DM_DEV_REMOVE of an open device; DM_TABLE_LOAD naming a
		// device someone else holds exclusively.
		return ErrBusy
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return ErrPermission
	case errors.Is(err, syscall.ENOTTY):
		return ErrUnsupported
	case errors.Is(err, syscall.EINVAL) && hdr.version.Major != 0 && hdr.version.Major != interfaceMajor:
		// check_version writes the kernel's version back even when it
		// rejects ours, so a foreign major is recognisable here.
		return ErrUnsupported
	case errors.Is(err, errControlClosed):
		return ErrClosed
	}
	return nil
}

// errControlClosed is what the platform ioctl returns once the file is
// closed underneath a call.
var errControlClosed = errors.New("control file closed")

// openErrorKind maps open(2) failures of the control node.
func openErrorKind(err error) error {
	switch {
	case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ENODEV), errors.Is(err, syscall.ENXIO):
		return ErrNoControl
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return ErrPermission
	}
	return nil
}

// checkName rejects names the kernel would truncate or misread: the name
// field is 128 bytes including its NUL.
func checkName(op, name string) error {
	var why string
	switch {
	case name == "":
		why = "empty"
	case len(name) > nameLen-1:
		why = fmt.Sprintf("%d bytes, at most %d", len(name), nameLen-1)
	case strings.IndexByte(name, 0) >= 0:
		why = "contains NUL"
	default:
		return nil
	}
	return &Error{Op: op, Target: name, Kind: ErrInvalidName, Err: errors.New(why)}
}
