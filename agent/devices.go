package agent

import (
	"context"
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
	dm       *devmapper.Control
	dataUsed *prometheus.GaugeVec
	metaUsed *prometheus.GaugeVec
	state    *prometheus.GaugeVec
}

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
	d := &Devices{dm: dm,
		dataUsed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lvm_agent_thin_pool_data_used_ratio",
			Help: "Used fraction of each thin pool's data space, read from device-mapper."}, []string{"device"}),
		metaUsed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lvm_agent_thin_pool_metadata_used_ratio",
			Help: "Used fraction of each thin pool's metadata space, read from device-mapper."}, []string{"device"}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lvm_agent_dm_device_state",
			Help: "1 for the state each device-mapper device is in (active, suspended, inactive; thin pools also read_only, out_of_data_space, needs_check, failed)."}, []string{"device", "state"}),
	}
	if reg != nil {
		reg.MustRegister(d.dataUsed, d.metaUsed, d.state)
	}
	return d
}

// find returns the device-mapper device of an LV by its device numbers.
func (d *Devices) find(ctx context.Context, major, minor uint32) (*devmapper.Device, error) {
	devs, err := d.dm.List(ctx)
	if err != nil {
		return nil, err
	}
	for i := range devs {
		if devs[i].Major == major && devs[i].Minor == minor {
			return &devs[i], nil
		}
	}
	return nil, nil
}

// confirmActive checks that a created LV's device exists with a live,
// unsuspended table. lvmd reports the numbers; 0:0 means it reported none.
func (d *Devices) confirmActive(ctx context.Context, lv *lvmbackend.Volume) error {
	if d == nil || lv == nil || lv.DevMajor == 0 && lv.DevMinor == 0 {
		return nil
	}
	dev, err := d.find(ctx, lv.DevMajor, lv.DevMinor)
	if err != nil {
		return fmt.Errorf("device-mapper check of LV %s: %w", lv.Name, err)
	}
	if dev == nil {
		return fmt.Errorf("LV %s was created, but its device %d:%d is not in device-mapper", lv.Name, lv.DevMajor, lv.DevMinor)
	}
	info, err := d.dm.Info(ctx, dev.Name)
	if err != nil {
		return fmt.Errorf("device-mapper check of LV %s (%s): %w", lv.Name, dev.Name, err)
	}
	if !info.LiveTable || info.Suspended {
		return fmt.Errorf("LV %s was created, but its device %s is not active (state %s)", lv.Name, dev.Name, info.Attr())
	}
	return nil
}

// name is the device-mapper name of an LV's device, "" when unknown.
func (d *Devices) name(ctx context.Context, lv *lvmbackend.Volume) string {
	if d == nil || lv.DevMajor == 0 && lv.DevMinor == 0 {
		return ""
	}
	if dev, err := d.find(ctx, lv.DevMajor, lv.DevMinor); err == nil && dev != nil {
		return dev.Name
	}
	return ""
}

// gone reports whether a device name has left device-mapper.
func (d *Devices) gone(ctx context.Context, name string) bool {
	if d == nil || name == "" {
		return true
	}
	_, err := d.dm.Info(ctx, name)
	return err != nil
}

// Run refreshes the device metrics every interval until ctx ends.
func (d *Devices) Run(ctx context.Context, interval time.Duration) {
	if d == nil {
		return
	}
	for {
		d.refresh(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

func (d *Devices) refresh(ctx context.Context) {
	all, err := d.dm.StatusAll(ctx)
	if err != nil {
		klog.V(2).InfoS("Device-mapper status failed", "err", err)
		return
	}
	d.state.Reset()
	for _, s := range all {
		state := "active"
		switch {
		case s.Info.Suspended:
			state = "suspended"
		case !s.Info.LiveTable:
			state = "inactive"
		}
		d.state.WithLabelValues(s.Info.Name, state).Set(1)
		for _, t := range s.Targets {
			if t.Type != "thin-pool" {
				continue
			}
			tp, err := devmapper.ParseThinPoolStatus(t.Params)
			if err != nil {
				continue
			}
			if tp.State != devmapper.StateOK {
				d.state.WithLabelValues(s.Info.Name, "failed").Set(1)
				continue
			}
			d.dataUsed.WithLabelValues(s.Info.Name).Set(tp.DataUsedFraction())
			d.metaUsed.WithLabelValues(s.Info.Name).Set(tp.MetadataUsedFraction())
			if tp.Mode != "" && tp.Mode != devmapper.PoolModeReadWrite {
				d.state.WithLabelValues(s.Info.Name, string(tp.Mode)).Set(1)
			}
			if tp.NeedsCheck {
				d.state.WithLabelValues(s.Info.Name, "needs_check").Set(1)
			}
		}
	}
}
