package devmapper

import (
	"strconv"
	"strings"
)

// TargetState is the health a thin or thin-pool target reports before any
// numbers: the kernel replaces the whole status line with a single word
// when it cannot produce one.
type TargetState string

const (
	// StateOK: the status line carries data.
	StateOK TargetState = "ok"
	// StateFail: the pool is in failure mode ("Fail"); no other field is
	// valid and the pool needs repair.
	StateFail TargetState = "Fail"
	// StateError: the kernel could not read the pool metadata while
	// building the status ("Error"); no other field is valid.
	StateError TargetState = "Error"
	// StateUnknown: a thin target without an open thin device ("-").
	StateUnknown TargetState = "-"
)

// singleWordState recognises the one-word status lines that replace the
// numbers when a pool has failed or its metadata cannot be read.
func singleWordState(fields []string) (TargetState, bool) {
	if len(fields) != 1 {
		return "", false
	}
	switch TargetState(fields[0]) {
	case StateFail:
		return StateFail, true
	case StateError:
		return StateError, true
	}
	return "", false
}

func parseUint(target, what, s string) (uint64, error) {
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, invalidStatus(target, "%s %q: not a number", what, s)
	}
	return v, nil
}

// parseRatio parses the "used/total" pairs of the thin-pool status.
func parseRatio(target, what, s string) (used, total uint64, err error) {
	u, t, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, invalidStatus(target, "%s %q: want used/total", what, s)
	}
	if used, err = parseUint(target, what, u); err != nil {
		return 0, 0, err
	}
	if total, err = parseUint(target, what, t); err != nil {
		return 0, 0, err
	}
	return used, total, nil
}

// sectorSize is the unit of target starts, lengths and thin sector counts.
const sectorSize = 512

// sectorsToBytes saturates rather than wrapping on absurd values, so a
// corrupt status cannot turn into a small number.
func sectorsToBytes(sectors uint64) uint64 {
	if sectors > ^uint64(0)/sectorSize {
		return ^uint64(0)
	}
	return sectors * sectorSize
}

func fraction(used, total uint64) float64 {
	if total == 0 {
		return 0
	}
	return float64(used) / float64(total)
}
