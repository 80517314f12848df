//go:build guest

package devmapper

// Fixtures and dmsetup/lvm plumbing for the guest tests and benchmark.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openGuest opens the control node after checking for the tools the caller
// forks. Either missing fails the run: inside the VM that is a broken setup,
// and a skip would read as a pass.
func openGuest(tb testing.TB, tools ...string) *Control {
	tb.Helper()
	if _, err := os.Stat(DefaultControlPath); err != nil {
		tb.Fatalf("guest tests need device-mapper: %v (is dm-mod loaded? modprobe dm-mod dm-thin-pool)", err)
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			tb.Fatalf("guest tests need %s: %v", tool, err)
		}
	}
	ctl, err := Open("")
	require.NoError(tb, err, "Open(%q)", DefaultControlPath)
	tb.Cleanup(func() { assert.NoError(tb, ctl.Close()) })
	return ctl
}

// fixtures are the devices the guest test creates and removes.
type fixtures struct {
	prefix   string
	zero     string // zero target, with a uuid
	zeroUUID string
	linear   string // linear on zero
	mixed    string // linear + zero: two targets
	// suspended has a live table and is suspended; inactive has only a
	// loaded (inactive) table.
	suspended, inactive string
	pool, thin          string // thin-pool on loop devices, one thin volume in it

	blockSectors  int // pool data block size in sectors
	poolBlocks    int // pool data size in blocks
	writtenBlocks int // blocks written to the thin volume
}

func (f *fixtures) all() []string {
	return []string{f.zero, f.linear, f.mixed, f.suspended, f.inactive, f.pool, f.thin}
}

func newFixtures(t *testing.T, ctl *Control) *fixtures {
	p := fmt.Sprintf("lvmagent-dmtest-%d", os.Getpid())
	f := &fixtures{
		prefix: p, zero: p + "-zero", zeroUUID: "LVMAGENT-TEST-" + strconv.Itoa(os.Getpid()),
		linear: p + "-linear", mixed: p + "-mixed", suspended: p + "-suspended", inactive: p + "-inactive",
		pool: p + "-pool", thin: p + "-thin",
		blockSectors: 128, poolBlocks: 2048, writtenBlocks: 16, // 64 KiB blocks, 128 MiB pool, 1 MiB written
	}
	ctx := context.Background()
	create := func(name, table string, extra ...string) {
		args := append([]string{"create", name}, extra...)
		dmsetup(t, table, args...)
		t.Cleanup(func() { dmsetupCleanup(t, "remove", "--retry", name) })
	}
	devNum := func(name string) string {
		info, err := ctl.Info(ctx, name)
		require.NoError(t, err, name)
		return fmt.Sprintf("%d:%d", info.Major, info.Minor)
	}

	create(f.zero, "0 262144 zero\n", "--uuid", f.zeroUUID)
	create(f.linear, fmt.Sprintf("0 131072 linear %s 2048\n", devNum(f.zero)))
	create(f.mixed, fmt.Sprintf("0 65536 linear %s 0\n65536 65536 zero\n", devNum(f.zero)))
	create(f.suspended, "0 8 zero\n")
	dmsetup(t, "", "suspend", f.suspended)
	t.Cleanup(func() { dmsetupCleanup(t, "resume", f.suspended) })
	dmsetup(t, "", "create", f.inactive, "--notable")
	t.Cleanup(func() { dmsetupCleanup(t, "remove", "--retry", f.inactive) })
	dmsetup(t, "0 8 zero\n", "load", f.inactive)

	dir := t.TempDir()
	meta := loopDevice(t, filepath.Join(dir, "meta"), 16<<20)
	data := loopDevice(t, filepath.Join(dir, "data"), int64(f.poolBlocks*f.blockSectors*512))
	create(f.pool, fmt.Sprintf("0 %d thin-pool %s %s %d 0\n", f.poolBlocks*f.blockSectors, meta, data, f.blockSectors))
	dmsetup(t, "", "message", f.pool, "0", "create_thin 0")
	create(f.thin, fmt.Sprintf("0 131072 thin %s 0\n", devNum(f.pool)))

	// Map writtenBlocks blocks of the thin volume.
	node := "/dev/mapper/" + f.thin
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(node); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear", node)
		}
		time.Sleep(100 * time.Millisecond)
	}
	w, err := os.OpenFile(node, os.O_WRONLY, 0)
	require.NoError(t, err)
	buf := make([]byte, f.writtenBlocks*f.blockSectors*512)
	for i := range buf {
		buf[i] = 0xab
	}
	_, err = w.Write(buf)
	require.NoError(t, err)
	require.NoError(t, w.Sync())
	require.NoError(t, w.Close())

	settle()
	return f
}

func loopDevice(t testing.TB, path string, size int64) string {
	fh, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, fh.Truncate(size))
	require.NoError(t, fh.Close())
	out, err := exec.Command("losetup", "--find", "--show", path).Output()
	require.NoError(t, err, "losetup %s", path)
	dev := strings.TrimSpace(string(out))
	// Registered before the pool's cleanup, so it runs after the pool is
	// gone (cleanups run last-in first-out).
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	return dev
}

// dmsetup runs dmsetup with stdin and returns its stdout, failing the test
// on error.
func dmsetup(t testing.TB, stdin string, args ...string) string {
	t.Helper()
	return tool(t, "dmsetup", stdin, args...)
}

// tool runs a command with stdin and returns its stdout, failing the test
// on error with its stderr.
func tool(tb testing.TB, name, stdin string, args ...string) string {
	tb.Helper()
	cmd := exec.Command(name, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(tb, err, "%s %s: %s", name, strings.Join(args, " "), stderr.String())
	return string(out)
}

func dmsetupCleanup(t testing.TB, args ...string) {
	if out, err := exec.Command("dmsetup", args...).CombinedOutput(); err != nil {
		t.Logf("cleanup: dmsetup %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// settle waits for udev to finish probing new devices, whose transient
// opens would otherwise show up in open counts.
func settle() {
	if _, err := exec.LookPath("udevadm"); err == nil {
		_ = exec.Command("udevadm", "settle", "--timeout=10").Run()
	}
}

// eventually retries a comparison a few times: udev and the thin-pool's
// periodic commit can change open counts and metadata counters between
// our ioctl and dmsetup's.
func eventually(t *testing.T, compare func() error) {
	t.Helper()
	var err error
	for range 5 {
		if err = compare(); err == nil {
			return
		}
		settle()
		time.Sleep(200 * time.Millisecond)
	}
	t.Error(err)
}

type infoRow struct {
	major, minor uint32
	attr         string
	open         int32
	segments     uint32
	events       uint32
	uuid         string
}

// dmsetupInfo parses `dmsetup info -c --noheadings` for every device.
func dmsetupInfo(t *testing.T) map[string]infoRow {
	out := dmsetup(t, "", "info", "-c", "--noheadings", "--separator", "\t",
		"-o", "name,major,minor,attr,open,segments,events,uuid")
	rows := map[string]infoRow{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "No devices found") {
			continue
		}
		f := strings.Split(line, "\t")
		require.Len(t, f, 8, "dmsetup info line %q", line)
		for i := range f {
			f[i] = strings.TrimSpace(f[i]) // dmsetup may pad columns
		}
		num := func(s string) uint64 {
			v, err := strconv.ParseUint(s, 10, 32)
			require.NoError(t, err, "in %q", line)
			return v
		}
		rows[f[0]] = infoRow{
			major: uint32(num(f[1])), minor: uint32(num(f[2])), attr: f[3],
			open: int32(num(f[4])), segments: uint32(num(f[5])), events: uint32(num(f[6])),
			uuid: f[7],
		}
	}
	return rows
}

// compareTargets compares one device's targets with `dmsetup <verb> name`,
// which prints "<start> <length> <type> <params>" per target.
func compareTargets(t *testing.T, query func(context.Context, string) (DeviceStatus, error), name string, dmArgs ...string) error {
	st, err := query(context.Background(), name)
	if err != nil {
		return err
	}
	var want []string
	for _, line := range strings.Split(dmsetup(t, "", append(dmArgs, name)...), "\n") {
		if line = strings.TrimRight(line, " "); line != "" {
			want = append(want, line)
		}
	}
	if got := targetLines(st); got != strings.Join(want, "\n") {
		return errors.New(name + ": dmsetup " + dmArgs[0] + ":\n" + strings.Join(want, "\n") + "\nours:\n" + got)
	}
	return nil
}

// targetLines renders targets as dmsetup prints them: "<start> <length>
// <type> <params>" a line, without trailing spaces.
func targetLines(st DeviceStatus) string {
	var lines []string
	for _, tg := range st.Targets {
		lines = append(lines, strings.TrimRight(fmt.Sprintf("%d %d %s %s", tg.Start, tg.Length, tg.Type, tg.Params), " "))
	}
	return strings.Join(lines, "\n")
}

func infoRowOf(i Info) infoRow {
	return infoRow{
		major: i.Major, minor: i.Minor, attr: i.Attr(), open: i.OpenCount,
		segments: i.TargetCount, events: i.EventNr, uuid: i.UUID,
	}
}

// lvm runs `lvm ARGS...` and returns its stdout, failing on error. With no
// args it runs the commands in stdin, one a line, in a single lvm shell,
// which saves a process start and device scan per command; the shell goes
// on after a failed command, so the caller checks the outcome.
func lvm(tb testing.TB, stdin string, args ...string) string {
	tb.Helper()
	return tool(tb, "lvm", stdin, args...)
}

// newVG creates volume group vg on a sparse loop file of size bytes. At
// cleanup it removes the group with all its LVs, then the loop device.
func newVG(tb testing.TB, vg string, size int64) {
	dev := loopDevice(tb, filepath.Join(tb.TempDir(), vg+".img"), size)
	lvm(tb, "", "vgcreate", "-y", vg, dev)
	tb.Cleanup(func() {
		if out, err := exec.Command("lvm", "vgremove", "-ff", vg).CombinedOutput(); err != nil {
			tb.Logf("cleanup: lvm vgremove %s: %v: %s", vg, err, out)
		}
	})
}

// lvsRow is one LV of `lvs --reportformat json`, which prints every field
// as a string ("" when it does not apply).
type lvsRow struct {
	Name      string `json:"lv_name"` // "[name]" for hidden LVs (with -a)
	Segtype   string `json:"segtype"`
	DMPath    string `json:"lv_dm_path"`
	Major     string `json:"lv_kernel_major"` // "-1" when inactive
	Minor     string `json:"lv_kernel_minor"`
	Active    string `json:"lv_active"`      // "active"
	Suspended string `json:"lv_suspended"`   // "suspended"
	Open      string `json:"lv_device_open"` // "open"
	Attr      string `json:"lv_attr"`
	Data      string `json:"data_percent"`
	Metadata  string `json:"metadata_percent"`
	Health    string `json:"lv_health_status"`
	WhenFull  string `json:"lv_when_full"`
	LVUUID    string `json:"lv_uuid"`
	VGUUID    string `json:"vg_uuid"`
}

// lvsFields asks for every field of lvsRow.
const lvsFields = "lv_name,segtype,lv_dm_path,lv_kernel_major,lv_kernel_minor,lv_active,lv_suspended," +
	"lv_device_open,lv_attr,data_percent,metadata_percent,lv_health_status,lv_when_full,lv_uuid,vg_uuid"

func parseLVS(out string) ([]lvsRow, error) {
	var r struct {
		Report []struct {
			LV []lvsRow `json:"lv"`
		} `json:"report"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		return nil, fmt.Errorf("lvs report: %w", err)
	}
	if len(r.Report) != 1 {
		return nil, fmt.Errorf("lvs report: %d reports, want 1", len(r.Report))
	}
	return r.Report[0].LV, nil
}

// poolBlockSectors is the data block size, in sectors, of a thin-pool table
// line: "<metadata dev> <data dev> <data block size> <low water mark> ...".
func poolBlockSectors(tb testing.TB, params string) uint64 {
	tb.Helper()
	f := strings.Fields(params)
	require.GreaterOrEqual(tb, len(f), 4, "thin-pool table %q", params)
	n, err := strconv.ParseUint(f[2], 10, 64)
	require.NoError(tb, err, "thin-pool table %q", params)
	return n
}
