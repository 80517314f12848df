//go:build guest

package devmapper

// Tests against a real kernel, for the test VM (root, dm-mod and
// dm-thin-pool available, dmsetup and losetup installed):
//
//	go test -tags guest -run Guest -v ./lvmbackend/devmapper/
//
// They build their own devices (a zero device with a uuid, a linear device
// on it, a two-target device, a suspended device, a device with only an
// inactive table, and a thin-pool on loop files with one thin volume) and
// compare what this package reads with what dmsetup prints. A missing
// control node fails the run instead of skipping it: inside the VM that is
// a broken setup, and a skip would read as a pass.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGuest(t *testing.T) {
	if _, err := os.Stat(DefaultControlPath); err != nil {
		t.Fatalf("guest tests need device-mapper: %v (is dm-mod loaded? modprobe dm-mod dm-thin-pool)", err)
	}
	for _, tool := range []string{"dmsetup", "losetup"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("guest tests need %s: %v", tool, err)
		}
	}
	ctl, err := Open("")
	require.NoError(t, err, "Open(%q)", DefaultControlPath)
	t.Cleanup(func() { assert.NoError(t, ctl.Close()) })

	fx := newFixtures(t, ctl)
	ctx := context.Background()

	t.Run("Version", func(t *testing.T) {
		v, err := ctl.Version(ctx)
		require.NoError(t, err)
		assert.Equal(t, uint32(4), v.Major)
		out := dmsetup(t, "", "version")
		assert.Contains(t, out, "Driver version:")
		for _, line := range strings.Split(out, "\n") {
			if rest, ok := strings.CutPrefix(line, "Driver version:"); ok {
				assert.Equal(t, strings.TrimSpace(rest), v.String())
			}
		}
	})

	t.Run("ListAndInfoMatchDmsetupInfo", func(t *testing.T) {
		eventually(t, func() error {
			want := dmsetupInfo(t)
			devs, err := ctl.List(ctx)
			if err != nil {
				return err
			}
			if len(devs) != len(want) {
				return fmt.Errorf("List: %d devices, dmsetup info: %d", len(devs), len(want))
			}
			for _, d := range devs {
				row, ok := want[d.Name]
				if !ok {
					return fmt.Errorf("List has %q, dmsetup does not", d.Name)
				}
				if d.Major != row.major || d.Minor != row.minor {
					return fmt.Errorf("%s: List %d:%d, dmsetup %d:%d", d.Name, d.Major, d.Minor, row.major, row.minor)
				}
				if d.UUIDKnown && d.UUID != row.uuid {
					return fmt.Errorf("%s: List uuid %q, dmsetup %q", d.Name, d.UUID, row.uuid)
				}
				info, err := ctl.Info(ctx, d.Name)
				if err != nil {
					return err
				}
				got := infoRow{
					major: info.Major, minor: info.Minor, attr: info.Attr(), open: info.OpenCount,
					segments: info.TargetCount, events: info.EventNr, uuid: info.UUID,
				}
				if got != row {
					return fmt.Errorf("%s: Info %+v, dmsetup %+v", d.Name, got, row)
				}
				if d.EventNrKnown && d.EventNr != row.events {
					return fmt.Errorf("%s: List event_nr %d, dmsetup %d", d.Name, d.EventNr, row.events)
				}
			}
			return nil
		})
	})

	t.Run("FixtureFlags", func(t *testing.T) {
		v, err := ctl.Version(ctx)
		require.NoError(t, err)
		devs, err := ctl.List(ctx)
		require.NoError(t, err)
		byName := map[string]Device{}
		for _, d := range devs {
			byName[d.Name] = d
		}
		if v.AtLeast(4, 45) {
			assert.True(t, byName[fx.zero].UUIDKnown, "5.15+ lists uuids")
			assert.Equal(t, fx.zeroUUID, byName[fx.zero].UUID)
			assert.True(t, byName[fx.linear].UUIDKnown)
			assert.Empty(t, byName[fx.linear].UUID)
		}

		susp, err := ctl.Info(ctx, fx.suspended)
		require.NoError(t, err)
		assert.True(t, susp.Suspended)
		assert.True(t, susp.LiveTable)

		inactive, err := ctl.Info(ctx, fx.inactive)
		require.NoError(t, err)
		assert.False(t, inactive.LiveTable)
		assert.True(t, inactive.InactiveTable)
		st, err := ctl.Status(ctx, fx.inactive)
		require.NoError(t, err)
		assert.Empty(t, st.Targets, "no live table, no targets")
	})

	t.Run("StatusMatchesDmsetupStatus", func(t *testing.T) {
		for _, name := range fx.all() {
			eventually(t, func() error {
				return compareTargets(t, ctl.Status, name, "status", "--noflush")
			})
		}
	})

	t.Run("TableMatchesDmsetupTable", func(t *testing.T) {
		for _, name := range fx.all() {
			eventually(t, func() error {
				return compareTargets(t, ctl.Table, name, "table")
			})
		}
	})

	t.Run("ThinPoolAndThinCounters", func(t *testing.T) {
		pool, err := ctl.Status(ctx, fx.pool)
		require.NoError(t, err)
		require.Len(t, pool.Targets, 1)
		ps, err := ParseTargetStatus(pool.Targets[0].Type, pool.Targets[0].Params)
		require.NoError(t, err)
		p := ps.(ThinPoolStatus)
		assert.Equal(t, StateOK, p.State)
		assert.Equal(t, PoolModeReadWrite, p.Mode)
		assert.Equal(t, uint64(fx.poolBlocks), p.TotalDataBlocks)
		assert.Equal(t, uint64(fx.writtenBlocks), p.UsedDataBlocks)
		assert.InDelta(t, float64(fx.writtenBlocks)/float64(fx.poolBlocks), p.DataUsedFraction(), 1e-9)
		assert.Positive(t, p.UsedMetadataBlocks)
		assert.Positive(t, p.MetadataLowWatermark, "reported since 4.19")

		table, err := ctl.Table(ctx, fx.pool)
		require.NoError(t, err)
		pt, err := ParseThinPoolTable(table.Targets[0].Params)
		require.NoError(t, err)
		assert.Equal(t, uint64(fx.blockSectors), pt.DataBlockSectors)

		thin, err := ctl.Status(ctx, fx.thin)
		require.NoError(t, err)
		require.Len(t, thin.Targets, 1)
		ts, err := ParseThinStatus(thin.Targets[0].Params)
		require.NoError(t, err)
		assert.Equal(t, uint64(fx.writtenBlocks*fx.blockSectors), ts.MappedSectors)
		assert.True(t, ts.AnyMapped)
		assert.Equal(t, uint64(fx.writtenBlocks*fx.blockSectors-1), ts.HighestMappedSector)

		mixed, err := ctl.Status(ctx, fx.mixed)
		require.NoError(t, err)
		require.Len(t, mixed.Targets, 2)
		assert.Equal(t, "linear", mixed.Targets[0].Type)
		assert.Equal(t, "zero", mixed.Targets[1].Type)
	})

	t.Run("StatusAllCoversList", func(t *testing.T) {
		all, err := ctl.StatusAll(ctx)
		require.NoError(t, err)
		devs, err := ctl.List(ctx)
		require.NoError(t, err)
		require.Len(t, all, len(devs))
		for i, d := range devs {
			assert.Equal(t, d.Name, all[i].Info.Name)
			assert.Equal(t, int(all[i].Info.TargetCount), len(all[i].Targets), d.Name)
		}
	})

	t.Run("ConcurrentQueries", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 20 {
					if _, err := ctl.StatusAll(ctx); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})

	t.Run("NotFound", func(t *testing.T) {
		_, err := ctl.Info(ctx, fx.prefix+"-does-not-exist")
		require.ErrorIs(t, err, ErrNotFound)
		_, err = ctl.Status(ctx, fx.prefix+"-does-not-exist")
		require.ErrorIs(t, err, ErrNotFound)
	})
}

// fixtures are the devices the guest test creates and removes.
type fixtures struct {
	prefix                                             string
	zero, zeroUUID, linear, mixed, suspended, inactive string
	pool, thin                                         string
	blockSectors, poolBlocks, writtenBlocks            int
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

func loopDevice(t *testing.T, path string, size int64) string {
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
func dmsetup(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("dmsetup", args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "dmsetup %s: %s", strings.Join(args, " "), stderr.String())
	return string(out)
}

func dmsetupCleanup(t *testing.T, args ...string) {
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
	var got []string
	for _, tg := range st.Targets {
		got = append(got, strings.TrimRight(fmt.Sprintf("%d %d %s %s", tg.Start, tg.Length, tg.Type, tg.Params), " "))
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		return errors.New(name + ": dmsetup " + dmArgs[0] + ":\n" + strings.Join(want, "\n") + "\nours:\n" + strings.Join(got, "\n"))
	}
	return nil
}
