package devmapper

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseStripedStatus(t *testing.T) {
	tests := []struct {
		params   string
		want     StripedStatus
		degraded bool
	}{
		{"2 8:16 8:32 1 AA", StripedStatus{Devices: []string{"8:16", "8:32"}, Alive: []bool{true, true}}, false},
		{"3 8:16 8:32 8:48 1 ADA", StripedStatus{Devices: []string{"8:16", "8:32", "8:48"}, Alive: []bool{true, false, true}}, true},
		{"1 253:4 1 A", StripedStatus{Devices: []string{"253:4"}, Alive: []bool{true}}, false},
	}
	for _, tt := range tests {
		got, err := ParseStripedStatus(tt.params)
		require.NoError(t, err, tt.params)
		assert.Equal(t, tt.want, got, tt.params)
		assert.Equal(t, tt.degraded, got.Degraded(), tt.params)
	}
}

func TestParseStripedStatusErrors(t *testing.T) {
	for _, params := range []string{
		"", "2", "0 1", "2 8:16 8:32 1 A", "2 8:16 8:32 2 AA", "2 8:16 8:32 1 AX",
		"3 8:16 8:32 1 AA", "18446744073709551615 a 1 A", "x 8:16 1 A",
	} {
		_, err := ParseStripedStatus(params)
		assert.ErrorIs(t, err, ErrInvalidStatus, "%q", params)
	}
}
