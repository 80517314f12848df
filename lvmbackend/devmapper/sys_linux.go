//go:build linux

package devmapper

import (
	"errors"
	"io/fs"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// openControl opens the control node and returns the ioctl function bound
// to it. The fd is used through os.File's RawConn so that a Close racing
// with a query cannot make the ioctl hit a recycled descriptor.
func openControl(path string) (ioctlFunc, func() error, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0) // os adds O_CLOEXEC
	if err != nil {
		cause := err
		var pe *fs.PathError
		if errors.As(err, &pe) {
			cause = pe.Err // the path is already in Error.Target
		}
		return nil, nil, &Error{Op: "open", Target: path, Kind: openErrorKind(err), Err: cause}
	}
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, nil, &Error{Op: "open", Target: path, Err: err}
	}
	ioctl := func(req uintptr, buf []byte) error {
		var errno syscall.Errno
		cerr := rc.Control(func(fd uintptr) {
			for {
				_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, req, uintptr(unsafe.Pointer(&buf[0])))
				if errno != unix.EINTR {
					return
				}
			}
		})
		runtime.KeepAlive(buf)
		if cerr != nil {
			return errors.Join(errControlClosed, cerr)
		}
		if errno != 0 {
			return errno
		}
		return nil
	}
	return ioctl, f.Close, nil
}
