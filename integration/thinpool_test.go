package integration

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
)

// An agent that cannot read device-mapper (the default, unprivileged
// install) exports the thin pools' fill from lvmd's capacity stream.
func TestThinPoolMetricsFromLVMD(t *testing.T) {
	addr := harness.FreeAddr(t)
	n := startNode(t, "--metrics-address", addr, "--device-mapper-control", "/nonexistent/control")
	waitMetric(t, addr, `lvm_agent_thin_pool_data_used_ratio{device_class="thin"}`, 0)
	require.NoError(t, n.create(t, "default", "thin-fill", kube.CreateSpec{VolumeGroup: "thin", Name: "lv-thin-fill", Size: 256 << 20}))
	// lvmd reports lvs' data_percent: what is written, not what is allocated.
	waitMetric(t, addr, `lvm_agent_device_class_free_bytes{device_class="thin"}`, 2<<30-256<<20) // overprovisioned 2x
	waitMetric(t, addr, `lvm_agent_thin_pool_data_used_ratio{device_class="thin"}`, 0)
	require.NoError(t, n.lvm.Write("thin", "lv-thin-fill", 256<<20))
	m := waitMetric(t, addr, `lvm_agent_thin_pool_data_used_ratio{device_class="thin"}`, 0.25) // of the 1 GiB pool
	assert.Contains(t, m, `lvm_agent_thin_pool_metadata_used_ratio{device_class="thin"}`)
	assert.NotContains(t, m, `lvm_agent_thin_pool_data_used_ratio{device_class="vg1"}`, "thick classes have no pool")
	assert.NotContains(t, m, `lvm_agent_dm_read_failed`, "no device-mapper source")
}
