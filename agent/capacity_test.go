package agent

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

// gauges returns the value of each series of a gauge family by its labels
// ("k=v,..."), read from the registry as a scrape would.
func gauges(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			key := ""
			for _, l := range m.GetLabel() {
				key += l.GetName() + "=" + l.GetValue()
			}
			out[key] = m.GetGauge().GetValue()
		}
	}
	return out
}

// Without device-mapper, the thin pools' fill comes from lvmd's Watch.
func TestCapacityWatcherThinPoolMetricsFromLVMD(t *testing.T) {
	classes := []lvmdfake.Class{thickAndThin[0], thickAndThin[1]}
	classes[1].MetadataPercent = 12.5
	f, backend := serveLVMD(t, classes...)
	reg := prometheus.NewRegistry()
	w := NewCapacityWatcher(backend, reg)
	w.ExportThinPools(reg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)

	free := func() float64 { return gauges(t, reg, "lvm_agent_device_class_free_bytes")["device_class=thin"] }
	require.Eventually(t, func() bool { return free() > 0 }, 10*time.Second, 10*time.Millisecond)
	before := free()
	_, err := f.lvm.Create("thin", "t1", 256<<20, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return free() < before }, 10*time.Second, 10*time.Millisecond, "lvmd's report after the create")
	assert.Zero(t, gauges(t, reg, "lvm_agent_thin_pool_data_used_ratio")["device_class=thin"], "allocated, not written: lvs data_percent is 0")
	require.NoError(t, f.lvm.Write("thin", "t1", 256<<20))
	require.Eventually(t, func() bool {
		return gauges(t, reg, "lvm_agent_thin_pool_data_used_ratio")["device_class=thin"] == 0.25
	}, 10*time.Second, 10*time.Millisecond, "a quarter of the 1 GiB pool is written")
	assert.Equal(t, map[string]float64{"device_class=thin": 0.25}, gauges(t, reg, "lvm_agent_thin_pool_data_used_ratio"), "thin classes only")
	assert.Equal(t, map[string]float64{"device_class=thin": 0.125}, gauges(t, reg, "lvm_agent_thin_pool_metadata_used_ratio"))

	require.NoError(t, f.lvm.Remove("thin", "t1"))
	require.Eventually(t, func() bool {
		return gauges(t, reg, "lvm_agent_thin_pool_data_used_ratio")["device_class=thin"] == 0
	}, 10*time.Second, 10*time.Millisecond, "follows lvmd's next report")
}

// With device-mapper readable the agent does not call ExportThinPools: the
// lvmd-sourced series do not exist.
func TestCapacityWatcherNoThinPoolMetricsUnlessExported(t *testing.T) {
	_, backend := serveLVMD(t, thickAndThin...)
	reg := prometheus.NewRegistry()
	w := NewCapacityWatcher(backend, reg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	require.Eventually(t, func() bool { return len(gauges(t, reg, "lvm_agent_device_class_size_bytes")) == 2 }, 10*time.Second, 10*time.Millisecond)
	assert.Empty(t, gauges(t, reg, "lvm_agent_thin_pool_data_used_ratio"))
}
