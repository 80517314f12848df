package lvmmeta

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkParseVG parses the text of a VG with 1,000 LVs.
func BenchmarkParseVG(b *testing.B) {
	text := manyLVText(b, 1000)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		vg, err := ParseVG(text, DefaultLimits)
		if err != nil || len(vg.LVs) != 1010 {
			b.Fatalf("%v, %d LVs", err, len(vg.LVs))
		}
	}
}

// BenchmarkScan reads a PV image file holding a VG of 1,000 LVs the way
// Direct reads a device (O_DIRECT where the file system allows it): cold
// with a fresh Reader, which parses the text, and cached with one Reader,
// whose header still points at the text it parsed.
func BenchmarkScan(b *testing.B) {
	if *flagPV != "" {
		benchScan(b, []string{*flagPV})
		return
	}
	text := manyLVText(b, 1000)
	// vg0's second PV keeps no text (pvchange --metadataignore), so that
	// one text is parsed, as on the guest's one-PV VG.
	pv0 := newImage("AbCdEf-0000-1111-2222-3333-4444-555555", 4<<20)
	pv0.commit(pv0.writeText(mdaHeaderSize, text))
	pv1 := newImage("GhIjKl-6666-7777-8888-9999-aaaa-bbbbbb", 4<<20)
	pv1.commit(RawLocn{Flags: rawLocnIgnored})
	dir := b.TempDir()
	var paths []string
	for i, im := range []*image{pv0, pv1} {
		paths = append(paths, filepath.Join(dir, fmt.Sprintf("pv%d.img", i)))
		if err := os.WriteFile(paths[i], im.b, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	benchScan(b, paths)
}

var flagPV = flag.String("pv", "", "BenchmarkScan: a PV image to read instead of the generated one (scripts/vm/bench.sh meta leaves a real one in its share: results/bench-pv.img)")

func benchScan(b *testing.B, paths []string) {
	scan := func(rd *Reader) {
		st, err := rd.Scan(context.Background(), paths)
		if err != nil {
			b.Fatal(err)
		}
		if len(st.VGs) != 1 {
			b.Fatalf("%d VGs", len(st.VGs))
		}
	}
	b.Run("cold", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			scan(NewReader(Limits{}))
		}
	})
	b.Run("cached", func(b *testing.B) {
		rd := NewReader(Limits{})
		scan(rd)
		b.ReportAllocs()
		for b.Loop() {
			scan(rd)
		}
	})
}
