package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/lvmbackend"
	"github.com/lvm-agent/lvm-agent/lvmbackend/devmapper"
)

// Devices gives the agent its own eyes on the kernel's device-mapper: lvmd
// says an LV was made; the kernel says whether its device is really there.
type Devices struct {
	dm *devmapper.Control
}

// The device metrics, read from device-mapper at each scrape.
var (
	descDataUsed = prometheus.NewDesc("lvm_agent_thin_pool_data_used_ratio",
		"Used fraction of each thin pool's data space, read from device-mapper.", []string{"device"}, nil)
	descMetaUsed = prometheus.NewDesc("lvm_agent_thin_pool_metadata_used_ratio",
		"Used fraction of each thin pool's metadata space, read from device-mapper.", []string{"device"}, nil)
	descState = prometheus.NewDesc("lvm_agent_dm_device_state",
		"1 for the state each device-mapper device is in (active, suspended, inactive; thin pools also ro, out_of_data_space, needs_check, failed).", []string{"device", "state"}, nil)
	descReadFailed = prometheus.NewDesc("lvm_agent_dm_read_failed",
		"1 when reading device-mapper for this scrape failed (the device metrics are then missing).", nil, nil)
)

// OpenDevices opens the device-mapper control node. Where it is missing or
// not accessible (an unprivileged container, a host without device-mapper)
// it says so once and returns nil: the agent carries on without it and
// never fails a volume for it.
func OpenDevices(path string, reg prometheus.Registerer) *Devices {
	dm, err := devmapper.Open(path)
	if err != nil {
		klog.InfoS("Device-mapper not accessible; volumes are not cross-checked with the kernel", "path", path, "err", err)
		return nil
	}
	return NewDevices(dm, reg)
}

// NewDevices wraps an open control node; reg, when not nil, gets the
// device metrics, read at each scrape.
func NewDevices(dm *devmapper.Control, reg prometheus.Registerer) *Devices {
	d := &Devices{dm: dm}
	if reg != nil {
		reg.MustRegister(d)
	}
	return d
}

// confirmActive checks that a created LV's device exists with a live,
// unsuspended table: one query by the device numbers lvmd reports (0:0
// means it reported none).
func (d *Devices) confirmActive(ctx context.Context, lv *lvmbackend.Volume) error {
	if d == nil || lv == nil || lv.DevMajor == 0 && lv.DevMinor == 0 {
		return nil
	}
	info, err := d.dm.InfoByDevice(ctx, lv.DevMajor, lv.DevMinor)
	switch {
	case errors.Is(err, devmapper.ErrNotFound):
		return fmt.Errorf("LV %s was created, but its device %d:%d is not in device-mapper", lv.Name, lv.DevMajor, lv.DevMinor)
	case err != nil:
		return fmt.Errorf("device-mapper check of LV %s: %w", lv.Name, err)
	case !info.LiveTable || info.Suspended:
		return fmt.Errorf("LV %s was created, but its device %s is not active (state %s)", lv.Name, info.Name, info.Attr())
	}
	return nil
}

// name is the device-mapper name of an LV's device, "" when unknown.
func (d *Devices) name(ctx context.Context, lv *lvmbackend.Volume) string {
	if d == nil || lv.DevMajor == 0 && lv.DevMinor == 0 {
		return ""
	}
	info, err := d.dm.InfoByDevice(ctx, lv.DevMajor, lv.DevMinor)
	if err != nil {
		return ""
	}
	return info.Name
}

// gone reports whether a device name has left device-mapper.
func (d *Devices) gone(ctx context.Context, name string) bool {
	if d == nil || name == "" {
		return true
	}
	_, err := d.dm.Info(ctx, name)
	return err != nil
}

// Describe implements prometheus.Collector.
func (d *Devices) Describe(ch chan<- *prometheus.Desc) {
	ch <- descDataUsed
	ch <- descMetaUsed
	ch <- descState
	ch <- descReadFailed
}

// Collect implements prometheus.Collector: one Snapshot per scrape, so the
// figures are as fresh as the scrape (a few ioctls per device).
func (d *Devices) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	snap, err := d.Snapshot(ctx)
	if err != nil {
		klog.V(2).InfoS("Device-mapper status failed", "err", err)
		ch <- prometheus.MustNewConstMetric(descReadFailed, prometheus.GaugeValue, 1)
		return
	}
	ch <- prometheus.MustNewConstMetric(descReadFailed, prometheus.GaugeValue, 0)
	for _, s := range snap {
		ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, 1, s.Name, s.State)
		if s.ThinPool == nil {
			continue
		}
		for _, p := range s.PoolProblems() {
			ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, 1, s.Name, p)
		}
		if s.ThinPool.State == devmapper.StateOK {
			ch <- prometheus.MustNewConstMetric(descDataUsed, prometheus.GaugeValue, s.ThinPool.DataUsedFraction(), s.Name)
			ch <- prometheus.MustNewConstMetric(descMetaUsed, prometheus.GaugeValue, s.ThinPool.MetadataUsedFraction(), s.Name)
		}
	}
}

// DevNum is a block device's major:minor.
type DevNum struct{ Major, Minor uint32 }

func (n DevNum) String() string { return fmt.Sprintf("%d:%d", n.Major, n.Minor) }

// DeviceState is what device-mapper says about one device.
type DeviceState struct {
	Name      string // device-mapper name, e.g. "vg0-pvc--1a2b" (LVM doubles dashes)
	State     string // active, suspended or inactive
	OpenCount int32
	// ThinPool is set for a thin-pool target (LVM's "-tpool" layer).
	ThinPool *devmapper.ThinPoolStatus
	// Thin is set for a thin volume; Pool is its pool's device.
	Thin *devmapper.ThinStatus
	Pool DevNum
}

// PoolProblems lists what is wrong with a thin pool, in the words of the
// lvm_agent_dm_device_state metric: failed, ro, out_of_data_space,
// needs_check. None for a healthy pool or a device that is not a pool.
func (s DeviceState) PoolProblems() []string {
	p := s.ThinPool
	switch {
	case p == nil:
		return nil
	case p.State != devmapper.StateOK:
		return []string{"failed"}
	}
	var out []string
	if p.Mode != "" && p.Mode != devmapper.PoolModeReadWrite {
		out = append(out, string(p.Mode))
	}
	if p.NeedsCheck {
		out = append(out, "needs_check")
	}
	return out
}

// Snapshot reads the state of every device-mapper device: one list, one
// status query per device and, for each thin volume, one table query for
// the device of its pool.
func (d *Devices) Snapshot(ctx context.Context) (map[DevNum]DeviceState, error) {
	all, err := d.dm.StatusAll(ctx)
	if err != nil {
		return nil, err
	}
	pools := map[string]DevNum{}
	for _, s := range all {
		if len(s.Targets) == 1 && s.Targets[0].Type == "thin" {
			if t, err := d.dm.Table(ctx, s.Info.Name); err == nil && len(t.Targets) == 1 {
				pools[s.Info.Name] = thinPoolDev(t.Targets[0].Params)
			}
		}
	}
	return deviceStates(all, pools), nil
}

// deviceStates turns device-mapper statuses into DeviceStates; pools gives
// the pool device of each thin volume by name.
func deviceStates(all []devmapper.DeviceStatus, pools map[string]DevNum) map[DevNum]DeviceState {
	out := make(map[DevNum]DeviceState, len(all))
	for _, s := range all {
		st := DeviceState{Name: s.Info.Name, State: "active", OpenCount: s.Info.OpenCount, Pool: pools[s.Info.Name]}
		switch {
		case s.Info.Suspended:
			st.State = "suspended"
		case !s.Info.LiveTable:
			st.State = "inactive"
		}
		if len(s.Targets) == 1 {
			switch t := s.Targets[0]; t.Type {
			case "thin-pool":
				if p, err := devmapper.ParseThinPoolStatus(t.Params); err == nil {
					st.ThinPool = &p
				}
			case "thin":
				if p, err := devmapper.ParseThinStatus(t.Params); err == nil {
					st.Thin = &p
				}
			}
		}
		out[DevNum{s.Info.Major, s.Info.Minor}] = st
	}
	return out
}

// thinPoolDev reads the pool device from a thin target's table line,
// "<pool major:minor> <device id> [<external origin>]".
func thinPoolDev(params string) DevNum {
	var n DevNum
	_, _ = fmt.Sscanf(params, "%d:%d", &n.Major, &n.Minor)
	return n
}

// LVMName is "vg/lv" for the device-mapper name LVM gives an LV's device
// (dashes in either name doubled, "-layer" appended for internal layers
// such as a thin pool's "-tpool"), and the name itself for other devices.
func LVMName(dmName string) string {
	var parts []string
	var cur []byte
	for i := 0; i < len(dmName); i++ {
		switch {
		case dmName[i] != '-':
			cur = append(cur, dmName[i])
		case i+1 < len(dmName) && dmName[i+1] == '-':
			cur = append(cur, '-')
			i++
		default:
			parts = append(parts, string(cur))
			cur = cur[:0]
		}
	}
	parts = append(parts, string(cur))
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return dmName
	}
	return parts[0] + "/" + parts[1]
}
