package lvmbackend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	lvmdtypes "github.com/topolvm/topolvm/pkg/lvmd/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/lvm-agent/lvm-agent/lvmbackend/devmapper"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmmeta"
)

// DirectClass is what the direct reader must know of an lvmd device class
// to answer as lvmd would: its VG, its thin pool, and how lvmd computes
// its free space.
type DirectClass struct {
	Name, VolumeGroup string
	// ThinPool is set for a thin class.
	ThinPool string
	// SpareBytes is what lvmd keeps free in a thick class's VG.
	SpareBytes uint64
	// Overprovision is a thin class's overprovision ratio.
	Overprovision float64
}

// DirectConfig configures NewDirect.
type DirectConfig struct {
	Classes []DirectClass
	// Devices are globs of the block devices to scan (empty: all).
	Devices []string
	// DM reads whether LVs are active and their device numbers (a
	// *devmapper.Control).
	DM DeviceInfo
	// DevicesFile is lvm's devices file: when it exists, lvm reads only
	// the devices it lists, which this reader does not interpret, so
	// without an explicit Devices filter every read falls back.
	DevicesFile string
	// PollInterval is how often WatchCapacity re-reads the metadata.
	PollInterval time.Duration
	// Closer, when set, is closed with the Direct (the DM it opened).
	Closer io.Closer
}

// DeviceInfo is the device-mapper queries Direct needs.
type DeviceInfo interface {
	Info(ctx context.Context, name string) (devmapper.Info, error)
	List(ctx context.Context) ([]devmapper.Device, error)
}

// DefaultDevicesFile is lvm's default devices file.
const DefaultDevicesFile = "/etc/lvm/devices/system.devices"

// Direct is a Backend that answers GetVolume, ListVolumes, Capacity and
// WatchCapacity from the VGs' on-disk metadata and device-mapper, and sends
// every write to the wrapped lvmd Backend. Reads cost no lvm process:
// topolvm's lvmd answers each listing with `lvs` over the whole VG, and
// runs `lvm fullreport` for each open Watch stream after every change.
// When the metadata cannot be read or verified (no privilege, a checksum
// that fails, a shared VG, a devices file) the read goes to lvmd instead;
// the switch is logged once per episode and counted in a metric.
type Direct struct {
	Backend
	cfg     DirectConfig
	classes map[string]DirectClass
	reader  *lvmmeta.Reader
	// scanState reads the VGs; the tests replace it.
	scanState func(context.Context) (*lvmmeta.State, error)

	fallbacks *prometheus.CounterVec
	direct    prometheus.Gauge
	mu        sync.Mutex
	failing   bool
}

var _ Backend = (*Direct)(nil)

// NewDirect wraps lvmd.
func NewDirect(lvmd Backend, cfg DirectConfig) *Direct {
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 5 * time.Second
	}
	d := &Direct{Backend: lvmd, cfg: cfg, classes: map[string]DirectClass{}, reader: lvmmeta.NewReader(lvmmeta.Limits{}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_lvm_metadata_fallbacks_total",
			Help: "Reads that went to lvmd because the on-disk LVM metadata could not be read or verified, by operation."}, []string{"op"}),
		direct: prometheus.NewGauge(prometheus.GaugeOpts{Name: "lvm_agent_lvm_metadata_direct",
			Help: "1 while the last read was answered from the on-disk LVM metadata, 0 after a fallback to lvmd."}),
	}
	for _, c := range cfg.Classes {
		d.classes[c.Name] = c
	}
	d.scanState = d.scan
	return d
}

// Describe and Collect make the fallback metrics registrable.
func (d *Direct) Describe(ch chan<- *prometheus.Desc) {
	d.fallbacks.Describe(ch)
	d.direct.Describe(ch)
}

// Collect: see Describe.
func (d *Direct) Collect(ch chan<- prometheus.Metric) {
	d.fallbacks.Collect(ch)
	d.direct.Collect(ch)
}

// Close closes lvmd's connection and the Closer.
func (d *Direct) Close() error {
	err := d.Backend.Close()
	if d.cfg.Closer != nil {
		err = errors.Join(err, d.cfg.Closer.Close())
	}
	return err
}

// errClass: the class is not one the direct reader was told about.
var errClass = errors.New("device class not configured for direct reads")

// read runs fn on the device class's VG; any failure to get there is
// returned for the caller to fall back.
func (d *Direct) read(ctx context.Context, class string) (DirectClass, *lvmmeta.VG, error) {
	c, ok := d.classes[class]
	if !ok {
		return c, nil, fmt.Errorf("%w: %q", errClass, class)
	}
	st, err := d.scanState(ctx)
	if err != nil {
		return c, nil, err
	}
	vg, err := st.VG(c.VolumeGroup)
	return c, vg, err
}

func (d *Direct) scan(ctx context.Context) (*lvmmeta.State, error) {
	if d.cfg.DM == nil {
		return nil, errors.New("device-mapper is not open: active state and device numbers are unknown")
	}
	if len(d.cfg.Devices) == 0 && d.cfg.DevicesFile != "" {
		if _, err := os.Stat(d.cfg.DevicesFile); err == nil {
			return nil, fmt.Errorf("lvm's devices file %s exists (set a device filter to read directly)", d.cfg.DevicesFile)
		}
	}
	paths, err := lvmmeta.Devices(d.cfg.Devices)
	if err != nil {
		return nil, err
	}
	return d.reader.Scan(ctx, paths)
}

// fellBack records a fallback; the log says so when direct reads stop
// working and when they work again, not on every read.
func (d *Direct) fellBack(op string, err error) {
	if errors.Is(err, errClass) {
		return // lvmd's to answer (an unknown class): not a metadata failure
	}
	d.fallbacks.WithLabelValues(op).Inc()
	d.direct.Set(0)
	d.mu.Lock()
	first := !d.failing
	d.failing = true
	d.mu.Unlock()
	if first {
		klog.InfoS("Reading LVM metadata directly failed; reading through lvmd until it works again", "op", op, "err", err)
	}
}

func (d *Direct) worked() {
	d.direct.Set(1)
	d.mu.Lock()
	recovered := d.failing
	d.failing = false
	d.mu.Unlock()
	if recovered {
		klog.InfoS("Reading LVM metadata directly again")
	}
}

// GetVolume reads one volume from the metadata.
func (d *Direct) GetVolume(ctx context.Context, deviceClass, name string) (*Volume, error) {
	c, vg, err := d.read(ctx, deviceClass)
	if err == nil {
		var v Volume
		var ok bool
		if v, ok, _, err = d.volume(ctx, c, vg, vg.LV(name), nil, nil); err == nil {
			d.worked()
			if !ok {
				return nil, &Error{Op: "get " + deviceClass + "/" + name, Kind: ErrNotFound}
			}
			return &v, nil
		}
	}
	d.fellBack("get", err)
	return d.Backend.GetVolume(ctx, deviceClass, name)
}

// ListVolumes lists a class's volumes from the metadata.
func (d *Direct) ListVolumes(ctx context.Context, deviceClass string) ([]Volume, error) {
	c, vg, err := d.read(ctx, deviceClass)
	var present map[string]bool
	if err == nil {
		present, err = d.presentDevices(ctx)
	}
	if err == nil {
		vols := make([]Volume, 0, len(vg.LVs))
		var buf []byte
		for i := range vg.LVs {
			var v Volume
			var ok bool
			if v, ok, buf, err = d.volume(ctx, c, vg, &vg.LVs[i], present, buf); err != nil {
				break
			}
			if ok {
				vols = append(vols, v)
			}
		}
		if err == nil {
			d.worked()
			return vols, nil
		}
	}
	d.fellBack("list", err)
	return d.Backend.ListVolumes(ctx, deviceClass)
}

// presentDevices is the uuids of every device-mapper device, from one
// DM_LIST_DEVICES, so that a listing asks DM_DEV_STATUS only of the LVs
// that have a device; nil when the kernel predates uuids in the list.
func (d *Direct) presentDevices(ctx context.Context) (map[string]bool, error) {
	devs, err := d.cfg.DM.List(ctx)
	if err != nil {
		return nil, err
	}
	present := make(map[string]bool, len(devs))
	for _, dev := range devs {
		if !dev.UUIDKnown {
			return nil, nil
		}
		present[dev.UUID] = true
	}
	return present, nil
}

// volume is lv as lvmd's GetLVList reports it for class c, and false when
// lvmd would not list it: hidden LVs, thin pools, thin volumes in a thick
// class, and in a thin class anything but the class pool's thin volumes.
// present, when not nil, says which device uuids exist; buf is scratch
// for the uuid, returned for the next call.
func (d *Direct) volume(ctx context.Context, c DirectClass, vg *lvmmeta.VG, lv *lvmmeta.LV, present map[string]bool, buf []byte) (Volume, bool, []byte, error) {
	if lv == nil || !lv.Visible() || lv.Type() == "thin-pool" {
		return Volume{}, false, buf, nil
	}
	if c.ThinPool == "" && lv.Pool != "" || c.ThinPool != "" && lv.Pool != c.ThinPool {
		return Volume{}, false, buf, nil
	}
	// Path: lvs' lv_path, which lvmd's GetLVList reports (the agent's
	// created answer carries it as volume.device): lvm's device directory,
	// the VG and the LV, active or not.
	v := Volume{DeviceClass: c.Name, Name: lv.Name, SizeBytes: int64(min(vg.SizeBytes(lv), math.MaxInt64)),
		Origin: lv.Origin, Pool: lv.Pool, Path: "/dev/" + vg.Name + "/" + lv.Name}
	if len(lv.Tags) > 0 {
		v.Tags = slices.Clone(lv.Tags)
		slices.Sort(v.Tags) // as lvs prints them
	}
	// Not a thin pool, so the LV's own device (DMDevice's rule).
	buf = vg.AppendDMUUID(buf[:0], lv)
	if present != nil && !present[string(buf)] {
		v.Attr = vg.Attr(lv, false, false)
		return v, true, buf, nil
	}
	dmName, dmUUID := vg.DMDevice(lv)
	info, err := d.cfg.DM.Info(ctx, dmName)
	active := false
	switch {
	case errors.Is(err, devmapper.ErrNotFound):
	case err != nil:
		return Volume{}, false, buf, err
	case info.UUID != dmUUID:
		return Volume{}, false, buf, fmt.Errorf("device %s has uuid %q, the metadata says %q", info.Name, info.UUID, dmUUID)
	default:
		active = info.LiveTable
		if active {
			v.DevMajor, v.DevMinor = info.Major, info.Minor
		}
	}
	v.Attr = vg.Attr(lv, active, active && info.OpenCount > 0)
	return v, true, buf, nil
}

// Capacity computes every configured class's capacity as lvmd's Watch
// does: a thick class is its VG's size and free space less the spare; a
// thin class is its pool's size and the overprovisioned room left.
func (d *Direct) Capacity(ctx context.Context) ([]Capacity, error) {
	caps, err := d.capacity(ctx)
	if err != nil {
		d.fellBack("capacity", err)
		return d.Backend.Capacity(ctx)
	}
	d.worked()
	return caps, nil
}

func (d *Direct) capacity(ctx context.Context) ([]Capacity, error) {
	st, err := d.scanState(ctx)
	if err != nil {
		return nil, err
	}
	caps := make([]Capacity, 0, len(d.cfg.Classes))
	for _, c := range d.cfg.Classes {
		vg, err := st.VG(c.VolumeGroup)
		if err != nil {
			return nil, err
		}
		caps = append(caps, ClassCapacity(c, vg))
	}
	return caps, nil
}

// ClassCapacity is lvmd's capacity arithmetic for one class.
func ClassCapacity(c DirectClass, vg *lvmmeta.VG) Capacity {
	cp := Capacity{DeviceClass: c.Name, SizeBytes: vg.TotalExtents() * vg.ExtentSize}
	if c.ThinPool == "" {
		free := vg.FreeExtents() * vg.ExtentSize
		cp.FreeBytes = free - min(free, c.SpareBytes)
		return cp
	}
	cp.Thin = true
	pool := vg.LV(c.ThinPool)
	if pool == nil {
		return cp
	}
	cp.SizeBytes = vg.SizeBytes(pool)
	var virtual uint64
	for _, lv := range vg.LVs {
		if lv.Pool == c.ThinPool && lv.Visible() {
			virtual += vg.SizeBytes(&lv)
		}
	}
	if room := uint64(math.Floor(c.Overprovision * float64(cp.SizeBytes))); room > virtual {
		cp.FreeBytes = room - virtual
	}
	return cp
}

// WatchCapacity re-reads the metadata every PollInterval and reports when
// the capacity changed, instead of holding lvmd's Watch stream open (each
// open stream costs an `lvm fullreport` after every lvmd write). When the
// metadata cannot be read it follows lvmd's stream for the rest of the
// call. lvmd's reachability is still checked on each poll when the
// dialect can be pinged without running lvm.
func (d *Direct) WatchCapacity(ctx context.Context, fn func([]Capacity)) error {
	var last []Capacity
	for {
		if p, ok := d.Backend.(interface{ Ping(context.Context) error }); ok {
			// Only "unreachable" counts: an lvmd without the health
			// service still answers.
			if err := p.Ping(ctx); errors.Is(err, ErrUnavailable) {
				return err
			}
		}
		caps, err := d.capacity(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			d.fellBack("watch", err)
			return d.Backend.WatchCapacity(ctx, fn)
		}
		d.worked()
		if !slices.Equal(caps, last) {
			fn(caps)
			last = caps
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d.cfg.PollInterval):
		}
	}
}

// ClassesFromLVMDConfig reads topolvm lvmd's configuration file, the one
// place that says which VG and thin pool each device class is.
func ClassesFromLVMDConfig(path string) ([]DirectClass, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cfg struct {
		DeviceClasses []*lvmdtypes.DeviceClass `json:"device-classes"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []DirectClass
	for _, dc := range cfg.DeviceClasses {
		c := DirectClass{Name: dc.Name, VolumeGroup: dc.VolumeGroup, SpareBytes: 10 << 30}
		if dc.SpareGB != nil {
			c.SpareBytes = *dc.SpareGB << 30
		}
		if dc.Type == lvmdtypes.TypeThin {
			if dc.ThinPoolConfig == nil {
				return nil, fmt.Errorf("%s: thin device class %s has no thin-pool", path, dc.Name)
			}
			c.ThinPool, c.Overprovision, c.SpareBytes = dc.ThinPoolConfig.Name, dc.ThinPoolConfig.OverprovisionRatio, 0
		}
		out = append(out, c)
	}
	return out, nil
}
