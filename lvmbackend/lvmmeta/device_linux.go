//go:build linux

package lvmmeta

import (
	"errors"
	"fmt"
	"io"
	"unsafe"

	"golang.org/x/sys/unix"
)

// directAlign is the alignment of every O_DIRECT read: offset, length and
// buffer address. 4096 covers both 512-byte and 4 KiB logical sectors.
const directAlign = 4096

// Device is a block device opened for reads that bypass the page cache:
// lvm writes metadata through its own descriptor with O_DIRECT, so a
// buffered read could return pages cached before lvm's last commit.
type Device struct {
	Path string
	fd   int
	size int64
}

// OpenDevice opens path read-only with O_DIRECT.
func OpenDevice(path string) (*Device, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	size, err := unix.Seek(fd, 0, io.SeekEnd)
	if err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("size of %s: %w", path, err)
	}
	return &Device{Path: path, fd: fd, size: size}, nil
}

// Size is the device's size in bytes.
func (d *Device) Size() int64 { return d.size }

// Close closes the device.
func (d *Device) Close() error { return unix.Close(d.fd) }

// alignedBuffer returns n bytes whose address is a multiple of directAlign.
func alignedBuffer(n int) []byte {
	b := make([]byte, n+directAlign)
	skip := (directAlign - int(uintptr(unsafe.Pointer(&b[0]))%directAlign)) % directAlign
	return b[skip : skip+n : skip+n]
}

// ReadAt reads len(p) bytes at off through an aligned buffer that covers
// the request rounded out to directAlign. Reading past the end of the
// device is io.EOF, as for a file.
func (d *Device) ReadAt(p []byte, off int64) (int, error) {
	b, err := d.window(off, len(p))
	n := copy(p, b)
	if err == nil && n < len(p) {
		err = io.EOF
	}
	return n, err
}

// window returns the n bytes at off (fewer at the end of the device) as a
// slice of the aligned buffer they were read into, which the caller then
// owns: the metadata text is read without a second copy.
func (d *Device) window(off int64, n int) ([]byte, error) {
	if off < 0 || off > d.size {
		return nil, fmt.Errorf("read %s at %d: %w", d.Path, off, io.EOF)
	}
	end := min(off+int64(n), d.size)
	start := off &^ (directAlign - 1)
	alignedEnd := (end + directAlign - 1) &^ (directAlign - 1)
	buf := alignedBuffer(int(alignedEnd - start))
	got := 0
	for got < len(buf) {
		m, err := unix.Pread(d.fd, buf[got:], start+int64(got))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read %s at %d: %w", d.Path, start+int64(got), err)
		}
		if m == 0 {
			break
		}
		got += m
	}
	return buf[off-start : max(off-start, min(int64(got), end-start))], nil
}
