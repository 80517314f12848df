package lvmmeta

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"unsafe"
)

// readAttempts bounds the retries when a commit moves the text while it is
// being read; lvm commits take milliseconds, so a handful suffices.
const readAttempts = 8

// PVMetadata is what one physical volume says about itself and its VG.
type PVMetadata struct {
	Label *Label
	// VG is the newest committed text of the PV's metadata areas; nil for
	// a PV in no VG or one without metadata areas.
	VG *VG
	// Wrapped says that VG's text wraps around the end of its ring.
	Wrapped bool
	// textCRC identifies VG's text, to tell two copies of one seqno apart.
	textCRC uint32
}

// Reader reads PVs and remembers the VG parsed from each metadata area, so
// that a text whose header has not moved is not read and parsed again. A
// header is always re-read; it carries the text's location and checksum,
// and lvm never rewrites committed text in place. Safe for concurrent use.
type Reader struct {
	Limits Limits
	mu     sync.Mutex
	cache  map[cacheKey]*VG
}

type cacheKey struct {
	dev  string
	area Area
	locn RawLocn
}

// NewReader returns a Reader with lim (zero fields take DefaultLimits).
func NewReader(lim Limits) *Reader {
	d := DefaultLimits
	if lim.MaxText == 0 {
		lim.MaxText = d.MaxText
	}
	if lim.MaxDepth == 0 {
		lim.MaxDepth = d.MaxDepth
	}
	if lim.MaxItems == 0 {
		lim.MaxItems = d.MaxItems
	}
	if lim.MaxPVs == 0 {
		lim.MaxPVs = d.MaxPVs
	}
	return &Reader{Limits: lim, cache: map[cacheKey]*VG{}}
}

// ReadPV reads the label, the metadata area headers and their committed
// text from r, a device called name (the cache key). Each area is read
// header → text → header; when the committed slot moved in between, the
// read starts again, so the result is always one committed state.
func (rd *Reader) ReadPV(r io.ReaderAt, name string) (*PVMetadata, error) {
	b := make([]byte, labelScanSectors*sectorSize)
	n, err := r.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read label: %w", err)
	}
	l, err := ParseLabel(b[:n])
	if err != nil {
		return nil, err
	}
	m := &PVMetadata{Label: l}
	for _, a := range l.MetadataAreas {
		vg, crc, wrapped, err := rd.readArea(r, name, a)
		if err != nil {
			return nil, fmt.Errorf("PV %s metadata area at %d: %w", l.PVUUID, a.Offset, err)
		}
		switch {
		case vg == nil:
		case m.VG == nil || vg.Seqno > m.VG.Seqno:
			m.VG, m.textCRC, m.Wrapped = vg, crc, wrapped
		case vg.Seqno == m.VG.Seqno && crc != m.textCRC:
			return nil, corrupt("PV "+l.PVUUID, "two metadata areas hold different texts for seqno %d", vg.Seqno)
		}
	}
	return m, nil
}

func (rd *Reader) readHeader(r io.ReaderAt, a Area) (*MDAHeader, error) {
	b := make([]byte, mdaHeaderSize)
	if _, err := r.ReadAt(b, int64(a.Offset)); err != nil {
		return nil, fmt.Errorf("read metadata area header: %w", err)
	}
	return ParseMDAHeader(b, a)
}

func (rd *Reader) readArea(r io.ReaderAt, name string, a Area) (vg *VG, crc uint32, wrapped bool, err error) {
	if a.Offset > 1<<62 || a.Size > 1<<62 {
		return nil, 0, false, corrupt("label", "metadata area %d+%d is beyond any device", a.Offset, a.Size)
	}
	h, err := rd.readHeader(r, a)
	if err != nil {
		return nil, 0, false, err
	}
	for attempt := 0; attempt < readAttempts; attempt++ {
		c := h.Committed
		if c.Flags&rawLocnIgnored != 0 || c.Size == 0 {
			return nil, 0, false, nil
		}
		key := cacheKey{name, a, c}
		rd.mu.Lock()
		vg := rd.cache[key]
		rd.mu.Unlock()
		wrapped := c.Offset+c.Size > h.Size
		if vg != nil {
			return vg, c.Checksum, wrapped, nil
		}
		if c.Size > rd.Limits.MaxText {
			return nil, 0, false, fmt.Errorf("%w: committed text of %d bytes (limit %d)", ErrTooLarge, c.Size, rd.Limits.MaxText)
		}
		spans, err := h.textSpans()
		if err != nil {
			return nil, 0, false, err
		}
		text, err := readSpans(r, spans, c.Size)
		if err != nil {
			return nil, 0, false, err
		}
		again, err := rd.readHeader(r, a)
		if err != nil {
			return nil, 0, false, err
		}
		if again.Committed != c {
			h = again // a commit landed meanwhile: read the new one
			continue
		}
		if got := checksum(text); got != c.Checksum {
			return nil, 0, false, &ChecksumError{What: "metadata text", Want: c.Checksum, Got: got}
		}
		// text is this call's own buffer, never written again: the VG's
		// strings may be slices of it without a copy.
		vg, err = parseVG(unsafe.String(unsafe.SliceData(text), len(text)), rd.Limits)
		if err != nil {
			return nil, 0, false, err
		}
		rd.mu.Lock()
		// One entry per area: drop the area's older texts.
		for k := range rd.cache {
			if k.dev == name && k.area == a {
				delete(rd.cache, k)
			}
		}
		rd.cache[key] = vg
		rd.mu.Unlock()
		return vg, c.Checksum, wrapped, nil
	}
	return nil, 0, false, ErrUnstable
}

// readSpans reads the text at spans (size bytes in all). A Device reads a
// text in one span (the usual case) straight into the buffer it returns.
func readSpans(r io.ReaderAt, spans []span, size uint64) ([]byte, error) {
	if d, ok := r.(interface {
		window(off int64, n int) ([]byte, error)
	}); ok && len(spans) == 1 {
		b, err := d.window(int64(spans[0].off), int(size))
		if err == nil && uint64(len(b)) < size {
			err = io.EOF
		}
		if err != nil {
			return nil, fmt.Errorf("read metadata text: %w", err)
		}
		return b, nil
	}
	text := make([]byte, size)
	at := uint64(0)
	for _, s := range spans {
		if _, err := r.ReadAt(text[at:at+s.n], int64(s.off)); err != nil {
			return nil, fmt.Errorf("read metadata text: %w", err)
		}
		at += s.n
	}
	return text, nil
}
