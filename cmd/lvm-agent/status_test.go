package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lvm-agent/lvm-agent/agent"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
	"github.com/lvm-agent/lvm-agent/lvmbackend/devmapper"
)

func TestDeviceCellAndPools(t *testing.T) {
	pool := agent.DevNum{Major: 254, Minor: 2}
	full := agent.DevNum{Major: 254, Minor: 9}
	devs := map[agent.DevNum]agent.DeviceState{
		{Major: 254, Minor: 0}: {Name: "vg0-thick", State: "active"},
		{Major: 254, Minor: 1}: {Name: "vg0-held", State: "suspended"},
		pool: {Name: "vg0-pool0-tpool", State: "active", ThinPool: &devmapper.ThinPoolStatus{State: devmapper.StateOK,
			UsedDataBlocks: 64, TotalDataBlocks: 16384, UsedMetadataBlocks: 113, TotalMetadataBlocks: 1024, Mode: devmapper.PoolModeReadWrite}},
		{Major: 254, Minor: 3}: {Name: "vg0-thin", State: "active", Thin: &devmapper.ThinStatus{State: devmapper.StateOK, MappedSectors: 8192}, Pool: pool},
		{Major: 254, Minor: 4}: {Name: "vg0-orphan--thin", State: "active", Thin: &devmapper.ThinStatus{State: devmapper.StateOK}, Pool: agent.DevNum{Major: 254, Minor: 99}},
		full: {Name: "vg1-big-tpool", State: "active", ThinPool: &devmapper.ThinPoolStatus{State: devmapper.StateOK,
			UsedDataBlocks: 10, TotalDataBlocks: 10, UsedMetadataBlocks: 1, TotalMetadataBlocks: 4, Mode: devmapper.PoolModeOutOfDataSpace}},
		{Major: 254, Minor: 10}: {Name: "vg1-t", State: "active", Thin: &devmapper.ThinStatus{State: devmapper.StateOK}, Pool: full},
	}
	lv := func(minor uint32) lvmbackend.Volume { return lvmbackend.Volume{DevMajor: 254, DevMinor: minor} }

	assert.Equal(t, "active", deviceCell(devs, lv(0)))
	assert.Equal(t, "suspended", deviceCell(devs, lv(1)))
	assert.Equal(t, "active, 4Mi mapped in vg0/pool0", deviceCell(devs, lv(3)))
	assert.Equal(t, "active, 0 mapped", deviceCell(devs, lv(4)), "pool not found: no name")
	assert.Equal(t, "absent", deviceCell(devs, lv(50)))
	assert.Equal(t, "inactive", deviceCell(devs, lvmbackend.Volume{}), "lvmd reports no device numbers")
	assert.Equal(t, "?", deviceCell(nil, lv(0)), "device-mapper not read")

	var out strings.Builder
	pools := thinPools(devs, map[string]lvmbackend.Volume{"thin/a": lv(3), "thick/b": lv(0), "thin/c": lv(10)})
	require.Len(t, pools, 2)
	assert.Empty(t, pools[0].Problems)
	assert.Equal(t, []string{"out_of_data_space"}, pools[1].Problems)
	printPools(&out, pools)
	assert.Equal(t, `
thin pool vg0/pool0 (vg0-pool0-tpool, 254:2): 1 LVs; data 64/16384 blocks (0.39%), metadata 113/1024 blocks (11.04%), mode rw
thin pool vg1/big (vg1-big-tpool, 254:9): 1 LVs; data 10/10 blocks (100.00%), metadata 1/4 blocks (25.00%), mode out_of_data_space  UNHEALTHY: out_of_data_space
`, out.String())

	out.Reset()
	printPools(&out, thinPools(nil, map[string]lvmbackend.Volume{"thin/a": lv(3)}))
	assert.Empty(t, out.String())
}
