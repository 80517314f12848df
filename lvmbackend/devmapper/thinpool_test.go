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

func TestParseThinPoolTable(t *testing.T) {
	tests := []struct {
		name   string
		params string
		want   ThinPoolTable
	}{
		{
			name:   "LVM -Z y: no features, trailing space as emitted",
			params: "253:0 253:1 128 0 0 ",
			want: ThinPoolTable{MetadataDev: DevNum{253, 0}, DataDev: DevNum{253, 1},
				DataBlockSectors: 128, ZeroesNewBlocks: true},
		},
		{
			name:   "LVM -Z n",
			params: "253:0 253:1 128 0 1 skip_block_zeroing ",
			want: ThinPoolTable{MetadataDev: DevNum{253, 0}, DataDev: DevNum{253, 1},
				DataBlockSectors: 128, Features: []string{"skip_block_zeroing"}},
		},
		{
			name:   "skip_block_zeroing among other features",
			params: "252:10 252:11 1024 16 3 ignore_discard skip_block_zeroing error_if_no_space",
			want: ThinPoolTable{MetadataDev: DevNum{252, 10}, DataDev: DevNum{252, 11},
				DataBlockSectors: 1024, LowWaterMark: 16,
				Features: []string{"ignore_discard", "skip_block_zeroing", "error_if_no_space"}},
		},
		{
			name:   "features without skip_block_zeroing",
			params: "8:16 8:32 128 100 2 no_discard_passdown read_only",
			want: ThinPoolTable{MetadataDev: DevNum{8, 16}, DataDev: DevNum{8, 32},
				DataBlockSectors: 128, LowWaterMark: 100,
				Features: []string{"no_discard_passdown", "read_only"}, ZeroesNewBlocks: true},
		},
		{
			name:   "feature names match case-insensitively, as in the kernel",
			params: "8:16 8:32 128 0 1 Skip_Block_Zeroing",
			want: ThinPoolTable{MetadataDev: DevNum{8, 16}, DataDev: DevNum{8, 32},
				DataBlockSectors: 128, Features: []string{"Skip_Block_Zeroing"}},
		},
		{
			name:   "unknown feature of a newer kernel is kept",
			params: "8:16 8:32 128 0 1 some_new_feature",
			want: ThinPoolTable{MetadataDev: DevNum{8, 16}, DataDev: DevNum{8, 32},
				DataBlockSectors: 128, Features: []string{"some_new_feature"}, ZeroesNewBlocks: true},
		},
		{
			name:   "no feature count at all",
			params: "8:16 8:32 128 0",
			want: ThinPoolTable{MetadataDev: DevNum{8, 16}, DataDev: DevNum{8, 32},
				DataBlockSectors: 128, ZeroesNewBlocks: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseThinPoolTable(tt.params)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseThinPoolTableErrors(t *testing.T) {
	for _, params := range []string{
		"",
		"253:0 253:1 128",                        // too short
		"253:0 253:1 128 0 1",                    // feature announced, none present
		"253:0 253:1 128 0 2 skip_block_zeroing", // more announced than present
		"253:0 253:1 128 0 0 skip_block_zeroing", // more present than announced
		"253:0 253:1 128 0 x skip_block_zeroing", // feature count
		"253:0 253:1 128 0 -1",                   // negative count
		"253:0 253:1 128 0 18446744073709551616", // count overflow
		"253:0 253:1 big 0 0",                    // block size
		"253:0 253:1 128 low 0",                  // low water mark
		"253:0 253:1 -128 0 0",                   // negative block size
		"/dev/meta 253:1 128 0 0",                // a path, which the kernel never prints
		"253:0 253 128 0 0",                      // data device
		"253:0 253:x 128 0 0",                    // data minor
		"4294967296:0 253:1 128 0 0",             // major out of range
		"Fail",                                   // a status word, not a table
	} {
		_, err := ParseThinPoolTable(params)
		assert.ErrorIs(t, err, ErrInvalidStatus, "%q", params)
	}
}
