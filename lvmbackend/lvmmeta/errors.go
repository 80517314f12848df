package lvmmeta

import (
	"errors"
	"fmt"
)

var (
	// ErrNoLabel: the device is not an LVM physical volume.
	ErrNoLabel = errors.New("no LVM label")
	// ErrCorrupt: on-disk structures are inconsistent or fail their
	// checksum; the reader refuses them instead of guessing.
	ErrCorrupt = errors.New("corrupt LVM metadata")
	// ErrUnsupported: valid metadata this reader does not interpret
	// (another label type, a shared or lockd VG, an unknown format version).
	ErrUnsupported = errors.New("unsupported LVM metadata")
	// ErrTooLarge: a size, count or depth exceeds Limits.
	ErrTooLarge = errors.New("LVM metadata exceeds the reader's limits")
	// ErrUnstable: the committed text kept moving while it was read.
	ErrUnstable = errors.New("LVM metadata changed during every read attempt")
)

// ChecksumError is a CRC mismatch; it wraps ErrCorrupt.
type ChecksumError struct {
	What      string
	Want, Got uint32
}

func (e *ChecksumError) Error() string {
	return fmt.Sprintf("%s checksum mismatch: on disk %#08x, computed %#08x", e.What, e.Want, e.Got)
}

// Unwrap makes errors.Is(err, ErrCorrupt) true.
func (e *ChecksumError) Unwrap() error { return ErrCorrupt }

func corrupt(what, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrCorrupt, what, fmt.Sprintf(format, args...))
}
