package agent

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// devicePath is the LV's device path on this node, for the volume.device
// answer: what lvmd reported, or else what its listing reports (topolvm's
// CreateLV leaves the path out; its GetLVList has it). "" when neither
// says: the answer then carries no device rather than a guessed one.
func (a *Agent) devicePath(ctx context.Context, lv *lvmbackend.Volume) string {
	if lv.Path != "" {
		return lv.Path
	}
	listed, err := a.backend.GetVolume(ctx, lv.DeviceClass, lv.Name)
	if err != nil {
		klog.ErrorS(err, "Could not read the device path of a created LV; answering without it", "lv", lv.DeviceClass+"/"+lv.Name)
		return ""
	}
	return listed.Path
}
