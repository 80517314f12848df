//go:build guest

package lvmmeta_test

// Tests against real LVM, for the test VM (root, lvm2, losetup, dm-mod and
// dm-thin-pool, dm-snapshot):
//
//	go test -c -tags guest ./lvmbackend/lvmmeta && ./lvmmeta.test -test.v
//
// Each builds its own VG on loop devices and compares what the reader
// makes of the disks with `lvs -a --reportformat json` and `vgs`.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lvm-agent/lvm-agent/lvmbackend"
	"github.com/lvm-agent/lvm-agent/lvmbackend/devmapper"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmmeta"
)

func openDM(t *testing.T) *devmapper.Control {
	dm, err := devmapper.Open("")
	require.NoError(t, err, "guest tests need device-mapper")
	t.Cleanup(func() { _ = dm.Close() })
	return dm
}

// readVG scans devs and returns the VG.
func readVG(t *testing.T, rd *lvmmeta.Reader, devs []string, name string) (*lvmmeta.State, *lvmmeta.VG) {
	t.Helper()
	st, err := rd.Scan(context.Background(), devs)
	require.NoError(t, err)
	vg, err := st.VG(name)
	require.NoError(t, err)
	return st, vg
}

// compare checks the reader's VG against lvm's report, LV by LV.
func compare(t *testing.T, dm *devmapper.Control, vg *lvmmeta.VG, want lvsReport) {
	t.Helper()
	assert.Equal(t, want.Seqno, vg.Seqno, "seqno")
	assert.Equal(t, want.Extents, vg.TotalExtents(), "extents")
	assert.Equal(t, want.FreeExtents, vg.FreeExtents(), "free extents")
	var names []string
	for i := range vg.LVs {
		names = append(names, vg.LVs[i].Name)
	}
	// The hidden snapshotN LV that ties an old snapshot to its origin is
	// not an LV to lvs.
	names = slices.DeleteFunc(names, func(n string) bool { return vg.LV(n).Type() == "snapshot" })
	wantNames := make([]string, 0, len(want.LVs))
	for n := range want.LVs {
		wantNames = append(wantNames, n)
	}
	assert.ElementsMatch(t, wantNames, names, "LVs")
	for _, name := range names {
		row, ok := want.LVs[name]
		if !ok {
			continue
		}
		lv := vg.LV(name)
		assert.Equal(t, row.UUID, lv.UUID, name)
		assert.ElementsMatch(t, splitTags(row.Tags), lv.Tags, name)
		assert.Equal(t, row.Origin, lv.Origin, name)
		if lv.Type() == "thin" {
			assert.Equal(t, row.Pool, lv.Pool, name)
		}
		size := row.Size
		if lv.Origin != "" && lv.Pool == "" {
			size = row.OriginSize // an old snapshot: lvmd reports the origin's size
		}
		assert.Equal(t, size, strconv.FormatUint(vg.SizeBytes(lv), 10), name)
		if !lv.Visible() {
			continue
		}
		dmName, dmUUID := vg.DMDevice(lv)
		info, err := dm.Info(context.Background(), dmName)
		active := err == nil && info.LiveTable && info.UUID == dmUUID
		if active {
			assert.Equal(t, row.Major+":"+row.Minor, strconv.Itoa(int(info.Major))+":"+strconv.Itoa(int(info.Minor)), name)
		} else {
			assert.Equal(t, "-1", row.Major, "%s: lvs says active, device-mapper has no %s", name, dmUUID)
		}
		got := vg.Attr(lv, active, active && info.OpenCount > 0)
		// Health (8) needs the kernel's target status; open (5) of a pool
		// is its -tpool layer's.
		for _, i := range []int{0, 1, 2, 3, 4, 6, 7, 9} {
			assert.Equal(t, string(row.Attr[i]), string(got[i]), "%s: lv_attr %s, read %s, position %d", name, row.Attr, got, i)
		}
	}
}

func TestGuestLayouts(t *testing.T) {
	dm := openDM(t)
	const vgName = "metalay"
	devs := newVG(t, vgName, 2, 256<<20)
	lvm(t, "lvcreate", "-y", "-L", "8m", "-n", "lin", "--addtag", "lvm-agent.io/owned", "--addtag", "odd+tag_./=!:#&", vgName)
	lvm(t, "lvcreate", "-y", "-i", "2", "-I", "64k", "-L", "16m", "-n", "striped", vgName)
	lvm(t, "lvcreate", "-y", "--type", "thin-pool", "-L", "32m", "-n", "pool", vgName)
	lvm(t, "lvcreate", "-y", "-V", "64m", "-n", "thin", "--thinpool", "pool", "--addtag", "t1", vgName)
	lvm(t, "lvcreate", "-y", "-s", "-n", "thinsnap", vgName+"/thin")
	lvm(t, "lvcreate", "-y", "-s", "-L", "8m", "-n", "snap", vgName+"/lin")
	lvm(t, "lvcreate", "-y", "-L", "4m", "-n", "inactive", vgName)
	lvm(t, "lvchange", "-an", vgName+"/inactive")
	// A linear LV across both PVs.
	lvm(t, "lvcreate", "-y", "-L", "8m", "-n", "span", vgName, devs[0])
	lvm(t, "lvextend", "-L", "+8m", vgName+"/span", devs[1])

	rd := lvmmeta.NewReader(lvmmeta.Limits{})
	st, vg := readVG(t, rd, devs, vgName)
	require.Len(t, st.PVs, 2, "a VG on two PVs")
	compare(t, dm, vg, report(t, vgName))
	assert.Len(t, vg.LV("span").Segments, 2)
	assert.Len(t, vg.LV("striped").Segments[0].Areas, 2)

	// The scan of every block device finds the same.
	all, err := lvmmeta.Devices(nil)
	require.NoError(t, err)
	st2, err := rd.Scan(context.Background(), all)
	require.NoError(t, err)
	vg2, err := st2.VG(vgName)
	require.NoError(t, err)
	assert.Equal(t, vg.Seqno, vg2.Seqno)
}

func TestGuestWrappedMetadata(t *testing.T) {
	dm := openDM(t)
	const vgName = "metawrap"
	// A small metadata area (pvcreate rounds it up to the data
	// alignment; 60928 bytes of ring) and long tags: a few dozen texts go
	// once around the ring, and a text that reaches its end is split there
	// (Wrapped). Each text is read.
	devs := newVG(t, vgName, 1, 64<<20, "--dataalignment", "64k", "--metadatasize", "32k")
	lvm(t, "lvcreate", "-y", "-an", "-Zn", "-L", "4m", "-n", "tagged", vgName)
	rd := lvmmeta.NewReader(lvmmeta.Limits{})
	// Each commit adds ten tags of 100 bytes: the text grows by about 1 KiB
	// a commit, to 26 KiB after 24 (under half the ring: lvm writes the new
	// text beside the old), and the 24 texts go round the ring about five
	// times. One lvm command a commit: each takes about a second here.
	commits := 24
	if s := os.Getenv("LVMMETA_WRAP_COMMITS"); s != "" {
		commits, _ = strconv.Atoi(s)
	}
	wraps := 0
	wasWrapped := false
	// read looks at each committed text; a split one is compared with lvs.
	read := func(i int) {
		st, err := rd.Scan(context.Background(), devs)
		require.NoError(t, err, "after commit %d", i)
		if w := st.PVs[0].Wrapped; w && !wasWrapped {
			wraps++
		}
		wasWrapped = st.PVs[0].Wrapped
		if i%8 == 0 || st.PVs[0].Wrapped {
			vg, err := st.VG(vgName)
			require.NoError(t, err)
			compare(t, dm, vg, report(t, vgName))
		}
	}
	for i := 0; i < commits; i++ {
		args := []string{"lvchange"}
		for j := range 10 {
			args = append(args, "--addtag", fmt.Sprintf("commit-%02d-%d-%s", i, j, strings.Repeat("a", 86)))
		}
		lvm(t, append(args, vgName+"/tagged")...)
		read(i)
	}
	st, err := rd.Scan(context.Background(), devs)
	require.NoError(t, err)
	t.Logf("%d commits (seqno %d), %d times the committed text wrapped around the ring of %d bytes",
		commits, st.VGs[vgName].Seqno, wraps, st.PVs[0].Label.MetadataAreas[0].Size-512)
	assert.Positive(t, wraps, "the ring wrapped")
}

// TestGuestCorruptHeader: a flipped bit in one PV's metadata area header
// is refused by its checksum; the reader never returns what it cannot
// verify, and Direct reads through lvmd instead (lvm itself carries on with
// the other PV's copy), saying so in its metric.
func TestGuestCorruptHeader(t *testing.T) {
	const vgName = "metacorrupt"
	ctx := context.Background()
	devs := newVG(t, vgName, 2, 64<<20)
	lvm(t, "lvcreate", "-y", "-an", "-Zn", "-L", "4m", "-n", "x", "--addtag", "t", vgName)
	rd := lvmmeta.NewReader(lvmmeta.Limits{})
	_, vg := readVG(t, rd, devs, vgName)
	require.NotNil(t, vg.LV("x"))
	lvmd, _ := startLVMD(t, vgName)
	direct := lvmbackend.NewDirect(lvmd, lvmbackend.DirectConfig{DM: openDM(t), Devices: devs,
		Classes: []lvmbackend.DirectClass{{Name: "bench", VolumeGroup: vgName}}})
	reg := prometheus.NewRegistry()
	reg.MustRegister(direct)
	metrics := func(want string) {
		t.Helper()
		assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want),
			"lvm_agent_lvm_metadata_direct", "lvm_agent_lvm_metadata_fallbacks_total"))
	}
	v, err := direct.GetVolume(ctx, "bench", "x")
	require.NoError(t, err)
	assert.Equal(t, []string{"t"}, v.Tags)
	// The device path, which the agent's created answer carries
	// (volume.device), as lvmd's GetLVList has it (an inactive LV too).
	viaLVMD, err := lvmd.GetVolume(ctx, "bench", "x")
	require.NoError(t, err)
	assert.Equal(t, "/dev/"+vgName+"/x", viaLVMD.Path)
	assert.Equal(t, viaLVMD.Path, v.Path, "lvmd's device path")
	metrics(`# HELP lvm_agent_lvm_metadata_direct 1 while the last read was answered from the on-disk LVM metadata, 0 after a fallback to lvmd.
# TYPE lvm_agent_lvm_metadata_direct gauge
lvm_agent_lvm_metadata_direct 1
`)

	flip := func() {
		f, err := os.OpenFile(devs[0], os.O_RDWR, 0)
		require.NoError(t, err)
		defer f.Close()
		b := make([]byte, 1)
		const at = 4096 + 300 // inside the first metadata area's header
		_, err = f.ReadAt(b, at)
		require.NoError(t, err)
		b[0] ^= 0x10
		_, err = f.WriteAt(b, at)
		require.NoError(t, err)
		require.NoError(t, f.Sync())
	}
	flip()
	_, err = rd.Scan(ctx, devs)
	var ce *lvmmeta.ChecksumError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "metadata area header", ce.What)
	require.ErrorIs(t, err, lvmmeta.ErrCorrupt)

	v, err = direct.GetVolume(ctx, "bench", "x")
	require.NoError(t, err, "lvmd answers")
	assert.Equal(t, []string{"t"}, v.Tags)
	metrics(`# HELP lvm_agent_lvm_metadata_direct 1 while the last read was answered from the on-disk LVM metadata, 0 after a fallback to lvmd.
# TYPE lvm_agent_lvm_metadata_direct gauge
lvm_agent_lvm_metadata_direct 0
# HELP lvm_agent_lvm_metadata_fallbacks_total Reads that went to lvmd because the on-disk LVM metadata could not be read or verified, by operation.
# TYPE lvm_agent_lvm_metadata_fallbacks_total counter
lvm_agent_lvm_metadata_fallbacks_total{op="get"} 1
`)
	flip() // back, so that lvm can remove the VG
	_, vg = readVG(t, rd, devs, vgName)
	require.NotNil(t, vg.LV("x"))
}

// TestGuestTorture: while lvmd creates and removes LVs and lvchange tags
// them, concurrent
// reads each return exactly one committed state: every read of a seqno
// is the same VG, and the seqnos lvs reports after each command read as
// lvs reported them.
func TestGuestTorture(t *testing.T) {
	const vgName = "metatorture"
	devs := newVG(t, vgName, 2, 128<<20)
	rd := lvmmeta.NewReader(lvmmeta.Limits{})
	minReads := 10000
	if s := os.Getenv("LVMMETA_TORTURE_READS"); s != "" {
		minReads, _ = strconv.Atoi(s)
	}

	type state map[string][]string // LV → tags
	stateOf := func(vg *lvmmeta.VG) state {
		s := state{}
		for _, lv := range vg.LVs {
			if lv.Visible() {
				s[lv.Name] = nil
				if len(lv.Tags) > 0 {
					s[lv.Name] = slices.Sorted(slices.Values(lv.Tags)) // as lvs prints them
				}
			}
		}
		return s
	}
	var (
		mu       sync.Mutex
		seen     = map[uint64]state{} // by the readers
		reads    atomic.Int64
		done     atomic.Bool
		readErrs []error
	)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := uint64(0)
			for !done.Load() || reads.Load() < int64(minReads) {
				st, err := rd.Scan(context.Background(), devs)
				if err == nil {
					var vg *lvmmeta.VG
					if vg, err = st.VG(vgName); err == nil {
						s := stateOf(vg)
						mu.Lock()
						if prev, ok := seen[vg.Seqno]; ok {
							assert.Equal(t, prev, s, "seqno %d read twice, differently", vg.Seqno)
						} else {
							seen[vg.Seqno] = s
						}
						mu.Unlock()
						assert.GreaterOrEqual(t, vg.Seqno, last, "seqno went back")
						last = vg.Seqno
					}
				}
				if err != nil {
					mu.Lock()
					readErrs = append(readErrs, err)
					mu.Unlock()
				}
				reads.Add(1)
			}
		}()
	}

	committed := map[uint64]state{} // by lvs, after each command
	record := func() {
		r := report(t, vgName)
		s := state{}
		for name, row := range r.LVs {
			s[name] = splitTags(row.Tags)
		}
		committed[r.Seqno] = s
	}
	// Creates and removes through topolvm's lvmd, as the agent makes them;
	// lvmd has no call that changes tags, so lvchange adds those.
	// Six rounds, 14 commits: each lvm command takes a second or more
	// here while the two readers run.
	lvmd, _ := startLVMD(t, vgName)
	ctx := context.Background()
	for i := 0; i < 6; i++ {
		name := lvName(i)
		_, err := lvmd.CreateVolume(ctx, lvmbackend.CreateRequest{DeviceClass: "bench", Name: name, SizeBytes: 4 << 20, Tags: []string{"torture"}})
		require.NoError(t, err)
		record()
		lvm(t, "lvchange", "--addtag", "round"+strconv.Itoa(i), vgName+"/"+name)
		record()
		if i%3 == 2 {
			require.NoError(t, lvmd.RemoveVolume(ctx, "bench", lvName(i-1)))
			record()
		}
	}
	done.Store(true)
	wg.Wait()

	require.Empty(t, readErrs, "reads failed")
	matched := 0
	for seqno, want := range committed {
		if got, ok := seen[seqno]; ok {
			matched++
			assert.Equal(t, want, got, "seqno %d", seqno)
		}
	}
	t.Logf("%d reads saw %d distinct seqnos; %d of the %d seqnos lvs reported were read, all equal", reads.Load(), len(seen), matched, len(committed))
	assert.GreaterOrEqual(t, reads.Load(), int64(minReads))
	assert.Greater(t, len(seen), 1, "reads overlapped commits")
}
