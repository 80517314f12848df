package devmapper

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseThinStatus(t *testing.T) {
	tests := []struct {
		params string
		want   ThinStatus
	}{
		{"2048 2047", ThinStatus{State: StateOK, MappedSectors: 2048, HighestMappedSector: 2047, AnyMapped: true}},
		{"0 -", ThinStatus{State: StateOK}},
		{"1310720 20971519 ", ThinStatus{State: StateOK, MappedSectors: 1310720, HighestMappedSector: 20971519, AnyMapped: true}},
		{"Fail", ThinStatus{State: StateFail}},
		{"Error", ThinStatus{State: StateError}},
		{"-", ThinStatus{State: StateUnknown}},
	}
	for _, tt := range tests {
		got, err := ParseThinStatus(tt.params)
		require.NoError(t, err, tt.params)
		assert.Equal(t, tt.want, got, tt.params)
	}
}

func TestParseThinStatusErrors(t *testing.T) {
	for _, params := range []string{"", "2048", "2048 2047 1", "x 2047", "2048 y", "- -", "-1 -", "Fail 1"} {
		_, err := ParseThinStatus(params)
		assert.ErrorIs(t, err, ErrInvalidStatus, "%q", params)
	}
}

func TestThinMappedBytes(t *testing.T) {
	assert.Equal(t, uint64(1<<20), ThinStatus{MappedSectors: 2048}.MappedBytes())
	assert.Equal(t, ^uint64(0), ThinStatus{MappedSectors: ^uint64(0)}.MappedBytes(), "saturates")
}
