//go:build guest

package lvmmeta_test

// TestGuestBench prints the rows of issue 15's table (scripts/guest/bench.sh
// runs it by name; the suite leaves it out): reading the tags of 1,000 LVs
// through this package, `lvs` and lvmd's GetLVList; and the lvm processes
// and time of a create and a delete made the way the agent makes them,
// through lvmd alone and through lvmbackend.Direct, counted with an lvm
// wrapper as lvmd's lvm-command-prefix that logs each exec.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lvm-agent/lvm-agent/lvmbackend"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmmeta"
)

const benchLVs = 1000

// manyLVs gives vg benchLVs more LVs of one extent, tagged, in one
// vgcfgrestore: lvcreate would take ~20 min under TCG. lvm checks and
// writes the restored metadata itself, so the disks hold real metadata.
func manyLVs(t *testing.T, vg string) {
	dir := t.TempDir()
	backup := filepath.Join(dir, "vg")
	lvm(t, "vgcfgbackup", "-f", backup, vg)
	text, err := os.ReadFile(backup)
	require.NoError(t, err)
	marker := []byte("logical_volumes {\n")
	at := bytes.Index(text, marker)
	require.Positive(t, at, "the backup has an LV section")
	at += len(marker)
	out := slices.Concat(text[:at], []byte(lvmmeta.LVSections(benchLVs, 64)), text[at:])
	require.NoError(t, os.WriteFile(backup, out, 0o600))
	lvm(t, "vgcfgrestore", "-f", backup, vg)
}

// capturePV copies the label and metadata area of the benchmark's PV into
// $LVM_AGENT_RESULTS/bench-pv.img (the share directory), for profiling
// the reader on the host: go test -bench Scan -pv bench-pv.img.
func capturePV(t *testing.T, dev string) {
	dir := os.Getenv("LVM_AGENT_RESULTS")
	if dir == "" {
		return
	}
	run(t, "dd", "if="+dev, "of="+filepath.Join(dir, "bench-pv.img"), "bs=1M", "count=17")
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// timeIt runs fn n times and returns the median.
func timeIt(t *testing.T, n int, fn func() error) time.Duration {
	var ds []time.Duration
	for range n {
		t0 := time.Now()
		require.NoError(t, fn())
		ds = append(ds, time.Since(t0))
	}
	return median(ds)
}

func TestGuestBench(t *testing.T) {
	const vg = "metabench"
	ctx := context.Background()
	dm := openDM(t)
	devs := newVG(t, vg, 1, 4<<30, "--metadatasize", "16m")
	lvm(t, "vgchange", "-s", "1m", vg)
	lvm(t, "lvcreate", "-y", "-an", "-Zn", "-L", "1m", "-n", "first", vg)
	manyLVs(t, vg)
	capturePV(t, devs[0])
	lvmd, execLog := startLVMD(t, vg)
	direct := lvmbackend.NewDirect(lvmd, lvmbackend.DirectConfig{DM: dm, Devices: devs,
		Classes: []lvmbackend.DirectClass{{Name: "bench", VolumeGroup: vg}}})
	const n = 5
	var rows []string
	row := func(format string, args ...any) {
		rows = append(rows, fmt.Sprintf(format, args...))
		t.Logf(format, args...)
	}

	// Reading the tags of 1,000 LVs (1,001 with "first").
	count := func(vols []lvmbackend.Volume, err error) error {
		if err == nil && len(vols) != benchLVs+1 {
			err = fmt.Errorf("%d volumes, want %d", len(vols), benchLVs+1)
		}
		return err
	}
	goCold := timeIt(t, n, func() error {
		// A fresh reader parses the text again each time.
		d := lvmbackend.NewDirect(lvmd, lvmbackend.DirectConfig{DM: dm, Devices: devs,
			Classes: []lvmbackend.DirectClass{{Name: "bench", VolumeGroup: vg}}})
		return count(d.ListVolumes(ctx, "bench"))
	})
	goWarm := timeIt(t, n, func() error { return count(direct.ListVolumes(ctx, "bench")) })
	lvs := timeIt(t, n, func() error {
		out, err := exec.Command("lvm", "lvs", "--noheadings", "-o", "lv_name,lv_tags", vg).Output()
		if err == nil && bytes.Count(out, []byte("\n")) != benchLVs+1 {
			err = fmt.Errorf("lvs printed %d lines", bytes.Count(out, []byte("\n")))
		}
		return err
	})
	getLVList := timeIt(t, n, func() error { return count(lvmd.ListVolumes(ctx, "bench")) })
	vols, err := direct.ListVolumes(ctx, "bench")
	require.NoError(t, err)
	viaLVMD, err := lvmd.ListVolumes(ctx, "bench")
	require.NoError(t, err)
	byName := func(vs []lvmbackend.Volume) map[string][]string {
		m := map[string][]string{}
		for _, v := range vs {
			// topolvm's lvmd reports an LV without tags as [""].
			m[v.Name] = slices.DeleteFunc(slices.Clone(v.Tags), func(t string) bool { return t == "" })
			if len(m[v.Name]) == 0 {
				m[v.Name] = nil
			}
		}
		return m
	}
	assert.Equal(t, byName(viaLVMD), byName(vols), "the same tags as lvmd's GetLVList")
	// The scan alone (label, header, text and CRC, parse): what the cold
	// read adds to the cached one.
	scan := func(rd *lvmmeta.Reader) error {
		st, err := rd.Scan(ctx, devs)
		if err == nil && len(st.VGs[vg].LVs) != benchLVs+1 {
			err = fmt.Errorf("%d LVs", len(st.VGs[vg].LVs))
		}
		return err
	}
	scanCold := timeIt(t, n, func() error { return scan(lvmmeta.NewReader(lvmmeta.Limits{})) })
	warm := lvmmeta.NewReader(lvmmeta.Limits{})
	require.NoError(t, scan(warm))
	scanWarm := timeIt(t, n, func() error { return scan(warm) })
	steps := coldSteps(t, n, devs)
	row("cold read by step, medians of %d (each step alone; the reader does them once each): %s", n, steps)
	dmList := timeIt(t, n, func() error { _, err := dm.List(ctx); return err })
	row("of the cached read (no scan): device-mapper's device list %v, the rest (1,001 volumes built) %v",
		dmList.Round(time.Microsecond), (goWarm - scanWarm - dmList).Round(time.Microsecond))
	row("tags of %d LVs: pure Go %v (parse included; %v with the parsed text cached), lvs %v, lvmd GetLVList %v",
		benchLVs+1, goCold.Round(time.Microsecond), goWarm.Round(time.Microsecond), lvs.Round(time.Millisecond), getLVList.Round(time.Millisecond))
	row("ratio lvs / pure Go: %.0fx, GetLVList / pure Go: %.0fx (goal >= 30x); with the text cached: %.0fx, %.0fx",
		lvs.Seconds()/goCold.Seconds(), getLVList.Seconds()/goCold.Seconds(),
		lvs.Seconds()/goWarm.Seconds(), getLVList.Seconds()/goWarm.Seconds())
	row("of which lvmmeta.Reader.Scan (label, header, text, CRC, parse): %v fresh, %v with the text cached",
		scanCold.Round(time.Microsecond), scanWarm.Round(time.Microsecond))

	// lvm processes per create and delete. Each measurement ends after a
	// settle, so that a fullreport lvmd starts for a Watch stream after
	// the change is counted with it.
	execs := func() int {
		b, err := os.ReadFile(execLog)
		if os.IsNotExist(err) {
			return 0
		}
		require.NoError(t, err)
		return bytes.Count(b, []byte("\n"))
	}
	const settle = 3 * time.Second
	measure := func(fn func() error) (int, time.Duration) {
		time.Sleep(settle)
		before := execs()
		t0 := time.Now()
		require.NoError(t, fn())
		d := time.Since(t0)
		time.Sleep(settle)
		return execs() - before, d
	}
	req := func(name string) lvmbackend.CreateRequest {
		return lvmbackend.CreateRequest{DeviceClass: "bench", Name: name, SizeBytes: 4 << 20, Tags: []string{"lvm-agent.io/owner=x"}}
	}
	create := func(b lvmbackend.Backend, name string) func() error {
		return func() error { _, err := b.CreateVolume(ctx, req(name)); return err }
	}
	// The agent's delete: GetVolume (tags, protected) then RemoveVolume.
	agentDelete := func(b lvmbackend.Backend, name string) func() error {
		return func() error {
			if _, err := b.GetVolume(ctx, "bench", name); err != nil {
				return err
			}
			return b.RemoveVolume(ctx, "bench", name)
		}
	}
	remove := func(b lvmbackend.Backend, name string) func() error {
		return func() error { return b.RemoveVolume(ctx, "bench", name) }
	}
	// watch holds the agent's capacity watch open on b while fn runs.
	watch := func(b lvmbackend.Backend, fn func()) {
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = b.WatchCapacity(wctx, func([]lvmbackend.Capacity) {}) }()
		fn()
		cancel()
		<-done
	}
	type result struct {
		creates, deletes []int
		delTimes         []time.Duration
	}
	run := func(label string, b lvmbackend.Backend, del func(lvmbackend.Backend, string) func() error) result {
		var r result
		for i := range n {
			name := fmt.Sprintf("%s%d", label, i)
			c, _ := measure(create(b, name))
			d, dt := measure(del(b, name))
			r.creates, r.deletes, r.delTimes = append(r.creates, c), append(r.deletes, d), append(r.delTimes, dt)
		}
		return r
	}
	raw := run("raw", lvmd, remove)
	var viaTopolvm, viaDirect result
	watch(lvmd, func() { viaTopolvm = run("old", lvmd, agentDelete) })
	watch(direct, func() { viaDirect = run("new", direct, agentDelete) })
	row("lvm processes per create / delete: lvmd CreateLV %v / RemoveLV %v; agent via lvmd only (GetLVList, Watch open) %v / %v; agent via Direct %v / %v",
		raw.creates, raw.deletes, viaTopolvm.creates, viaTopolvm.deletes, viaDirect.creates, viaDirect.deletes)
	row("delete (GetVolume + RemoveVolume) / lvmd RemoveLV, medians of %d: via lvmd only %.2f, via Direct %.2f (goal <= 1.10); RemoveLV %v",
		n, median(viaTopolvm.delTimes).Seconds()/median(raw.delTimes).Seconds(),
		median(viaDirect.delTimes).Seconds()/median(raw.delTimes).Seconds(), median(raw.delTimes).Round(time.Millisecond))

	table := "lvmmeta bench (TCG guest):\n  " + strings.Join(rows, "\n  ") + "\n"
	fmt.Print(table)
	if dir := os.Getenv("LVM_AGENT_RESULTS"); dir != "" {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "bench-lvmmeta.txt"), []byte(table), 0o644))
	}
}

// coldSteps times, each on its own, the steps of a cold read of devs: the
// device list, opening each device with O_DIRECT and reading its label
// and metadata area header, reading the committed text (O_DIRECT), its
// CRC, and parsing it.
func coldSteps(t *testing.T, n int, devs []string) string {
	type text struct {
		dev  string
		off  int64
		size uint64
	}
	var texts []text
	head := func() error {
		texts = texts[:0]
		for _, p := range devs {
			d, err := lvmmeta.OpenDevice(p)
			if err != nil {
				return err
			}
			defer d.Close()
			b := make([]byte, 4*512)
			if _, err := d.ReadAt(b, 0); err != nil {
				return err
			}
			l, err := lvmmeta.ParseLabel(b)
			if err != nil {
				return err
			}
			for _, a := range l.MetadataAreas {
				h := make([]byte, 512)
				if _, err := d.ReadAt(h, int64(a.Offset)); err != nil {
					return err
				}
				mh, err := lvmmeta.ParseMDAHeader(h, a)
				if err != nil {
					return err
				}
				if c := mh.Committed; c.Size > 0 && c.Offset+c.Size <= mh.Size {
					texts = append(texts, text{p, int64(a.Offset + c.Offset), c.Size})
				}
			}
		}
		return nil
	}
	list := timeIt(t, n, func() error { _, err := lvmmeta.Devices(devs); return err })
	heads := timeIt(t, n, head)
	require.NotEmpty(t, texts, "a text that does not wrap")
	var bufs [][]byte
	read := timeIt(t, n, func() error {
		bufs = bufs[:0]
		for _, x := range texts {
			d, err := lvmmeta.OpenDevice(x.dev)
			if err != nil {
				return err
			}
			b := make([]byte, x.size)
			_, err = d.ReadAt(b, x.off)
			_ = d.Close()
			if err != nil {
				return err
			}
			bufs = append(bufs, b)
		}
		return nil
	})
	crc := timeIt(t, n, func() error {
		for _, b := range bufs {
			_ = lvmmeta.Checksum(b)
		}
		return nil
	})
	parse := timeIt(t, n, func() error {
		for _, b := range bufs {
			if _, err := lvmmeta.ParseVG(b, lvmmeta.DefaultLimits); err != nil {
				return err
			}
		}
		return nil
	})
	var size uint64
	for _, x := range texts {
		size += x.size
	}
	r := func(d time.Duration) time.Duration { return d.Round(time.Microsecond) }
	return fmt.Sprintf("device list %v, open + label + header of %d devices %v, text read (%d bytes) %v, CRC %v, parse %v",
		r(list), len(devs), r(heads), size, r(read), r(crc), r(parse))
}
