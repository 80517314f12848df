package lvmbackend

import (
	"context"
	"fmt"
	"testing"

	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmmeta"
)

// BenchmarkDirectListVolumes is what Direct adds to a scan when it lists
// a class of 1,000 inactive LVs: each LV as lvmd's GetLVList reports it.
func BenchmarkDirectListVolumes(b *testing.B) {
	vg := &lvmmeta.VG{Name: "bench", UUID: "Fz3l2c-0J3n-QY1a-9mB0-ZL6e-Qa0d-Tb7E1x", ExtentSize: 1 << 20,
		PVs: []lvmmeta.PV{{Name: "pv0", UUID: "AbCdEf-0000-1111-2222-3333-4444-555555", PECount: 4096}}}
	for i := range 1000 {
		vg.LVs = append(vg.LVs, lvmmeta.LV{Name: fmt.Sprintf("lv%04d", i), UUID: fmt.Sprintf("bench0-0000-0000-0000-0000-0000-%06d", i),
			Status: []string{"READ", "WRITE", "VISIBLE"}, Tags: []string{fmt.Sprintf("lvm-agent.io/owner=%08d", i), "bench"},
			Segments: []lvmmeta.Segment{{ExtentCount: 1, Type: "striped", Areas: []lvmmeta.SegmentArea{{Name: "pv0", Start: uint64(i)}}}}})
	}
	d := NewDirect(nil, DirectConfig{DM: fakeDM{}, Classes: []DirectClass{{Name: "bench", VolumeGroup: "bench"}}})
	d.scanState = func(context.Context) (*lvmmeta.State, error) {
		return &lvmmeta.State{VGs: map[string]*lvmmeta.VG{"bench": vg}}, nil
	}
	b.ReportAllocs()
	for b.Loop() {
		vols, err := d.ListVolumes(context.Background(), "bench")
		if err != nil || len(vols) != 1000 {
			b.Fatalf("%v, %d volumes", err, len(vols))
		}
	}
}
