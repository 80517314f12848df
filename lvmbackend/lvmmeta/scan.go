package lvmmeta

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Devices lists the block devices to scan: every device of
// /proc/partitions whose /dev path matches one of the globs, or without
// globs every one but device-mapper devices (LVs themselves, which lvm's
// default scan_lvs=0 skips too), CD and floppy drives. A PV on a
// device-mapper device (LUKS, multipath) needs a glob such as /dev/dm-*.
func Devices(globs []string) ([]string, error) {
	for _, g := range globs {
		if _, err := filepath.Match(g, ""); err != nil { // checks the whole pattern
			return nil, fmt.Errorf("device filter %q: %w", g, err)
		}
	}
	f, err := os.Open("/proc/partitions")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 4 || fs[0] == "major" {
			continue
		}
		name := fs[3]
		if len(globs) == 0 && (strings.HasPrefix(name, "dm-") || strings.HasPrefix(name, "sr") || strings.HasPrefix(name, "fd")) {
			continue
		}
		path := "/dev/" + name
		if matchAny(globs, path) {
			out = append(out, path)
		}
	}
	return out, sc.Err()
}

// matchAny: globs were checked by Devices.
func matchAny(globs []string, path string) bool {
	if len(globs) == 0 {
		return true
	}
	for _, g := range globs {
		if ok, _ := filepath.Match(g, path); ok {
			return true
		}
	}
	return false
}

// Scan reads every device in paths and combines what their labels say. A
// device that cannot be opened or has no label is not a PV and is left
// out; a PV whose metadata fails a check fails the scan, since the VG it
// belongs to cannot then be verified.
func (rd *Reader) Scan(ctx context.Context, paths []string) (*State, error) {
	var pvs []FoundPV
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		d, err := OpenDevice(p)
		if err != nil {
			if errors.Is(err, os.ErrPermission) {
				return nil, err
			}
			continue // vanished, empty loop device, no medium
		}
		m, err := rd.ReadPV(d, p)
		_ = d.Close()
		if errors.Is(err, ErrNoLabel) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if len(pvs) == rd.Limits.MaxPVs {
			return nil, fmt.Errorf("%w: more than %d PVs", ErrTooLarge, rd.Limits.MaxPVs)
		}
		pvs = append(pvs, FoundPV{Device: p, PVMetadata: m})
	}
	return Combine(pvs)
}
