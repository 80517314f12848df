package devmapper

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseThinPoolStatus(t *testing.T) {
	tests := []struct {
		name   string
		params string
		want   ThinPoolStatus
	}{
		{
			name:   "current kernel, trailing space as emitted",
			params: goldenThinPoolParams,
			want: ThinPoolStatus{
				State: StateOK, TransactionID: 1,
				UsedMetadataBlocks: 191, TotalMetadataBlocks: 1024,
				UsedDataBlocks: 5120, TotalDataBlocks: 16384,
				Mode: PoolModeReadWrite, Discards: DiscardPassdown, NoSpace: NoSpaceQueue,
				MetadataLowWatermark: 256, // min(4 MiB of 4 KiB blocks, total/4)
			},
		},
		{
			name:   "out of data space, erroring, needs_check, held root",
			params: "42 900/1024 16384/16384 17 out_of_data_space no_discard_passdown error_if_no_space needs_check 256 ",
			want: ThinPoolStatus{
				State: StateOK, TransactionID: 42,
				UsedMetadataBlocks: 900, TotalMetadataBlocks: 1024,
				UsedDataBlocks: 16384, TotalDataBlocks: 16384, HeldMetadataRoot: 17,
				Mode: PoolModeOutOfDataSpace, Discards: DiscardNoPassdown, NoSpace: NoSpaceError,
				NeedsCheck: true, MetadataLowWatermark: 256,
			},
		},
		{
			name:   "read-only, discards ignored",
			params: "7 10/20 30/40 - ro ignore_discard queue_if_no_space - 5",
			want: ThinPoolStatus{
				State: StateOK, TransactionID: 7, UsedMetadataBlocks: 10, TotalMetadataBlocks: 20,
				UsedDataBlocks: 30, TotalDataBlocks: 40,
				Mode: PoolModeReadOnly, Discards: DiscardIgnore, NoSpace: NoSpaceQueue, MetadataLowWatermark: 5,
			},
		},
		{
			name:   "4.x kernel before the low watermark",
			params: "0 100/2048 0/1600 - rw discard_passdown queue_if_no_space - ",
			want: ThinPoolStatus{
				State: StateOK, UsedMetadataBlocks: 100, TotalMetadataBlocks: 2048, TotalDataBlocks: 1600,
				Mode: PoolModeReadWrite, Discards: DiscardPassdown, NoSpace: NoSpaceQueue,
			},
		},
		{
			name:   "3.x kernel: discard word before the mode",
			params: "0 100/2048 0/1600 - discard_passdown rw",
			want: ThinPoolStatus{
				State: StateOK, UsedMetadataBlocks: 100, TotalMetadataBlocks: 2048, TotalDataBlocks: 1600,
				Mode: PoolModeReadWrite, Discards: DiscardPassdown,
			},
		},
		{
			name:   "oldest kernels: four fields",
			params: "0 100/2048 0/1600 -",
			want:   ThinPoolStatus{State: StateOK, UsedMetadataBlocks: 100, TotalMetadataBlocks: 2048, TotalDataBlocks: 1600},
		},
		{
			name:   "unknown word from a newer kernel is skipped",
			params: "1 2/4 6/8 - rw discard_passdown queue_if_no_space - 3 some_new_flag",
			want: ThinPoolStatus{
				State: StateOK, TransactionID: 1, UsedMetadataBlocks: 2, TotalMetadataBlocks: 4,
				UsedDataBlocks: 6, TotalDataBlocks: 8,
				Mode: PoolModeReadWrite, Discards: DiscardPassdown, NoSpace: NoSpaceQueue, MetadataLowWatermark: 3,
			},
		},
		{name: "failed pool", params: "Fail", want: ThinPoolStatus{State: StateFail}},
		{name: "metadata unreadable", params: "Error", want: ThinPoolStatus{State: StateError}},
		{name: "failed pool with whitespace", params: " Fail ", want: ThinPoolStatus{State: StateFail}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseThinPoolStatus(tt.params)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseThinPoolStatusErrors(t *testing.T) {
	for _, params := range []string{
		"",
		"1 2/4 6/8",                           // too short
		"x 2/4 6/8 -",                         // transaction id
		"1 2-4 6/8 -",                         // ratio separator
		"1 2/4 6/ -",                          // empty total
		"1 2/4 6/8 root",                      // held root
		"1 -2/4 6/8 -",                        // negative
		"1 2/4 6/8 - rw ro",                   // mode twice
		"1 2/4 6/8 - rw 5 6",                  // two numbers after the root
		"1 2/4 6/8 - rw 99999999999999999999", // watermark overflow
		"Fail now",                            // state word with company
		"fail",                                // case matters
		"1 2/4 18446744073709551616/8 -",      // 2^64
	} {
		_, err := ParseThinPoolStatus(params)
		assert.ErrorIs(t, err, ErrInvalidStatus, "%q", params)
	}
}

func TestThinPoolStatusHelpers(t *testing.T) {
	s, err := ParseThinPoolStatus(goldenThinPoolParams)
	require.NoError(t, err)
	assert.InDelta(t, 0.3125, s.DataUsedFraction(), 1e-12)
	assert.InDelta(t, 191.0/1024.0, s.MetadataUsedFraction(), 1e-12)
}

func TestThinPoolStatusHelpersOnDegenerateCounts(t *testing.T) {
	s := ThinPoolStatus{State: StateOK, UsedDataBlocks: 10, TotalDataBlocks: 5, UsedMetadataBlocks: 3}
	assert.Zero(t, s.MetadataUsedFraction(), "total 0")
	assert.Equal(t, 2.0, s.DataUsedFraction(), "reported as is, not clamped")
	assert.Zero(t, ThinPoolStatus{State: StateFail}.DataUsedFraction())
}
