package devmapper

import (
	"strings"
)

// PoolMode is the thin-pool's operating mode.
type PoolMode string

const (
	PoolModeReadWrite      PoolMode = "rw"
	PoolModeReadOnly       PoolMode = "ro" // metadata errors or out of metadata space
	PoolModeOutOfDataSpace PoolMode = "out_of_data_space"
)

// DiscardMode is how the pool handles discards.
type DiscardMode string

const (
	DiscardPassdown   DiscardMode = "discard_passdown"    // discards reach the data device
	DiscardNoPassdown DiscardMode = "no_discard_passdown" // discards only unmap blocks
	DiscardIgnore     DiscardMode = "ignore_discard"      // discards are not processed
)

// NoSpacePolicy is what the pool does with writes when the data device is
// full.
type NoSpacePolicy string

const (
	NoSpaceQueue NoSpacePolicy = "queue_if_no_space" // hold I/O until extended (or the timeout)
	NoSpaceError NoSpacePolicy = "error_if_no_space" // fail I/O at once
)

// ThinPoolStatus is the status line of a thin-pool target, see the kernel's
// Documentation/admin-guide/device-mapper/thin-provisioning.rst:
//
//	<transaction id> <used metadata blocks>/<total metadata blocks>
//	<used data blocks>/<total data blocks> <held metadata root>
//	ro|rw|out_of_data_space [no_]discard_passdown [error|queue]_if_no_space
//	needs_check|- metadata_low_watermark
//
// Only the first four fields exist on every kernel; the rest arrived over
// time (and early kernels printed the discard word before the mode), so
// they are recognised by value and left zero when absent. Metadata blocks
// are 4 KiB; data blocks are the pool's block size (its table line's third
// field).
type ThinPoolStatus struct {
	// State is StateOK unless the kernel printed "Fail" or "Error", in
	// which case every other field is zero.
	State TargetState

	TransactionID       uint64
	UsedMetadataBlocks  uint64
	TotalMetadataBlocks uint64
	UsedDataBlocks      uint64
	TotalDataBlocks     uint64
	// HeldMetadataRoot is the metadata snapshot held for userspace, 0 for
	// none ("-"); block 0 is the superblock and can never be held.
	HeldMetadataRoot uint64

	Mode     PoolMode      // "" when not reported
	Discards DiscardMode   // "" when not reported
	NoSpace  NoSpacePolicy // "" when not reported
	// NeedsCheck: the metadata is flagged for thin_check; the pool will
	// not switch back to read-write until it has been checked.
	NeedsCheck bool
	// MetadataLowWatermark is the free-metadata-block threshold at which
	// the kernel raises an event; 0 when the kernel does not report it
	// (before Linux 4.19).
	MetadataLowWatermark uint64
}

// DataUsedFraction is used/total data blocks in [0, 1] (0 for an empty or
// failed pool).
func (s ThinPoolStatus) DataUsedFraction() float64 {
	return fraction(s.UsedDataBlocks, s.TotalDataBlocks)
}

// MetadataUsedFraction is used/total metadata blocks.
func (s ThinPoolStatus) MetadataUsedFraction() float64 {
	return fraction(s.UsedMetadataBlocks, s.TotalMetadataBlocks)
}

// ParseThinPoolStatus parses the status params of a thin-pool target.
func ParseThinPoolStatus(params string) (ThinPoolStatus, error) {
	const target = "thin-pool"
	f := strings.Fields(params)
	if st, ok := singleWordState(f); ok {
		return ThinPoolStatus{State: st}, nil
	}
	if len(f) < 4 {
		return ThinPoolStatus{}, invalidStatus(target, "%d fields, want at least 4", len(f))
	}
	s := ThinPoolStatus{State: StateOK}
	var err error
	if s.TransactionID, err = parseUint(target, "transaction id", f[0]); err != nil {
		return ThinPoolStatus{}, err
	}
	if s.UsedMetadataBlocks, s.TotalMetadataBlocks, err = parseRatio(target, "metadata blocks", f[1]); err != nil {
		return ThinPoolStatus{}, err
	}
	if s.UsedDataBlocks, s.TotalDataBlocks, err = parseRatio(target, "data blocks", f[2]); err != nil {
		return ThinPoolStatus{}, err
	}
	if f[3] != "-" {
		if s.HeldMetadataRoot, err = parseUint(target, "held metadata root", f[3]); err != nil {
			return ThinPoolStatus{}, err
		}
	}

	var sawWatermark bool
	for _, w := range f[4:] {
		switch w {
		case string(PoolModeReadWrite), string(PoolModeReadOnly), string(PoolModeOutOfDataSpace):
			if s.Mode != "" {
				return ThinPoolStatus{}, invalidStatus(target, "pool mode twice (%q, %q)", s.Mode, w)
			}
			s.Mode = PoolMode(w)
		case string(DiscardPassdown), string(DiscardNoPassdown), string(DiscardIgnore):
			if s.Discards != "" {
				return ThinPoolStatus{}, invalidStatus(target, "discard mode twice (%q, %q)", s.Discards, w)
			}
			s.Discards = DiscardMode(w)
		case string(NoSpaceQueue), string(NoSpaceError):
			if s.NoSpace != "" {
				return ThinPoolStatus{}, invalidStatus(target, "no-space policy twice (%q, %q)", s.NoSpace, w)
			}
			s.NoSpace = NoSpacePolicy(w)
		case "needs_check":
			s.NeedsCheck = true
		case "-":
			// needs_check not set
		default:
			// The only numeric field after the held root is the metadata
			// low watermark. Other unknown words are skipped so that a
			// field added by a newer kernel does not break the parse.
			if w[0] < '0' || w[0] > '9' {
				continue
			}
			if sawWatermark {
				return ThinPoolStatus{}, invalidStatus(target, "unexpected number %q after the low watermark", w)
			}
			if s.MetadataLowWatermark, err = parseUint(target, "metadata low watermark", w); err != nil {
				return ThinPoolStatus{}, err
			}
			sawWatermark = true
		}
	}
	return s, nil
}

// FeatureSkipBlockZeroing is the thin-pool table feature that turns off the
// zeroing of newly provisioned blocks (LVM's `lvcreate -Z n`).
const FeatureSkipBlockZeroing = "skip_block_zeroing"

// ThinPoolTable is the table line of a thin-pool target (Table), see the
// kernel's Documentation/admin-guide/device-mapper/thin-provisioning.rst:
//
//	<metadata dev> <data dev> <data block size (sectors)>
//	<low water mark (blocks)> [<#feature args> [<arg>]*]
//
// The kernel prints devices as major:minor and always prints the feature
// count, 0 when there are no features.
type ThinPoolTable struct {
	MetadataDev DevNum
	DataDev     DevNum
	// DataBlockSectors is the pool's data block size in 512-byte sectors:
	// the unit of the data block counts of ThinPoolStatus.
	DataBlockSectors uint64
	// LowWaterMark is the number of free data blocks at which the kernel
	// raises an event.
	LowWaterMark uint64
	// Features are the feature args, verbatim (skip_block_zeroing,
	// ignore_discard, no_discard_passdown, read_only, error_if_no_space,
	// or a newer kernel's); nil when there are none.
	Features []string
	// ZeroesNewBlocks: the pool overwrites a newly provisioned data block
	// with zeroes before a thin volume can read it (no skip_block_zeroing,
	// LVM's zero attribute, the 'z' of lv_attr). Without it a new thin
	// volume can read what a deleted one left in the pool's blocks.
	ZeroesNewBlocks bool
}

// ParseThinPoolTable parses the table params of a thin-pool target. The
// feature count must match the args that follow it exactly: a line this
// parser does not fully account for is an error rather than a guess, since
// ZeroesNewBlocks decides whether a pool may be used at all.
func ParseThinPoolTable(params string) (ThinPoolTable, error) {
	const target = "thin-pool table"
	f := strings.Fields(params)
	if len(f) < 4 {
		return ThinPoolTable{}, invalidStatus(target, "%d fields, want at least 4", len(f))
	}
	var t ThinPoolTable
	var err error
	if t.MetadataDev, err = parseDevNum(target, "metadata device", f[0]); err != nil {
		return ThinPoolTable{}, err
	}
	if t.DataDev, err = parseDevNum(target, "data device", f[1]); err != nil {
		return ThinPoolTable{}, err
	}
	if t.DataBlockSectors, err = parseUint(target, "data block size", f[2]); err != nil {
		return ThinPoolTable{}, err
	}
	if t.LowWaterMark, err = parseUint(target, "low water mark", f[3]); err != nil {
		return ThinPoolTable{}, err
	}
	t.ZeroesNewBlocks = true
	if len(f) == 4 {
		return t, nil
	}
	n, err := parseUint(target, "feature count", f[4])
	if err != nil {
		return ThinPoolTable{}, err
	}
	args := f[5:]
	if n != uint64(len(args)) {
		return ThinPoolTable{}, invalidStatus(target, "%d feature args announced, %d present", n, len(args))
	}
	if len(args) > 0 {
		t.Features = args
	}
	for _, a := range args {
		// The kernel matches feature names case-insensitively.
		if strings.EqualFold(a, FeatureSkipBlockZeroing) {
			t.ZeroesNewBlocks = false
		}
	}
	return t, nil
}
