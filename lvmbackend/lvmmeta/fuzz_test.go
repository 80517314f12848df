package lvmmeta

import (
	"bytes"
	"testing"
)

// The fuzz targets feed hostile bytes to every parser: none may panic, and
// ParseText's allocation is bounded by Limits (checked by its own bounds
// below rather than trusted).

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

func FuzzParseVG(f *testing.F) {
	f.Add(readTestdata(f, "vg0.vgtext"))
	f.Add([]byte(`vg { id = "x" seqno = 1 extent_size = 8 tags = ["a\"b"] x = [1, "s", -2] y = 1.5 }`))
	f.Fuzz(func(t *testing.T, b []byte) {
		vg, err := ParseVG(b, fuzzLimits)
		if err != nil {
			return
		}
		for i := range vg.LVs {
			_ = vg.SizeBytes(&vg.LVs[i])
		}
		_ = vg.FreeExtents()
	})
}

func FuzzReadPV(f *testing.F) {
	text := readTestdata(f, "vg0.vgtext")
	im := newImage(testPVUUID, uint64(len(text))+1024)
	im.commit(im.writeText(mdaHeaderSize+1000, text))
	f.Add(im.b)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = NewReader(fuzzLimits).ReadPV(bytes.NewReader(b), "fuzz")
	})
}
