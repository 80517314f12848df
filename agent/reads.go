package agent

import (
	"context"

	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// listWithin lists a device class for a reader that decides by it only
// what a later check confirms (a create: nothing in the way, which lvcreate
// checks again): with shared reads (lvmbackend.Shared) a listing up to
// ReadMaxAge old, else lvmd's now. a.backend.ListVolumes is always a
// listing begun after the call.
func (a *Agent) listWithin(ctx context.Context, deviceClass string) ([]lvmbackend.Volume, error) {
	if a.shared != nil {
		return a.shared.ListVolumesWithin(ctx, deviceClass, a.cfg.ReadMaxAge)
	}
	return a.backend.ListVolumes(ctx, deviceClass)
}

// capacityWithin is the device classes for a reader of their names (a
// create's check of the other classes, the orphan collector): with shared
// reads an answer up to ReadMaxAge old, else lvmd's now.
func (a *Agent) capacityWithin(ctx context.Context) ([]lvmbackend.Capacity, error) {
	if a.shared != nil {
		return a.shared.CapacityWithin(ctx, a.cfg.ReadMaxAge)
	}
	return a.backend.Capacity(ctx)
}
