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
