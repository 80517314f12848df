package lvmmeta

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"testing"
)

// The fuzz targets feed hostile bytes to every parser: none may panic, and
// what the text parse and a whole PV read allocate is linear in the input
// (checked with allocated and allocBound rather than trusted): no size
// field read from the disk is allocated before it is checked, and every
// item costs at least a byte of text (Limits.MaxItems caps them too).

// allocated runs fn and returns the bytes the process allocated meanwhile,
// other goroutines' included (allocBound's constant leaves room for them).
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// allocBound is what reading n hostile bytes may allocate: a list element
// of two bytes ("1,") costs some 300 bytes of Values while its list is
// collected and copied; 64 KiB covers the fixed buffers.
func allocBound(n int) uint64 { return 64<<10 + 512*uint64(n) }

func FuzzParseLabel(f *testing.F) {
	im := newImage(testPVUUID, 8192)
	f.Add(im.b[:labelScanSectors*sectorSize])
	f.Add(make([]byte, 2048))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := ParseLabel(b)
		if err == nil && (len(l.DataAreas) > maxAreas || len(l.MetadataAreas) > maxAreas) {
			t.Fatalf("too many areas: %+v", l)
		}
	})
}

func FuzzParseMDAHeader(f *testing.F) {
	im := newImage(testPVUUID, 8192)
	im.commit(RawLocn{Offset: 7000, Size: 4000, Checksum: 5})
	f.Add(im.b[im.mdaStart:im.mdaStart+mdaHeaderSize], uint64(4096), uint64(8192))
	f.Fuzz(func(t *testing.T, b []byte, off, size uint64) {
		h, err := ParseMDAHeader(b, Area{off, size})
		if err != nil {
			return
		}
		spans, err := h.textSpans()
		if err != nil {
			return
		}
		var n uint64
		for _, s := range spans {
			if s.off < h.Start+mdaHeaderSize || s.off+s.n > h.Start+h.Size {
				t.Fatalf("span %+v outside the area %d+%d", s, h.Start, h.Size)
			}
			n += s.n
		}
		if n != h.Committed.Size {
			t.Fatalf("spans cover %d bytes, want %d", n, h.Committed.Size)
		}
	})
}

var fuzzLimits = Limits{MaxText: 1 << 20, MaxDepth: 16, MaxItems: 1 << 14, MaxPVs: 16}

// smallVG is a seed small enough for the fuzzer to minimize quickly what it
// derives from it (vg0.vgtext, 8 KiB, keeps a worker minimizing for the
// whole of a short run).
const smallVG = `vg { id = "a" seqno = 3 extent_size = 8192 status = ["READ", "WRITE"]
physical_volumes { pv0 { id = "p" pe_start = 2048 pe_count = 9 } }
logical_volumes {
l { id = "b" status = ["VISIBLE"] tags = ["t\"x"] segment_count = 1
segment1 { start_extent = 0 extent_count = 2 type = "striped" stripe_count = 1 stripes = ["pv0", 0] } }
p { id = "c" segment_count = 1 segment1 { start_extent = 0 extent_count = 1 type = "thin-pool" zero_new_blocks = 1 } }
t { id = "d" segment_count = 1 segment1 { start_extent = 0 extent_count = 4 type = "thin" thin_pool = "p" origin = "l" } }
s { id = "e" segment_count = 1 segment1 { start_extent = 0 extent_count = 1 type = "snapshot" origin = "l" cow_store = "l" } }
} }
`

func FuzzParseVG(f *testing.F) {
	f.Add([]byte(smallVG))
	f.Add([]byte(`vg { id = "x" seqno = 1 extent_size = 8 tags = ["a\"b"] x = [1, "s", -2] y = 1.5 }`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var vg *VG
		var err error
		if a := allocated(func() { vg, err = ParseVG(b, fuzzLimits) }); a > allocBound(len(b)) {
			t.Fatalf("%d bytes allocated for %d bytes of text", a, len(b))
		}
		if err != nil {
			return
		}
		for i := range vg.LVs {
			_ = vg.SizeBytes(&vg.LVs[i])
		}
		_ = vg.FreeExtents()
	})
}

// FuzzReadPV fuzzes a whole PV from its three parts: the label sector, the
// metadata area header and the text ring. The label's and header's CRCs are
// recomputed after mutation, so that the fuzzer reaches the area and text
// logic (offsets, sizes, wrapping) instead of stopping at a checksum.
func FuzzReadPV(f *testing.F) {
	text := []byte(smallVG)
	im := newImage(testPVUUID, mdaHeaderSize+uint64(len(text))+64)
	c := im.writeText(mdaHeaderSize+100, text) // wrapped
	im.commit(c)
	ring := im.b[im.mdaStart+mdaHeaderSize : im.mdaStart+im.mdaSize]
	f.Add(im.b[sectorSize:2*sectorSize], im.b[im.mdaStart:im.mdaStart+mdaHeaderSize], ring)
	f.Fuzz(func(t *testing.T, label, header, ring []byte) {
		if len(ring) > 1<<16 {
			return
		}
		b := make([]byte, 4096+mdaHeaderSize+len(ring))
		sec := b[sectorSize : 2*sectorSize]
		copy(sec, label)
		binary.LittleEndian.PutUint32(sec[16:], checksum(sec[20:]))
		h := b[4096 : 4096+mdaHeaderSize]
		copy(h, header)
		binary.LittleEndian.PutUint32(h, checksum(h[4:]))
		copy(b[4096+mdaHeaderSize:], ring)
		var m *PVMetadata
		var err error
		if a := allocated(func() { m, err = NewReader(fuzzLimits).ReadPV(bytes.NewReader(b), "fuzz") }); a > allocBound(len(b)) {
			t.Fatalf("%d bytes allocated for a PV of %d bytes", a, len(b))
		}
		if err == nil && m.VG != nil && m.VG.Seqno > 1<<63 {
			t.Fatalf("seqno %d", m.VG.Seqno)
		}
	})
}
