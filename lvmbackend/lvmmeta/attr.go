package lvmmeta

import (
	"slices"
	"strings"
)

// Attr renders an LV's lv_attr the way lvs prints it, from the metadata
// and the device's state (active: the device-mapper device exists with a
// live table; open: it has openers). Health (the ninth character) needs
// the kernel's target status and is always '-'.
func (vg *VG) Attr(lv *LV, active, open bool) string {
	b := []byte("----------")
	typ := lv.Type()
	b[0], b[6] = typeChars(lv, typ)
	b[1] = 'r'
	if slices.Contains(lv.Status, "WRITE") {
		b[1] = 'w'
	}
	b[2] = allocation(lv.AllocationPolicy)
	if slices.Contains(lv.Status, "LOCKED") {
		b[2] -= 'a' - 'A'
	}
	if slices.Contains(lv.Status, "FIXED_MINOR") {
		b[3] = 'm'
	}
	if active {
		b[4] = 'a'
	}
	if open {
		b[5] = 'o'
	}
	if vg.zeroes(lv, typ) {
		b[7] = 'z'
	}
	if slices.Contains(lv.Flags, "ACTIVATION_SKIP") || slices.Contains(lv.Status, "ACTIVATION_SKIP") {
		b[9] = 'k'
	}
	return string(b)
}

// segmentChars are lv_attr's volume type (first) and target type (seventh)
// characters for the segment types that decide them.
func segmentChars(typ string) (volume, target byte, ok bool) {
	switch {
	case typ == "thin-pool":
		return 't', 't', true
	case typ == "thin":
		return 'V', 't', true
	case strings.HasPrefix(typ, "cache") || typ == "writecache":
		return 'C', 'C', true
	case strings.HasPrefix(typ, "raid"):
		return 'r', 'r', true
	case strings.HasPrefix(typ, "mirror"):
		return 'm', 'm', true
	case typ == "vdo-pool":
		return 'd', 'V', true
	case typ == "vdo":
		return 'v', 'V', true
	}
	return 0, 0, false
}

// typeChars adds the snapshot relations and virtual segments to segmentChars.
func typeChars(lv *LV, typ string) (volume, target byte) {
	if v, t, ok := segmentChars(typ); ok {
		return v, t
	}
	switch {
	case len(lv.Snapshots) > 0:
		return 'o', 's'
	case lv.Origin != "":
		return 's', 's'
	case typ == "error" || typ == "zero":
		return 'v', 'v'
	}
	return '-', '-'
}

func allocation(policy string) byte {
	switch policy {
	case "contiguous":
		return 'c'
	case "cling", "cling_by_tags":
		return 'l'
	case "normal":
		return 'n'
	case "anywhere":
		return 'a'
	}
	return 'i'
}

// zeroes: a thin pool with zeroing, and its thin volumes, show 'z'.
func (vg *VG) zeroes(lv *LV, typ string) bool {
	switch typ {
	case "thin-pool":
		return lv.Segments[0].ZeroNewBlocks
	case "thin":
		if p := vg.LV(lv.Pool); p != nil && p.Type() == "thin-pool" {
			return p.Segments[0].ZeroNewBlocks
		}
	}
	return false
}
