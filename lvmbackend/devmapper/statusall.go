package devmapper

import (
	"context"
	"errors"
)

// StatusAll returns the info and target status of every device: one
// DM_LIST_DEVICES and one DM_TABLE_STATUS per device. The status reply
// carries the same header as DM_DEV_STATUS, so no separate Info query is
// needed. Devices removed or renamed between the list and their status
// query are left out rather than failing the whole call; the list is a
// snapshot of something that changes anyway.
//
// The result is in the kernel's list order (by name). ctx is checked
// between ioctls; a single ioctl cannot be interrupted.
func (c *Control) StatusAll(ctx context.Context) ([]DeviceStatus, error) {
	devs, err := c.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]DeviceStatus, 0, len(devs))
	for _, d := range devs {
		st, err := c.Status(ctx, d.Name)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}
