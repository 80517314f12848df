package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	// reg, when not nil, gets the device metrics, read at each scrape.
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

// OpenCount is the kernel's count of openers of a device (a thick clone's
// source must have none). Without device-mapper access it is an error.
func (d *Devices) OpenCount(ctx context.Context, major, minor uint32) (int32, error) {
	if d == nil {
		return 0, errors.New("device-mapper is not accessible")
	}
	info, err := d.dm.InfoByDevice(ctx, major, minor)
	if err != nil {
		return 0, err
	}
	return info.OpenCount, nil
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
	snap, err := d.dm.Snapshot(ctx)
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

// poolZeroes reports whether lv is a thin LV (its table is "thin <pool
// major:minor> <id>"; lvmd's CreateLV answers with no lv_attr to say so)
// and, if it is, whether its pool zeroes the chunks it gives out: the pool
// device's thin-pool table says skip_block_zeroing when it does not
// (devmapper.ParseThinPoolTable). An error when a table cannot be read.
func (d *Devices) poolZeroes(ctx context.Context, lv *lvmbackend.Volume) (thin, zeroes bool, err error) {
	name := d.name(ctx, lv)
	if name == "" {
		return false, false, fmt.Errorf("LV %s has no device-mapper device (%d:%d)", lv.Name, lv.DevMajor, lv.DevMinor)
	}
	t, err := d.dm.Table(ctx, name)
	if err != nil {
		return false, false, fmt.Errorf("read the table of LV %s: %w", lv.Name, err)
	}
	if !slices.ContainsFunc(t.Targets, func(t devmapper.Target) bool { return t.Type == "thin" }) {
		return false, false, nil
	}
	var major, minor uint32
	if len(t.Targets) != 1 {
		return true, false, fmt.Errorf("thin LV %s: device %s has %d targets, not one thin target", lv.Name, name, len(t.Targets))
	}
	if _, err := fmt.Sscanf(t.Targets[0].Params, "%d:%d", &major, &minor); err != nil {
		return true, false, fmt.Errorf("thin LV %s: its table %q names no pool device: %w", lv.Name, t.Targets[0].Params, err)
	}
	pool, err := d.dm.InfoByDevice(ctx, major, minor)
	if err != nil {
		return true, false, fmt.Errorf("thin LV %s: its pool device %d:%d: %w", lv.Name, major, minor, err)
	}
	pt, err := d.dm.Table(ctx, pool.Name)
	if err != nil {
		return true, false, fmt.Errorf("read the table of thin pool %s: %w", pool.Name, err)
	}
	if len(pt.Targets) != 1 || pt.Targets[0].Type != "thin-pool" {
		return true, false, fmt.Errorf("thin LV %s: device %s is not a thin pool", lv.Name, pool.Name)
	}
	p, err := devmapper.ParseThinPoolTable(pt.Targets[0].Params)
	if err != nil {
		return true, false, fmt.Errorf("thin pool %s: %w", pool.Name, err)
	}
	return true, p.ZeroesNewBlocks, nil
}
