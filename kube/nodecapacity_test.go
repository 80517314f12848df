package kube

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The value stays readable by consumers of the original format, which know
// only type, name and capacity (the VG size).
func TestEncodeStorageTopologyOriginalFormat(t *testing.T) {
	var original []struct {
		Type       string `json:"type,omitempty"`
		Name       string `json:"name,omitempty"`
		Capacity   uint64 `json:"capacity,omitempty"`
		DeviceType string `json:"devicetype,omitempty"`
		MountPoint string `json:"mountPoint,omitempty"`
	}
	v := EncodeStorageTopology([]StorageCapacity{{Type: "lvm", Name: "vg1", Capacity: 105151127552, Free: 1 << 30, DeviceClass: "vg1"}})
	require.NoError(t, json.Unmarshal([]byte(v), &original))
	require.Len(t, original, 1)
	assert.Equal(t, "lvm", original[0].Type)
	assert.Equal(t, "vg1", original[0].Name)
	assert.Equal(t, uint64(105151127552), original[0].Capacity)
}

func TestStorageTopologyRoundTrip(t *testing.T) {
	in := []StorageCapacity{
		{Type: "lvm", Name: "vg1", Capacity: 100, Free: 0, DeviceClass: "thick"},
		{Type: "lvm", Name: "vg0", Capacity: 100, Free: 40, DeviceClass: "thin"},
		{Type: "lvm", Name: "vg0", Capacity: 100, Free: 60, DeviceClass: "thick"},
	}
	v := EncodeStorageTopology(in)
	assert.Equal(t, `[{"type":"lvm","name":"vg0","capacity":100,"free":60,"deviceClass":"thick"},{"type":"lvm","name":"vg0","capacity":100,"free":40,"deviceClass":"thin"},{"type":"lvm","name":"vg1","capacity":100,"free":0,"deviceClass":"thick"}]`, v)
	assert.Equal(t, "vg1", in[0].Name, "the caller's entries are not reordered")
	out, err := DecodeStorageTopology(v)
	require.NoError(t, err)
	assert.ElementsMatch(t, in, out)
	assert.Equal(t, "[]", EncodeStorageTopology(nil))
}

func TestDecodeStorageTopology(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []StorageCapacity
		wantErr bool
	}{
		{in: `[]`, want: []StorageCapacity{}},
		// The original format has no "free": the whole capacity counts.
		{in: `[{"type":"lvm","name":"vg1","capacity":107374182400}]`, want: []StorageCapacity{{Type: "lvm", Name: "vg1", Capacity: 107374182400, Free: 107374182400}}},
		// A "free" of 0 is a full VG, not a missing figure.
		{in: `[{"type":"lvm","name":"vg1","capacity":100,"free":0}]`, want: []StorageCapacity{{Type: "lvm", Name: "vg1", Capacity: 100}}},
		{in: `not json`, wantErr: true},
		{in: `{"name":"vg1"}`, wantErr: true},
		{in: `[{"name":"vg1","capacity":-1}]`, wantErr: true},
	} {
		got, err := DecodeStorageTopology(tc.in)
		if tc.wantErr {
			assert.Error(t, err, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
	}
}
