package lvmmeta

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// On-disk constants of LVM2's text format (lib/label/label.h,
// lib/format_text/layout.h).
const (
	sectorSize = 512
	// labelScanSectors: the label is in one of the first four sectors.
	labelScanSectors = 4
	labelHeaderSize  = 32
	pvHeaderMinSize  = 32 + 8 // uuid and device size
	areaSize         = 16     // {offset, size} u64 pair
	// maxAreas bounds each area list; lvm writes at most two metadata
	// areas and one data area.
	maxAreas = 8
)

var (
	labelID   = []byte("LABELONE")
	labelType = []byte("LVM2 001")
)

// Area is a {offset, size} pair of a pv_header list, in bytes from the
// start of the device.
type Area struct {
	Offset, Size uint64
}

// Label is a physical volume's label and pv_header.
type Label struct {
	// Sector is where the label was found (0-3, normally 1).
	Sector uint64
	// PVUUID is the PV's uuid as lvm prints it (6-4-4-4-4-4-6 with dashes).
	PVUUID string
	// DeviceSize is the size lvm recorded for the device, in bytes.
	DeviceSize    uint64
	DataAreas     []Area
	MetadataAreas []Area
}

// ParseLabel finds and decodes the label in the first sectors of a device
// (b holds at least the first labelScanSectors*512 bytes, or fewer for a
// tiny device). A device without a label is ErrNoLabel.
func ParseLabel(b []byte) (*Label, error) {
	for s := 0; s < labelScanSectors && (s+1)*sectorSize <= len(b); s++ {
		sec := b[s*sectorSize : (s+1)*sectorSize]
		if !bytes.Equal(sec[:8], labelID) {
			continue
		}
		return parseLabelSector(uint64(s), sec)
	}
	return nil, ErrNoLabel
}

// label_header: id[8] sector u64 crc u32 offset u32 type[8]; the CRC covers
// the sector from the offset field to its end.
func parseLabelSector(s uint64, sec []byte) (*Label, error) {
	le := binary.LittleEndian
	if got := le.Uint64(sec[8:]); got != s {
		return nil, corrupt("label", "label in sector %d says it is in sector %d", s, got)
	}
	if want, got := le.Uint32(sec[16:]), checksum(sec[20:]); want != got {
		return nil, &ChecksumError{What: "label", Want: want, Got: got}
	}
	if !bytes.Equal(sec[24:32], labelType) {
		return nil, fmt.Errorf("%w: label type %q", ErrUnsupported, printable(sec[24:32]))
	}
	off := le.Uint32(sec[20:])
	if off < labelHeaderSize || uint64(off)+pvHeaderMinSize > sectorSize {
		return nil, corrupt("label", "pv_header offset %d outside the label sector", off)
	}
	pv := sec[off:]
	l := &Label{Sector: s, PVUUID: formatUUID(pv[:32]), DeviceSize: le.Uint64(pv[32:])}
	rest := pv[pvHeaderMinSize:]
	var err error
	if l.DataAreas, rest, err = parseAreas(rest, "data area"); err != nil {
		return nil, err
	}
	if l.MetadataAreas, _, err = parseAreas(rest, "metadata area"); err != nil {
		return nil, err
	}
	return l, nil
}

// parseAreas reads {offset,size} pairs up to the {0,0} that ends the list.
func parseAreas(b []byte, what string) ([]Area, []byte, error) {
	var areas []Area
	for {
		if len(b) < areaSize {
			return nil, nil, corrupt("label", "%s list runs past the label sector", what)
		}
		a := Area{Offset: binary.LittleEndian.Uint64(b), Size: binary.LittleEndian.Uint64(b[8:])}
		b = b[areaSize:]
		if a.Offset == 0 && a.Size == 0 {
			return areas, b, nil
		}
		if len(areas) == maxAreas {
			return nil, nil, corrupt("label", "more than %d entries in the %s list", maxAreas, what)
		}
		areas = append(areas, a)
	}
}

// formatUUID prints a 32-character LVM uuid the way lvm does:
// 6-4-4-4-4-4-6 characters between dashes. Bytes that are not uuid
// characters are kept (printable) so that a mismatch shows.
func formatUUID(b []byte) string {
	s := printable(b)
	if len(s) != 32 {
		return s
	}
	return s[0:6] + "-" + s[6:10] + "-" + s[10:14] + "-" + s[14:18] + "-" + s[18:22] + "-" + s[22:26] + "-" + s[26:32]
}

// printable replaces bytes outside printable ASCII with '?'.
func printable(b []byte) string {
	out := make([]byte, len(b))
	for i, c := range b {
		if c < 0x21 || c > 0x7e {
			c = '?'
		}
		out[i] = c
	}
	return string(out)
}
