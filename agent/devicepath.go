package agent

import (
	"context"
	"fmt"

	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// devicePath is the LV's device path on this node, for the volume.device
// answer: what lvmd reported, or else what its listing reports (topolvm's
// CreateLV leaves the path out; its GetLVList has it). "" when lvmd
// answers without one: the answer then carries no device rather than a
// guessed one. A read that fails (lvmd away) is an error: the request is
// retried, and the next attempt finds the LV made and its path, rather
// than answering "created" without a device, which a provisioner cannot
// use and must ask again.
func (a *Agent) devicePath(ctx context.Context, lv *lvmbackend.Volume) (string, error) {
	if lv.Path != "" {
		return lv.Path, nil
	}
	listed, err := a.backend.GetVolume(ctx, lv.DeviceClass, lv.Name)
	if err != nil {
		return "", fmt.Errorf("reading the device path of LV %s/%s: %w", lv.DeviceClass, lv.Name, err)
	}
	return listed.Path, nil
}
