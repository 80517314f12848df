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
	b[0] = volumeType(lv, typ)
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
	b[6] = targetType(lv, typ)
	if vg.zeroes(lv, typ) {
		b[7] = 'z'
	}
	if slices.Contains(lv.Flags, "ACTIVATION_SKIP") || slices.Contains(lv.Status, "ACTIVATION_SKIP") {
		b[9] = 'k'
	}
	return string(b)
}

func volumeType(lv *LV, typ string) byte {
	switch {
	case typ == "thin-pool":
		return 't'
	case typ == "thin":
		return 'V'
	case strings.HasPrefix(typ, "cache") || typ == "writecache":
		return 'C'
	case strings.HasPrefix(typ, "raid"):
		return 'r'
	case strings.HasPrefix(typ, "mirror"):
		return 'm'
	case typ == "vdo-pool":
		return 'd'
	case typ == "vdo":
		return 'v'
	case len(lv.Snapshots) > 0:
		return 'o'
	case lv.Origin != "":
		return 's'
	case typ == "error" || typ == "zero":
		return 'v'
	}
	return '-'
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

func targetType(lv *LV, typ string) byte {
	switch {
	case typ == "thin" || typ == "thin-pool":
		return 't'
	case strings.HasPrefix(typ, "cache") || typ == "writecache":
		return 'C'
	case strings.HasPrefix(typ, "raid"):
		return 'r'
	case strings.HasPrefix(typ, "mirror"):
		return 'm'
	case strings.HasPrefix(typ, "vdo"):
		return 'V'
	case len(lv.Snapshots) > 0 || lv.Origin != "":
		return 's'
	case typ == "error" || typ == "zero":
		return 'v'
	}
	return '-'
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
