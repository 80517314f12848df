package lvmmeta

import (
	"bytes"
	"encoding/binary"
)

const (
	mdaHeaderSize = 512
	fmtVersion    = 1
	rawLocnSize   = 24
	// rawLocnIgnored marks a metadata area lvm was told to leave unused
	// (pvchange --metadataignore); its text is not maintained.
	rawLocnIgnored = 0x1
)

var mdaMagic = []byte(" LVM2 x[5A%r0N*>")

// RawLocn is one raw_locn slot: where a copy of the VG text lies in the
// metadata area (offset from the area's start) and its checksum.
type RawLocn struct {
	Offset, Size uint64
	Checksum     uint32
	Flags        uint32
}

// MDAHeader is a metadata area's header.
type MDAHeader struct {
	// Start and Size locate the whole area on the device (bytes); the
	// text ring is everything after the 512-byte header.
	Start, Size uint64
	// Committed is raw_locn slot 0; a zero Size means the area holds no VG.
	Committed RawLocn
}

// ParseMDAHeader decodes and verifies the 512-byte header at the start of
// metadata area a.
func ParseMDAHeader(b []byte, a Area) (*MDAHeader, error) {
	if len(b) < mdaHeaderSize {
		return nil, corrupt("metadata area header", "short: %d bytes", len(b))
	}
	b = b[:mdaHeaderSize]
	le := binary.LittleEndian
	if !bytes.Equal(b[4:20], mdaMagic) {
		return nil, corrupt("metadata area header", "bad magic %q", printable(b[4:20]))
	}
	if want, got := le.Uint32(b), checksum(b[4:]); want != got {
		return nil, &ChecksumError{What: "metadata area header", Want: want, Got: got}
	}
	if v := le.Uint32(b[20:]); v != fmtVersion {
		return nil, corrupt("metadata area header", "version %d", v)
	}
	h := &MDAHeader{Start: le.Uint64(b[24:]), Size: le.Uint64(b[32:])}
	if h.Start != a.Offset || h.Size != a.Size {
		return nil, corrupt("metadata area header", "says it spans %d+%d, the pv_header says %d+%d", h.Start, h.Size, a.Offset, a.Size)
	}
	if h.Start > 1<<62 || h.Size > 1<<62 {
		return nil, corrupt("metadata area header", "area %d+%d is beyond any device", h.Start, h.Size)
	}
	if h.Size <= mdaHeaderSize {
		return nil, corrupt("metadata area header", "area of %d bytes has no room for text", h.Size)
	}
	r := b[40:]
	h.Committed = RawLocn{Offset: le.Uint64(r), Size: le.Uint64(r[8:]), Checksum: le.Uint32(r[16:]), Flags: le.Uint32(r[20:])}
	return h, nil
}

// span is a byte range on the device.
type span struct{ off, n uint64 }

// textSpans says where the committed text lies on the device: one range,
// or two when it wraps past the end of the area and continues right after
// the header.
func (h *MDAHeader) textSpans() ([]span, error) {
	c := h.Committed
	ring := h.Size - mdaHeaderSize
	switch {
	case c.Size == 0:
		return nil, nil
	case c.Offset < mdaHeaderSize || c.Offset >= h.Size:
		return nil, corrupt("metadata area header", "text offset %d outside the area of %d bytes", c.Offset, h.Size)
	case c.Size > ring:
		return nil, corrupt("metadata area header", "text of %d bytes in a ring of %d", c.Size, ring)
	}
	first := min(c.Size, h.Size-c.Offset)
	spans := []span{{h.Start + c.Offset, first}}
	if first < c.Size {
		spans = append(spans, span{h.Start + mdaHeaderSize, c.Size - first})
	}
	return spans, nil
}
