//go:build guest

package devmapper

// BenchmarkDeviceState: what reading the state of 200 LVs costs through
// this package, through one lvs and through one dmsetup status, in the
// guest (`make bench-dm`):
//
//	devmapper.test -test.run '^$' -test.bench DeviceState -test.benchtime 3s
//
// The volume group has 100 linear LVs, a thin pool and 99 thin LVs. The
// table is printed, and written to $LVM_AGENT_RESULTS/bench-dm.txt when
// that is set.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const benchLinear, benchThin = 100, 99

func BenchmarkDeviceState(b *testing.B) {
	ctl := openGuest(b, "lvm", "dmsetup", "losetup")
	ctx := context.Background()
	vg := fmt.Sprintf("dmbench%d", os.Getpid())
	t0 := time.Now()
	newVG(b, vg, 1<<30)
	// All the LVs from one lvm shell, created inactive (-an, which for a
	// linear LV needs -Zn: there is no device to zero through), then one
	// vgchange activates them. The pool stays active, as thin creates need.
	var script strings.Builder
	lvNames := []string{"pool"}
	for i := range benchLinear {
		fmt.Fprintf(&script, "lvcreate -y -an -Zn -L 4m -n lin%03d %s\n", i, vg)
		lvNames = append(lvNames, fmt.Sprintf("lin%03d", i))
	}
	fmt.Fprintf(&script, "lvcreate -y --type thin-pool -L 256m -n pool %s\n", vg)
	for i := range benchThin {
		fmt.Fprintf(&script, "lvcreate -y -an -V 1g -n thin%03d --thinpool pool %s\n", i, vg)
		lvNames = append(lvNames, fmt.Sprintf("thin%03d", i))
	}
	lvm(b, script.String())
	lvm(b, "", "vgchange", "-ay", vg)
	setup := time.Since(t0)

	// Each sub-benchmark's reads and time per read (the last measurement,
	// with -test.count > 1).
	type result struct {
		n   int
		per time.Duration
	}
	results := map[string]result{}
	var devices int // device-mapper devices on the node
	run := func(name string, read func(b *testing.B)) {
		b.Run(name, func(b *testing.B) {
			read(b)
			results[name] = result{b.N, b.Elapsed() / time.Duration(b.N)}
		})
	}

	// The package: every device's info (state, open count) and status,
	// with the thin and thin-pool status parsed into the model.
	run("package", func(b *testing.B) {
		var all []DeviceStatus
		for b.Loop() {
			var err error
			if all, err = ctl.StatusAll(ctx); err != nil {
				b.Fatal(err)
			}
			for _, d := range deviceStates(all, nil) {
				if d.Name == vg+"-pool-tpool" && d.ThinPool == nil {
					b.Fatalf("%s: thin-pool status not parsed", d.Name)
				}
			}
		}
		devices = len(all)
		seen := map[string]bool{}
		for _, d := range all {
			seen[d.Info.Name] = d.Info.LiveTable && len(d.Targets) > 0
		}
		for _, lv := range lvNames {
			if !seen[vg+"-"+lv] {
				b.Fatalf("StatusAll: no active device for %s/%s (%d devices)", vg, lv, len(all))
			}
		}
	})
	// What `lvm-agent volume status` and the agent's device metrics read
	// (Snapshot): the same, plus each thin volume's table, to name its pool.
	run("package+pools", func(b *testing.B) {
		for b.Loop() {
			snap, err := ctl.Snapshot(ctx)
			if err != nil {
				b.Fatal(err)
			}
			for _, d := range snap {
				if d.Thin != nil && d.Pool == (DevNum{}) {
					b.Fatalf("%s: no pool device", d.Name)
				}
			}
		}
	})
	// One lvs for the same state: active, suspended, open, data and
	// metadata use (lv_attr has them too, and the pool's health).
	run("lvs", func(b *testing.B) {
		var rows []lvsRow
		for b.Loop() {
			out, err := exec.Command("lvm", "lvs", "--reportformat", "json", "-o",
				"lv_name,lv_attr,lv_active,lv_suspended,lv_device_open,data_percent,metadata_percent", vg).Output()
			if err != nil {
				b.Fatal(err)
			}
			if rows, err = parseLVS(string(out)); err != nil {
				b.Fatal(err)
			}
		}
		if len(rows) != len(lvNames) {
			b.Fatalf("lvs: %d LVs, want %d", len(rows), len(lvNames))
		}
	})
	// One dmsetup status, without the thin-pool metadata commit, like the
	// package's queries.
	run("dmsetup", func(b *testing.B) {
		var out []byte
		for b.Loop() {
			var err error
			if out, err = exec.Command("dmsetup", "status", "--noflush").Output(); err != nil {
				b.Fatal(err)
			}
		}
		if n := strings.Count(string(out), "\n"); n < len(lvNames) {
			b.Fatalf("dmsetup status: %d lines, want at least %d", n, len(lvNames))
		}
	})
	if len(results) != 4 {
		return // a sub-benchmark failed
	}

	var out strings.Builder
	fmt.Fprintf(&out, "\n==== bench-dm: the state of %d LVs (%d linear, a thin pool, %d thin) ====\n", len(lvNames), benchLinear, benchThin)
	fmt.Fprintf(&out, "%d device-mapper devices; LVs created and activated in %.1f s\n", devices, setup.Seconds())
	fmt.Fprintf(&out, "%-48s %10s %6s %11s\n", "reader", "per read", "reads", "vs package")
	for _, row := range [][2]string{
		{"package", "devmapper: StatusAll + parse thin(-pool)"},
		{"package+pools", "devmapper: Snapshot (+ each thin LV's pool)"},
		{"lvs", "lvm lvs --reportformat json (1 process)"},
		{"dmsetup", "dmsetup status --noflush (1 process)"},
	} {
		r := results[row[0]]
		fmt.Fprintf(&out, "%-48s %7.2f ms %6d %10.1fx\n", row[1], float64(r.per)/1e6, r.n, float64(r.per)/float64(results["package"].per))
	}
	fmt.Print(out.String())
	if dir := os.Getenv("LVM_AGENT_RESULTS"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "bench-dm.txt"), []byte(out.String()), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}
