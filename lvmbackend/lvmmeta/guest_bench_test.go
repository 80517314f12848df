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
	cold := func() error {
		// A fresh reader parses the text again each time.
		d := lvmbackend.NewDirect(lvmd, lvmbackend.DirectConfig{DM: dm, Devices: devs,
			Classes: []lvmbackend.DirectClass{{Name: "bench", VolumeGroup: vg}}})
		return count(d.ListVolumes(ctx, "bench"))
	}
	lvsTags := func() error {
		out, err := exec.Command("lvm", "lvs", "--noheadings", "-o", "lv_name,lv_tags", vg).Output()
		if err == nil && bytes.Count(out, []byte("\n")) != benchLVs+1 {
			err = fmt.Errorf("lvs printed %d lines", bytes.Count(out, []byte("\n")))
		}
		return err
	}
	// The scan alone (label, header, text and CRC, parse): what the cold
	// read adds to the cached one.
	scan := func(rd *lvmmeta.Reader) error {
		st, err := rd.Scan(ctx, devs)
		if err == nil && len(st.VGs[vg].LVs) != benchLVs+1 {
			err = fmt.Errorf("%d LVs", len(st.VGs[vg].LVs))
		}
		return err
	}
	warm := lvmmeta.NewReader(lvmmeta.Limits{})
	require.NoError(t, scan(warm))
	steps := newColdSteps(t, devs)
	// All side by side, round after round: the guest's speed follows the
	// host's load, so figures taken minutes apart do not make a ratio.
	const readRounds = 11
	m := interleaved(t, readRounds,
		cold,
		func() error { return count(direct.ListVolumes(ctx, "bench")) },
		lvsTags,
		func() error { return count(lvmd.ListVolumes(ctx, "bench")) },
		func() error { return scan(lvmmeta.NewReader(lvmmeta.Limits{})) },
		func() error { return scan(warm) },
		func() error { _, err := dm.List(ctx); return err },
		steps.devices, steps.heads, steps.readDirect, steps.readBuffered, steps.crc, steps.parse)
	goCold, goWarm, lvs, getLVList, scanCold, scanWarm, dmList := m[0], m[1], m[2], m[3], m[4], m[5], m[6]
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
	us := func(d time.Duration) time.Duration { return d.Round(time.Microsecond) }
	row("medians of %d rounds, each round every read below once, side by side; \"cold\": a new Reader (nothing parsed: an agent's first read, or the first after an lvm commit, which changes the text); \"cached\": the Reader has parsed this seqno's text and re-reads only the 512-byte header", readRounds)
	row("tags of %d LVs: pure Go %v cold, %v cached; lvs %v, lvmd GetLVList %v",
		benchLVs+1, us(goCold), us(goWarm), lvs.Round(time.Millisecond), getLVList.Round(time.Millisecond))
	row("ratio lvs / pure Go: %.0fx cold, %.0fx cached; GetLVList / pure Go: %.0fx cold, %.0fx cached (goal >= 30x)",
		lvs.Seconds()/goCold.Seconds(), lvs.Seconds()/goWarm.Seconds(),
		getLVList.Seconds()/goCold.Seconds(), getLVList.Seconds()/goWarm.Seconds())
	row("of which lvmmeta.Reader.Scan (label, header, text, CRC, parse): %v cold, %v cached; device-mapper's device list %v",
		us(scanCold), us(scanWarm), us(dmList))
	row("the cold scan by step, each alone: device list %v, open (O_DIRECT) + label + header of %d device(s) %v, text (%d bytes) read with O_DIRECT into a new buffer %v (through the page cache %v), CRC %v, parse %v",
		us(m[7]), len(devs), us(m[8]), steps.size, us(m[9]), us(m[10]), us(m[11]), us(m[12]))

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
	type way struct {
		label string
		b     lvmbackend.Backend
		del   func(lvmbackend.Backend, string) func() error
	}
	// run measures the ways side by side: sample i of each, then i+1.
	run := func(ways ...way) []result {
		r := make([]result, len(ways))
		for i := range n {
			for j, w := range ways {
				name := fmt.Sprintf("%s%d", w.label, i)
				c, _ := measure(create(w.b, name))
				d, dt := measure(w.del(w.b, name))
				r[j].creates, r[j].deletes, r[j].delTimes = append(r[j].creates, c), append(r[j].deletes, d), append(r[j].delTimes, dt)
			}
		}
		return r
	}
	var raw, viaTopolvm, viaDirect result
	watch(lvmd, func() { viaTopolvm = run(way{"old", lvmd, agentDelete})[0] })
	// Direct's capacity watch polls the metadata and starts no lvm
	// process, so lvmd's own calls are measured beside it.
	watch(direct, func() {
		r := run(way{"raw", lvmd, remove}, way{"new", direct, agentDelete})
		raw, viaDirect = r[0], r[1]
	})
	row("lvm processes per create / delete: lvmd CreateLV %v / RemoveLV %v; agent via lvmd only (GetLVList, Watch open) %v / %v; agent via Direct %v / %v",
		raw.creates, raw.deletes, viaTopolvm.creates, viaTopolvm.deletes, viaDirect.creates, viaDirect.deletes)
	row("delete (GetVolume + RemoveVolume) / lvmd RemoveLV, medians of %d (RemoveLV and via Direct side by side): via lvmd only %.2f, via Direct %.2f (goal <= 1.10); RemoveLV %v",
		n, median(viaTopolvm.delTimes).Seconds()/median(raw.delTimes).Seconds(),
		median(viaDirect.delTimes).Seconds()/median(raw.delTimes).Seconds(), median(raw.delTimes).Round(time.Millisecond))

	table := "lvmmeta bench (TCG guest):\n  " + strings.Join(rows, "\n  ") + "\n"
	fmt.Print(table)
	if dir := os.Getenv("LVM_AGENT_RESULTS"); dir != "" {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "bench-lvmmeta.txt"), []byte(table), 0o644))
	}
}

// interleaved runs every fn once per round, in order, and returns each
// one's median.
func interleaved(t *testing.T, rounds int, fns ...func() error) []time.Duration {
	ds := make([][]time.Duration, len(fns))
	for range rounds {
		for i, fn := range fns {
			t0 := time.Now()
			require.NoError(t, fn())
			ds[i] = append(ds[i], time.Since(t0))
		}
	}
	out := make([]time.Duration, len(fns))
	for i := range ds {
		out[i] = median(ds[i])
	}
	return out
}

// coldSteps are the steps of a cold read of devs, each on its own: the
// device list, opening each device with O_DIRECT and reading its label
// and metadata area headers, reading the committed texts (O_DIRECT into a
// new aligned buffer, as the Reader does; and, to compare, through the
// page cache), their CRC, and parsing them.
type coldSteps struct {
	devs  []string
	texts []textAt
	bufs  [][]byte
	size  uint64
}

type textAt struct {
	dev  string
	off  int64
	size uint64
}

func newColdSteps(t *testing.T, devs []string) *coldSteps {
	c := &coldSteps{devs: devs}
	require.NoError(t, c.heads())
	require.NotEmpty(t, c.texts, "a committed text that does not wrap")
	require.NoError(t, c.readDirect())
	for _, x := range c.texts {
		c.size += x.size
	}
	return c
}

func (c *coldSteps) devices() error { _, err := lvmmeta.Devices(c.devs); return err }

func (c *coldSteps) heads() error {
	c.texts = c.texts[:0]
	for _, p := range c.devs {
		if err := c.head(p); err != nil {
			return err
		}
	}
	return nil
}

func (c *coldSteps) head(p string) error {
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
		if x := mh.Committed; x.Size > 0 && x.Offset+x.Size <= mh.Size {
			c.texts = append(c.texts, textAt{p, int64(a.Offset + x.Offset), x.Size})
		}
	}
	return nil
}

func (c *coldSteps) readDirect() error {
	c.bufs = c.bufs[:0]
	for _, x := range c.texts {
		d, err := lvmmeta.OpenDevice(x.dev)
		if err != nil {
			return err
		}
		b, err := lvmmeta.ReadText(d, x.off, int(x.size))
		_ = d.Close()
		if err != nil {
			return err
		}
		c.bufs = append(c.bufs, b)
	}
	return nil
}

func (c *coldSteps) readBuffered() error {
	for _, x := range c.texts {
		f, err := os.Open(x.dev)
		if err != nil {
			return err
		}
		_, err = f.ReadAt(make([]byte, x.size), x.off)
		_ = f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func (c *coldSteps) crc() error {
	for _, b := range c.bufs {
		_ = lvmmeta.Checksum(b)
	}
	return nil
}

func (c *coldSteps) parse() error {
	for _, b := range c.bufs {
		if _, err := lvmmeta.ParseVG(b, lvmmeta.DefaultLimits); err != nil {
			return err
		}
	}
	return nil
}
