//go:build guest

package devmapper

// TestGuestLVM reads devices that lvm2 made, as the agent meets them on a
// node: a linear LV, a thin pool and a thin LV in a volume group on a loop
// file. What the package reads must agree with `lvs` and dmsetup while the
// pool is empty, once it is ~90% full, and once it is full and set to error
// when full (out-of-data-space mode). Each lvm command costs ~0.4 s under
// TCG, so there are few of them.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmmeta"
)

func TestGuestLVM(t *testing.T) {
	ctl := openGuest(t, "lvm", "dmsetup", "losetup")
	ctx := context.Background()
	vg := fmt.Sprintf("dmtest%d", os.Getpid())
	newVG(t, vg, 128<<20)
	lvm(t, "", "lvcreate", "-y", "-L", "8m", "-n", "lin", vg)
	lvm(t, "", "lvcreate", "-y", "--type", "thin-pool", "-L", "16m", "-n", "pool", vg)
	lvm(t, "", "lvcreate", "-y", "-V", "32m", "-n", "thin", "--thinpool", "pool", vg)
	pool, thin := vg+"-pool-tpool", vg+"-thin"

	// compare runs compareLVM until it agrees and returns lvs's rows.
	compare := func() map[string]lvsRow {
		t.Helper()
		var rows map[string]lvsRow
		eventually(t, func() (err error) {
			rows, err = compareLVM(t, ctl, vg)
			return err
		})
		if t.Failed() {
			t.FailNow()
		}
		return rows
	}
	params := func(name string) string { // of the device's one target
		st, err := ctl.Status(ctx, name)
		require.NoError(t, err)
		require.Len(t, st.Targets, 1)
		return st.Targets[0].Params
	}
	poolStatus := func() ThinPoolStatus {
		p, err := ParseThinPoolStatus(params(pool))
		require.NoError(t, err)
		return p
	}
	mapped := func() uint64 {
		s, err := ParseThinStatus(params(thin))
		require.NoError(t, err)
		return s.MappedSectors
	}

	// Empty.
	rows := compare()
	p := poolStatus()
	assert.Equal(t, PoolModeReadWrite, p.Mode)
	assert.Equal(t, NoSpaceQueue, p.NoSpace)
	assert.Zero(t, p.UsedDataBlocks)
	table, err := ctl.Table(ctx, pool)
	require.NoError(t, err)
	blockSectors := poolBlockSectors(t, table.Targets[0].Params)
	block := blockSectors * sectorSize
	require.Equal(t, uint64(16<<20), p.TotalDataBlocks*block, "pool size")
	node := rows["thin"].DMPath

	// ~90% full.
	written := p.TotalDataBlocks * 9 / 10
	require.NoError(t, writeBlocks(node, 0, written, block))
	rows = compare()
	p = poolStatus()
	assert.Equal(t, written, p.UsedDataBlocks)
	assert.Equal(t, written*blockSectors, mapped())
	assert.Equal(t, PoolModeReadWrite, p.Mode)
	t.Logf("pool %d/%d blocks: lvs data_percent %s, metadata_percent %s", p.UsedDataBlocks, p.TotalDataBlocks, rows["pool"].Data, rows["pool"].Metadata)

	// Full, failing writes instead of queueing them.
	lvm(t, "", "lvchange", "--errorwhenfull", "y", vg+"/pool")
	assert.Equal(t, NoSpaceError, poolStatus().NoSpace)
	err = writeBlocks(node, written, p.TotalDataBlocks-p.UsedDataBlocks+8, block)
	require.Error(t, err, "writing past the end of the pool")
	t.Logf("writing past the end of the pool: %v", err)
	rows = compare()
	p = poolStatus()
	assert.Equal(t, PoolModeOutOfDataSpace, p.Mode)
	assert.Equal(t, p.TotalDataBlocks, p.UsedDataBlocks)
	assert.Equal(t, p.TotalDataBlocks*blockSectors, mapped())
	r := rows["pool"]
	assert.Equal(t, "100.00", r.Data)
	assert.Equal(t, "out_of_data", r.Health)
	assert.Equal(t, "error", r.WhenFull)
	assert.Equal(t, byte('D'), r.Attr[8], "lv_attr %q", r.Attr)
}

// TestGuestThinPoolZeroing: ThinPoolZeroing agrees with `lvcreate -Z` and
// with the 'z' of lv_attr, for pools without thin volumes (which LVM
// activates without the -tpool layer) and again once each has one (the
// thin-pool target then on the layer). Dashes in the names check that the
// dm name LVM uses is lvmmeta.DMName's.
func TestGuestThinPoolZeroing(t *testing.T) {
	ctl := openGuest(t, "lvm", "dmsetup", "losetup")
	ctx := context.Background()
	vg := fmt.Sprintf("dmzero-%d", os.Getpid())
	newVG(t, vg, 64<<20)
	pools := map[string]bool{"z-pool": true, "raw-pool": false} // LV name: -Z y
	lvm(t, fmt.Sprintf("lvcreate -y --type thin-pool -Z y -L 8m -n z-pool %[1]s\n"+
		"lvcreate -y --type thin-pool -Z n -L 8m -n raw-pool %[1]s\n"+
		"lvcreate -y -L 4m -n lin %[1]s\n", vg))

	check := func(stage, layer string) {
		t.Helper()
		list, err := parseLVS(lvm(t, "", "lvs", "-a", "--reportformat", "json", "-o", lvsFields, vg))
		require.NoError(t, err)
		rows := map[string]lvsRow{}
		for _, r := range list {
			rows[strings.Trim(r.Name, "[]")] = r
		}
		for pool, want := range pools {
			r, ok := rows[pool]
			require.True(t, ok, "%s: lvs has no %s", stage, pool)
			require.Equal(t, "active", r.Active, "%s: %s", stage, pool)
			name := lvmmeta.DMName(vg, pool)
			require.Equal(t, name, filepath.Base(r.DMPath), "%s: the dm name of %s", stage, pool)
			assert.Equal(t, want, r.Attr[7] == 'z', "%s: %s: lv_attr %q", stage, pool, r.Attr)
			got, err := ctl.ThinPoolZeroing(ctx, name)
			require.NoError(t, err, "%s: %s", stage, pool)
			assert.Equal(t, want, got, "%s: %s", stage, pool)

			// The thin-pool target is where the doc says it is.
			tb, err := ctl.Table(ctx, name+layer)
			require.NoError(t, err, "%s: %s%s", stage, name, layer)
			require.Len(t, tb.Targets, 1)
			assert.Equal(t, "thin-pool", tb.Targets[0].Type, "%s: %s%s", stage, name, layer)
			if layer == "" {
				_, err := ctl.Info(ctx, name+"-tpool")
				assert.ErrorIs(t, err, ErrNotFound, "%s: %s-tpool", stage, name)
			}
		}
	}
	check("new pools", "")

	lvm(t, fmt.Sprintf("lvcreate -y -V 16m -n z-thin --thinpool z-pool %[1]s\n"+
		"lvcreate -y -V 16m -n raw-thin --thinpool raw-pool %[1]s\n", vg))
	check("pools with a thin volume", "-tpool")

	_, err := ctl.ThinPoolZeroing(ctx, lvmmeta.DMName(vg, "lin"))
	assert.ErrorIs(t, err, ErrNotThinPool, "a linear LV")
	assert.ErrorIs(t, err, ErrNotFound, "a linear LV")

	lvm(t, "", "lvchange", "-an", vg+"/z-thin")
	lvm(t, "", "lvchange", "-an", vg+"/z-pool")
	_, err = ctl.ThinPoolZeroing(ctx, lvmmeta.DMName(vg, "z-pool"))
	assert.ErrorIs(t, err, ErrNotThinPool, "an inactive pool")
	got, err := ctl.ThinPoolZeroing(ctx, lvmmeta.DMName(vg, "raw-pool"))
	require.NoError(t, err)
	assert.False(t, got, "the other pool still")
}

// compareLVM compares every LV of vg that `lvs -a` reports with the
// device-mapper device the package reads for it, then those devices with
// `dmsetup info`, `dmsetup status --noflush` and `dmsetup table`. It returns
// lvs's rows by LV name.
func compareLVM(t *testing.T, ctl *Control, vg string) (map[string]lvsRow, error) {
	ctx := context.Background()
	list, err := parseLVS(lvm(t, "", "lvs", "-a", "--reportformat", "json", "-o", lvsFields, vg))
	if err != nil {
		return nil, err
	}
	devs, err := ctl.List(ctx)
	if err != nil {
		return nil, err
	}
	ours := map[string]bool{} // the VG's devices in our list
	for _, d := range devs {
		if strings.HasPrefix(d.Name, vg+"-") {
			ours[d.Name] = true
		}
	}
	rows := map[string]lvsRow{}
	want := map[string]bool{} // the devices lvs implies
	for _, r := range list {
		name := strings.Trim(r.Name, "[]")
		rows[name] = r
		dm := filepath.Base(r.DMPath)
		if r.Active != "active" {
			if ours[dm] {
				return nil, fmt.Errorf("%s: inactive for lvs, but %s is listed", name, dm)
			}
			continue
		}
		want[dm] = true
		// For a thin pool, lvs reports the -tpool layer (the thin-pool
		// target): its numbers, state and counters. The device at
		// lv_dm_path is a read-only linear device on top of it.
		if r.Segtype == "thin-pool" {
			dm += "-tpool"
			want[dm] = true
		}
		st, err := ctl.Status(ctx, dm)
		if err != nil {
			return nil, err
		}
		if err := compareLV(name, r, st); err != nil {
			return nil, err
		}
	}
	if !maps.Equal(ours, want) {
		return nil, fmt.Errorf("devices of %s: ours %v, lvs implies %v", vg, slices.Sorted(maps.Keys(ours)), slices.Sorted(maps.Keys(want)))
	}

	info := dmsetupInfo(t)
	status := dmsetupTargets(t, "status", "--noflush")
	tables := dmsetupTargets(t, "table")
	for name := range want {
		st, err := ctl.Status(ctx, name)
		if err != nil {
			return nil, err
		}
		if got := infoRowOf(st.Info); got != info[name] {
			return nil, fmt.Errorf("%s: ours %+v, dmsetup info %+v", name, got, info[name])
		}
		if got := targetLines(st); got != status[name] {
			return nil, fmt.Errorf("%s: ours %q, dmsetup status %q", name, got, status[name])
		}
		tb, err := ctl.Table(ctx, name)
		if err != nil {
			return nil, err
		}
		if got := targetLines(tb); got != tables[name] {
			return nil, fmt.Errorf("%s: ours %q, dmsetup table %q", name, got, tables[name])
		}
	}
	return rows, nil
}

// compareLV compares one active LV's lvs row with its device's status.
func compareLV(name string, r lvsRow, st DeviceStatus) error {
	if len(r.Attr) != 10 {
		return fmt.Errorf("%s: lv_attr %q", name, r.Attr)
	}
	i := st.Info
	var errs []error
	check := func(what string, ours, lvs any) {
		if ours != lvs {
			errs = append(errs, fmt.Errorf("%s: %s: ours %v, lvs %v", name, what, ours, lvs))
		}
	}
	check("kernel device", fmt.Sprintf("%d:%d", i.Major, i.Minor), r.Major+":"+r.Minor)
	check("live table", i.LiveTable, true)
	check("suspended", i.Suspended, r.Suspended == "suspended")
	check("open", i.OpenCount > 0, r.Open == "open")
	state := byte('a')
	if i.Suspended {
		state = 's'
	}
	check("lv_attr state", string(state), r.Attr[4:5])
	check("lv_attr open", i.OpenCount > 0, r.Attr[5] == 'o')
	uuid := "LVM-" + strings.ReplaceAll(r.VGUUID, "-", "") + strings.ReplaceAll(r.LVUUID, "-", "")
	check("uuid prefix", strings.HasPrefix(i.UUID, uuid), true)

	if len(st.Targets) != 1 {
		return errors.Join(append(errs, fmt.Errorf("%s: %d targets", name, len(st.Targets)))...)
	}
	tg := st.Targets[0]
	check("target", tg.Type, r.Segtype)
	switch r.Segtype {
	case "thin-pool":
		p, err := ParseThinPoolStatus(tg.Params)
		if err != nil {
			return err
		}
		errs = append(errs,
			lvsPercent(name+" data", r.Data, p.UsedDataBlocks, p.TotalDataBlocks),
			lvsPercent(name+" metadata", r.Metadata, p.UsedMetadataBlocks, p.TotalMetadataBlocks))
		whenFull := map[NoSpacePolicy]string{NoSpaceQueue: "queue", NoSpaceError: "error"}
		check("when full", whenFull[p.NoSpace], r.WhenFull)
		// lv_attr's 9th character and lv_health_status, for the modes
		// this test brings about.
		switch p.Mode {
		case PoolModeReadWrite:
			check("health", "-", r.Attr[8:9]+r.Health)
		case PoolModeOutOfDataSpace:
			check("health", "Dout_of_data", r.Attr[8:9]+r.Health)
		default:
			errs = append(errs, fmt.Errorf("%s: pool mode %q", name, p.Mode))
		}
	case "thin":
		s, err := ParseThinStatus(tg.Params)
		if err != nil {
			return err
		}
		errs = append(errs, lvsPercent(name+" data", r.Data, s.MappedSectors, tg.Length))
	}
	return errors.Join(errs...)
}

// lvsPercent compares an lvs percentage with used/total. lvs prints two
// decimals, rounding through a float32, and shows a fraction that is not
// quite 0 or 100% as 0.01 or 99.99.
func lvsPercent(what, lvs string, used, total uint64) error {
	got, err := strconv.ParseFloat(lvs, 64)
	if err != nil {
		return fmt.Errorf("%s: lvs %q: %v", what, lvs, err)
	}
	want := 100 * fraction(used, total)
	switch {
	case used > 0 && want < 0.01:
		want = 0.01
	case used < total && want > 99.99:
		want = 99.99
	}
	if math.Abs(got-want) > 0.005+1e-4 {
		return fmt.Errorf("%s: lvs %s%%, ours %d/%d = %.4f%%", what, lvs, used, total, 100*fraction(used, total))
	}
	return nil
}

// dmsetupTargets runs `dmsetup VERB ARGS...` for all devices, which prints
// "name: <start> <length> <type> <params>" per target, and returns each
// device's lines without the names.
func dmsetupTargets(t *testing.T, verb string, args ...string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(dmsetup(t, "", append([]string{verb}, args...)...), "\n") {
		name, rest, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		if out[name] != "" {
			out[name] += "\n"
		}
		out[name] += strings.TrimRight(rest, " ")
	}
	return out
}

// writeBlocks writes n blocks of size bytes to the block device at path
// from block first on, and syncs: a thin pool allocates as the writes reach
// it. It returns the first error, which a full pool that errors instead of
// queueing reports at the latest on the sync.
func writeBlocks(path string, first, n, size uint64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	buf := make([]byte, size)
	for i := range n {
		if _, err := f.WriteAt(buf, int64((first+i)*size)); err != nil {
			_ = f.Close()
			return err
		}
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
