package devmapper

import (
	"context"
	"fmt"
)

// Version is a device-mapper ioctl interface version (not the kernel
// release): "4.48.0" on a 6.x kernel.
type Version struct {
	Major, Minor, Patch uint32
}

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// AtLeast reports whether v is major.minor or newer.
func (v Version) AtLeast(major, minor uint32) bool {
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}

// Version asks the kernel for its interface version (DM_VERSION).
func (c *Control) Version(ctx context.Context) (Version, error) {
	r, err := c.roundTrip(ctx, ioctlVersion, request{}, sizeofDmIoctl)
	if err != nil {
		return Version{}, err
	}
	defer r.release()
	return r.hdr.version, nil
}
