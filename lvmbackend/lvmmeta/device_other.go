//go:build !linux

package lvmmeta

import (
	"errors"
	"io"
)

// Device is a block device; reading LVM devices is Linux-only.
type Device struct {
	Path string
	io.ReaderAt
}

// OpenDevice fails off Linux.
func OpenDevice(path string) (*Device, error) { return nil, errors.ErrUnsupported }

// Size is 0 off Linux.
func (d *Device) Size() int64 { return 0 }

// Close does nothing off Linux.
func (d *Device) Close() error { return nil }
