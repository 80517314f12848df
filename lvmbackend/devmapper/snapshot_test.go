package devmapper

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDeviceStates(t *testing.T) {
	dev := func(name string, minor uint32, live, suspended bool, typ, params string) DeviceStatus {
		s := DeviceStatus{Info: Info{Name: name, Major: 253, Minor: minor, LiveTable: live, Suspended: suspended, OpenCount: 1}}
		if typ != "" {
			s.Targets = []Target{{Length: 8, Type: typ, Params: params}}
		}
		return s
	}
	all := []DeviceStatus{
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

func TestThinPool(t *testing.T) {
	for params, want := range map[string]DevNum{
		"253:12 7":      {253, 12},
		"253:12 7 8:16": {253, 12},
		"253:12 7 ":     {253, 12},
	} {
		got, err := thinPool(params)
		require.NoError(t, err, params)
		assert.Equal(t, want, got, params)
	}
	for _, bad := range []string{"garbage", "", "253:12", "253:12 x", "253 7", "253:x 7", "4294967296:0 7", "253:12 7 8:16 9"} {
		_, err := thinPool(bad)
		assert.ErrorIs(t, err, ErrInvalidStatus, bad)
	}
}

// The two halves together: a status decoded from a golden kernel reply
// becomes a pool in the model.
func TestDeviceStatesOfGoldenReply(t *testing.T) {
	reply := goldenThinPoolStatusReply()
	h := decodeHeader(reply)
	targets, err := decodeTargets(reply, h)
	require.NoError(t, err)
	got := deviceStates([]DeviceStatus{{Info: infoFromHeader(h), Targets: targets}}, nil)
	require.Len(t, got, 1)
	for _, s := range got {
		require.NotNil(t, s.ThinPool, s.Name)
		assert.Equal(t, StateOK, s.ThinPool.State)
		assert.Empty(t, s.PoolProblems())
	}
}
