//go:build guest

package agent

// make bench-wipe, in the test guest on real LVM: the wipe's throughput
// beside dd's on the same LV, and a writer's throughput on another LV while
// a large LV is wiped at the default --wipe-rate, beside the writer alone.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkWipe needs a block device to put its volume group on
// ($WIPE_BENCH_DEVICE: scripts/vm/bench.sh attaches a sparse file of the
// host as the guest's disk) and lvm; either missing fails the run.
func BenchmarkWipe(b *testing.B) {
	dev := os.Getenv("WIPE_BENCH_DEVICE")
	if dev == "" {
		b.Fatal("WIPE_BENCH_DEVICE names no block device")
	}
	const vg, bigMiB, writerMiB, rounds = "wipebench", 1024, 128, 3
	lvm := func(args ...string) {
		if out, err := exec.Command("lvm", args...).CombinedOutput(); err != nil {
			b.Fatalf("lvm %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	lvm("pvcreate", "-ff", "-y", dev)
	lvm("vgcreate", vg, dev)
	b.Cleanup(func() { _ = exec.Command("lvm", "vgremove", "-ff", vg).Run() })
	lvm("lvcreate", "-y", "-L", fmt.Sprintf("%dm", bigMiB), "-n", "big", vg)
	lvm("lvcreate", "-y", "-L", fmt.Sprintf("%dm", writerMiB), "-n", "writer", vg)
	big, writer := "/dev/"+vg+"/big", "/dev/"+vg+"/writer"
	// dd's rate in MiB/s, from its own count of bytes and seconds.
	dd := func(of string, mib int) float64 {
		start := time.Now()
		out, err := exec.Command("dd", "if=/dev/zero", "of="+of, "bs=4M", "oflag=direct", "count="+strconv.Itoa(mib/4)).CombinedOutput()
		if err != nil {
			b.Fatalf("dd of=%s: %v: %s", of, err, out)
		}
		return float64(mib) / time.Since(start).Seconds()
	}
	wipe := func(w *Wiper) (float64, error) {
		start := time.Now()
		err := w.zero(context.Background(), big, vg+"/big", 0, bigMiB<<20, NewMetrics(nil))
		return float64(bigMiB) / time.Since(start).Seconds(), err
	}
	median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	var dds, wipes, alone, during []float64
	for range rounds {
		dds = append(dds, dd(big, bigMiB))
		r, err := wipe(NewWiper(0))
		if err != nil {
			b.Fatal(err)
		}
		wipes = append(wipes, r)
		alone = append(alone, dd(writer, writerMiB))
		done, w := make(chan error, 1), NewWiper(128<<20) // the default --wipe-rate: 8 s for the LV
		go func() { _, err := wipe(w); done <- err }()
		for !slices.ContainsFunc(w.Wiping(), func(s WipeStatus) bool { return s.Done > 0 }) {
			select { // until its first chunk is zeroed
			case err := <-done:
				b.Fatalf("the wipe ended before the writer started: %v", err)
			case <-time.After(10 * time.Millisecond):
			}
		}
		during = append(during, dd(writer, writerMiB))
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(median(dds), "dd-MiB/s")
	b.ReportMetric(median(wipes), "wipe-MiB/s")
	b.ReportMetric(median(wipes)/median(dds), "wipe/dd")
	b.ReportMetric(median(alone), "writer-alone-MiB/s")
	b.ReportMetric(median(during), "writer-during-wipe-MiB/s")
	b.ReportMetric(median(during)/median(alone), "writer-during/alone")
	fmt.Printf("bench-wipe: medians of %d: dd %.0f MiB/s, the wipe (no bound) %.0f MiB/s on the same %d MiB LV: %.2f x dd (goal >= 0.9); "+
		"a writer on another LV %.0f MiB/s alone, %.0f MiB/s while the LV is wiped at the default 128Mi/s: %.2f (goal >= 0.5)\n",
		rounds, median(dds), median(wipes), bigMiB, median(wipes)/median(dds), median(alone), median(during), median(during)/median(alone))
}
