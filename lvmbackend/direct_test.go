package lvmbackend

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/lvmbackend/devmapper"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmmeta"
)

// fakeDM answers Info and List from a map; a missing name is
// ErrNotFound, as the kernel's ENXIO is.
type fakeDM map[string]devmapper.Info

func (f fakeDM) List(context.Context) ([]devmapper.Device, error) {
	var out []devmapper.Device
	for _, i := range f {
		out = append(out, devmapper.Device{Name: i.Name, Major: i.Major, Minor: i.Minor, UUID: i.UUID, UUIDKnown: true})
	}
	return out, nil
}

func (f fakeDM) Info(_ context.Context, name string) (devmapper.Info, error) {
	if i, ok := f[name]; ok {
		return i, nil
	}
	return devmapper.Info{}, &devmapper.Error{Op: "DM_DEV_STATUS", Kind: devmapper.ErrNotFound}
}

// directFixture is a Direct over the metadata of lvmmeta/testdata/vg0.vgtext
// and a fake topolvm lvmd (over its real gRPC wire) whose every read is
// counted: a direct read must not reach it.
type directFixture struct {
	d        *Direct
	vg       *lvmmeta.VG
	lvmdOps  []string
	mu       sync.Mutex
	scanErr  error
	lvmdSize uint64
}

func newDirectFixture(t *testing.T) *directFixture {
	text, err := os.ReadFile("lvmmeta/testdata/vg0.vgtext")
	require.NoError(t, err)
	vg, err := lvmmeta.ParseVG(text, lvmmeta.DefaultLimits)
	require.NoError(t, err)
	f := &directFixture{vg: vg}

	m := lvmdfake.NewLVM(lvmdfake.Class{Name: "thick", VG: "vg0", SizeBytes: 64 << 20},
		lvmdfake.Class{Name: "thin", VG: "vg0", SizeBytes: 64 << 20, Thin: true, Overprovision: 2})
	_, err = m.Create("thick", "fromlvmd", 8<<20, nil)
	require.NoError(t, err)
	m.SetHook(func(op, class, name string) error {
		f.mu.Lock()
		f.lvmdOps = append(f.lvmdOps, op+" "+class)
		f.mu.Unlock()
		return nil
	})
	path := filepath.Join(t.TempDir(), "lvmd.sock")
	srv := lvmdfake.NewTopolvm(m)
	require.NoError(t, srv.Serve(path))
	t.Cleanup(srv.Stop)
	lvmd, err := NewTopolvm(path)
	require.NoError(t, err)

	dm := fakeDM{
		"vg0-lin":  {Name: "vg0-lin", UUID: vg.DMUUID(vg.LV("lin")), Major: 254, Minor: 1, LiveTable: true, OpenCount: 1},
		"vg0-thin": {Name: "vg0-thin", UUID: vg.DMUUID(vg.LV("thin")), Major: 254, Minor: 5, LiveTable: true},
	}
	f.d = NewDirect(lvmd, DirectConfig{DM: dm, Classes: []DirectClass{
		{Name: "thick", VolumeGroup: "vg0", SpareBytes: 4 << 20},
		{Name: "thin", VolumeGroup: "vg0", ThinPool: "pool", Overprovision: 2},
	}})
	f.d.scanState = func(context.Context) (*lvmmeta.State, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.scanErr != nil {
			return nil, f.scanErr
		}
		return &lvmmeta.State{VGs: map[string]*lvmmeta.VG{"vg0": vg}}, nil
	}
	t.Cleanup(func() { _ = f.d.Close() })
	return f
}

func (f *directFixture) ops() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.lvmdOps...)
}

func TestDirectReads(t *testing.T) {
	f := newDirectFixture(t)
	ctx := context.Background()

	v, err := f.d.GetVolume(ctx, "thick", "lin")
	require.NoError(t, err)
	assert.Equal(t, &Volume{DeviceClass: "thick", Name: "lin", SizeBytes: 12 << 20,
		Tags:     []string{"a\"quote\\back", "lvm-agent.io/owned", "odd:tag=with/chars&more#"}, // sorted, as lvs prints them
		DevMajor: 254, DevMinor: 1, Attr: "owi-aos---", Path: "/dev/vg0/lin"}, v)

	v, err = f.d.GetVolume(ctx, "thin", "tsnap")
	require.NoError(t, err)
	assert.Equal(t, &Volume{DeviceClass: "thin", Name: "tsnap", SizeBytes: 32 << 20, Attr: "Vwi---tz-k",
		Origin: "thin", Pool: "pool", Path: "/dev/vg0/tsnap"}, v, "inactive thin snapshot")

	for _, c := range []struct{ class, name string }{
		{"thick", "thin"},          // a thin LV is not in the thick class
		{"thin", "lin"},            // nor a thick one in the thin class
		{"thick", "pool"},          // pools are not volumes
		{"thick", "lvol0_pmspare"}, // hidden
		{"thick", "missing"},
	} {
		_, err := f.d.GetVolume(ctx, c.class, c.name)
		require.ErrorIs(t, err, ErrNotFound, "%s/%s", c.class, c.name)
	}

	names := func(vols []Volume) (out []string) {
		for _, v := range vols {
			out = append(out, v.Name)
		}
		return out
	}
	vols, err := f.d.ListVolumes(ctx, "thick")
	require.NoError(t, err)
	assert.Equal(t, []string{"lin", "str", "snap"}, names(vols))
	vols, err = f.d.ListVolumes(ctx, "thin")
	require.NoError(t, err)
	assert.Equal(t, []string{"thin", "tsnap"}, names(vols))

	caps, err := f.d.Capacity(ctx)
	require.NoError(t, err)
	// thick: 62 extents, 48 free, less 4 MiB spare; thin: pool of 16 MiB,
	// twice that overprovisioned, 64 MiB of thin volumes already.
	assert.Equal(t, []Capacity{{DeviceClass: "thick", SizeBytes: 62 * 4 << 20, FreeBytes: 47 * 4 << 20},
		{DeviceClass: "thin", SizeBytes: 16 << 20, FreeBytes: 0, Thin: true}}, caps)

	assert.Empty(t, f.ops(), "no read reached lvmd")
	assert.Equal(t, 1.0, testutil.ToFloat64(f.d.direct))
}

// klogLines sends klog's output to the returned buffer until the test ends.
func klogLines(t *testing.T) *strings.Builder {
	var buf strings.Builder
	klog.LogToStderr(false)
	klog.SetOutput(&buf)
	t.Cleanup(func() { klog.Flush(); klog.LogToStderr(true) })
	return &buf
}

func TestDirectFallsBack(t *testing.T) {
	f := newDirectFixture(t)
	ctx := context.Background()
	logs := klogLines(t)
	f.scanErr = &lvmmeta.ChecksumError{What: "metadata area header", Want: 1, Got: 2}

	v, err := f.d.GetVolume(ctx, "thick", "fromlvmd")
	require.NoError(t, err)
	assert.Equal(t, "fromlvmd", v.Name, "answered by lvmd")
	_, err = f.d.ListVolumes(ctx, "thick")
	require.NoError(t, err)
	assert.Equal(t, []string{"list thick", "list thick"}, f.ops())
	assert.Equal(t, 1.0, testutil.ToFloat64(f.d.fallbacks.WithLabelValues("get")))
	assert.Equal(t, 1.0, testutil.ToFloat64(f.d.fallbacks.WithLabelValues("list")))
	assert.Equal(t, 0.0, testutil.ToFloat64(f.d.direct))

	// A class the reader was not told about goes to lvmd too, without
	// counting as a fallback.
	_, err = f.d.ListVolumes(ctx, "other")
	require.ErrorIs(t, err, ErrUnknownDeviceClass)
	assert.Equal(t, 1.0, testutil.ToFloat64(f.d.fallbacks.WithLabelValues("list")))

	f.scanErr = nil
	_, err = f.d.GetVolume(ctx, "thick", "lin")
	require.NoError(t, err)
	assert.Equal(t, 1.0, testutil.ToFloat64(f.d.direct), "direct again once the metadata verifies")
	// Two reads fell back and one recovered: the log says each once.
	klog.Flush()
	assert.Equal(t, 1, strings.Count(logs.String(), "Reading LVM metadata directly failed"), logs.String())
	assert.Equal(t, 1, strings.Count(logs.String(), "Reading LVM metadata directly again"), logs.String())

	// A device whose uuid is not the LV's is not trusted.
	f.d.cfg.DM = fakeDM{"vg0-lin": {Name: "vg0-lin", UUID: "LVM-other", LiveTable: true}}
	_, err = f.d.GetVolume(ctx, "thick", "lin")
	require.ErrorIs(t, err, ErrNotFound, "lvmd's answer: its model has no lin")
}

func TestDirectWatchCapacity(t *testing.T) {
	f := newDirectFixture(t)
	f.d.cfg.PollInterval = 1
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got [][]Capacity
	err := f.d.WatchCapacity(ctx, func(c []Capacity) {
		got = append(got, c)
		if len(got) == 1 {
			f.mu.Lock()
			f.scanErr = errors.New("devices unreadable")
			f.mu.Unlock()
		} else {
			cancel()
		}
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Len(t, got, 2, "once from the metadata, then from lvmd's stream")
	assert.Equal(t, uint64(16<<20), got[0][1].SizeBytes, "the thin class, read from the metadata")
	assert.Equal(t, uint64(64<<20), got[1][0].SizeBytes, "lvmd's model")
}

func TestClassesFromLVMDConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lvmd.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`socket-name: /run/topolvm/lvmd.sock
device-classes:
  - name: thick
    volume-group: vg0
    default: true
    spare-gb: 1
  - name: thin
    volume-group: vg0
    type: thin
    thin-pool:
      name: pool0
      overprovision-ratio: 5.0
  - name: nospare
    volume-group: vg1
`), 0o600))
	classes, err := ClassesFromLVMDConfig(path)
	require.NoError(t, err)
	assert.Equal(t, []DirectClass{
		{Name: "thick", VolumeGroup: "vg0", SpareBytes: 1 << 30},
		{Name: "thin", VolumeGroup: "vg0", ThinPool: "pool0", Overprovision: 5},
		{Name: "nospare", VolumeGroup: "vg1", SpareBytes: 10 << 30},
	}, classes)
	_, err = ClassesFromLVMDConfig(filepath.Join(t.TempDir(), "missing"))
	require.Error(t, err)
}
