package lvmmeta

import "testing"

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
