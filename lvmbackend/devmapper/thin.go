package devmapper

import "strings"

// ThinStatus is the status line of a thin target:
//
//	<nr mapped sectors> <highest mapped sector>
//
// where the highest mapped sector is "-" while nothing is mapped, or the
// single word "Fail" when the pool has failed.
type ThinStatus struct {
	// State is StateOK unless the kernel printed "Fail", "Error" or "-"
	// instead of numbers.
	State TargetState
	// MappedSectors is how much of the volume is backed by pool blocks, in
	// 512-byte sectors; a multiple of the pool's block size.
	MappedSectors uint64
	// HighestMappedSector is the last sector of the highest mapped block;
	// valid only when AnyMapped.
	HighestMappedSector uint64
	AnyMapped           bool
}

// MappedBytes is MappedSectors in bytes: the pool space the volume uses.
func (s ThinStatus) MappedBytes() uint64 { return sectorsToBytes(s.MappedSectors) }

// ParseThinStatus parses the status params of a thin target.
func ParseThinStatus(params string) (ThinStatus, error) {
	const target = "thin"
	f := strings.Fields(params)
	if st, ok := singleWordState(f); ok {
		return ThinStatus{State: st}, nil
	}
	if len(f) == 1 && f[0] == "-" {
		return ThinStatus{State: StateUnknown}, nil
	}
	if len(f) != 2 {
		return ThinStatus{}, invalidStatus(target, "%d fields, want 2", len(f))
	}
	s := ThinStatus{State: StateOK}
	var err error
	if s.MappedSectors, err = parseUint(target, "mapped sectors", f[0]); err != nil {
		return ThinStatus{}, err
	}
	if f[1] != "-" {
		if s.HighestMappedSector, err = parseUint(target, "highest mapped sector", f[1]); err != nil {
			return ThinStatus{}, err
		}
		s.AnyMapped = true
	}
	return s, nil
}
