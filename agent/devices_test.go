package agent

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lvm-agent/lvm-agent/lvmbackend/devmapper"
)

func TestDeviceStates(t *testing.T) {
	dev := func(name string, minor uint32, live, suspended bool, typ, params string) devmapper.DeviceStatus {
		s := devmapper.DeviceStatus{Info: devmapper.Info{Name: name, Major: 253, Minor: minor, LiveTable: live, Suspended: suspended, OpenCount: 1}}
		if typ != "" {
			s.Targets = []devmapper.Target{{Length: 8, Type: typ, Params: params}}
		}
		return s
	}
	all := []devmapper.DeviceStatus{
		dev("vg0-thick", 0, true, false, "linear", ""),
		dev("vg0-held", 1, true, true, "linear", ""),
		dev("vg0-loaded", 2, false, false, "", ""),
		dev("vg0-pool0-tpool", 3, true, false, "thin-pool", "1 20/4096 1792/2048 - rw no_discard_passdown queue_if_no_space - 1024"),
		dev("vg0-full-tpool", 4, true, false, "thin-pool", "1 20/4096 2048/2048 - out_of_data_space discard_passdown error_if_no_space needs_check 1024"),
		dev("vg0-broken-tpool", 5, true, false, "thin-pool", "Fail"),
		dev("vg0-thin", 6, true, false, "thin", "2048 2047"),
		dev("vg0-garbled-tpool", 7, true, false, "thin-pool", "not a status"),
	}
	got := deviceStates(all, map[string]DevNum{"vg0-thin": {253, 3}})
	require.Len(t, got, len(all))

	assert.Equal(t, "active", got[DevNum{253, 0}].State)
	assert.Equal(t, "suspended", got[DevNum{253, 1}].State)
	assert.Equal(t, "inactive", got[DevNum{253, 2}].State)
	assert.Equal(t, int32(1), got[DevNum{253, 0}].OpenCount)
	assert.Nil(t, got[DevNum{253, 0}].ThinPool)
	assert.Empty(t, got[DevNum{253, 0}].PoolProblems())

	pool := got[DevNum{253, 3}]
	require.NotNil(t, pool.ThinPool)
	assert.InDelta(t, 0.875, pool.ThinPool.DataUsedFraction(), 1e-9)
	assert.Empty(t, pool.PoolProblems())
	assert.Equal(t, []string{"out_of_data_space", "needs_check"}, got[DevNum{253, 4}].PoolProblems())
	assert.Equal(t, []string{"failed"}, got[DevNum{253, 5}].PoolProblems())
	assert.Nil(t, got[DevNum{253, 7}].ThinPool, "an unparsable status is no pool status")

	thin := got[DevNum{253, 6}]
	require.NotNil(t, thin.Thin)
	assert.Equal(t, uint64(2048*512), thin.Thin.MappedBytes())
	assert.Equal(t, DevNum{253, 3}, thin.Pool)
}

func TestThinPoolDev(t *testing.T) {
	assert.Equal(t, DevNum{253, 12}, thinPoolDev("253:12 7"))
	assert.Equal(t, DevNum{253, 12}, thinPoolDev("253:12 7 8:16"))
	assert.Equal(t, DevNum{}, thinPoolDev("garbage"))
}

func TestLVMName(t *testing.T) {
	for dm, want := range map[string]string{
		"vg0-lv0":              "vg0/lv0",
		"vg0-pool0-tpool":      "vg0/pool0",
		"my--vg-pvc--1a2b--3c": "my-vg/pvc-1a2b-3c",
		"vg0-pool0_tdata":      "vg0/pool0_tdata",
		"cryptroot":            "cryptroot",
		"a-b-c-d":              "a-b-c-d",
		"-lv":                  "-lv",
		"vg--":                 "vg--",
	} {
		assert.Equal(t, want, LVMName(dm), dm)
	}
}
