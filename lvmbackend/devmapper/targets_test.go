package devmapper

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseTargetStatusDispatches(t *testing.T) {
	tests := []struct {
		typ, params string
		want        TargetStatus
	}{
		{"linear", "", LinearStatus{}},
		{"striped", "1 8:16 1 A", StripedStatus{Devices: []string{"8:16"}, Alive: []bool{true}}},
		{"thin-pool", "Fail", ThinPoolStatus{State: StateFail}},
		{"thin", "0 -", ThinStatus{State: StateOK}},
	}
	for _, tt := range tests {
		got, err := ParseTargetStatus(tt.typ, tt.params)
		require.NoError(t, err, tt.typ)
		assert.Equal(t, tt.want, got)
		assert.Equal(t, tt.typ, got.TargetType())
	}

	_, err := ParseTargetStatus("crypt", "")
	assert.ErrorIs(t, err, ErrUnknownTarget)
	_, err = ParseTargetStatus("thin", "nonsense")
	assert.ErrorIs(t, err, ErrInvalidStatus)
}

// TestStatusOfGoldenRepliesParses ties the two halves together: the params
// strings decoded from the golden replies parse as their types.
func TestStatusOfGoldenRepliesParses(t *testing.T) {
	for _, reply := range [][]byte{goldenThinPoolStatusReply(), goldenTwoTargetStatusReply()} {
		targets, err := decodeTargets(reply, decodeHeader(reply))
		require.NoError(t, err)
		for _, tg := range targets {
			st, err := ParseTargetStatus(tg.Type, tg.Params)
			require.NoError(t, err, tg.Type)
			assert.Equal(t, tg.Type, st.TargetType())
		}
	}
}
