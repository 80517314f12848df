// Package lvmdfake is an in-memory LVM behind lvmd's real gRPC wire protocols,
// for unit, integration and scale tests on hosts without device-mapper. It
// keeps LVM's rules that a client can observe: extent rounding, free space,
// unique names, tags, thin pools with overprovisioning, and one operation at a
// time per volume group.
package lvmdfake

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// ExtentSize is LVM's default physical extent size.
const ExtentSize = 4 << 20

// Class is one lvmd device class and the volume group (or thin pool) behind it.
type Class struct {
	Name      string
	VG        string
	SizeBytes uint64
	// Thin classes allocate from a pool that may be overprovisioned.
	Thin          bool
	Overprovision float64
	// MetadataPercent is what Watch reports as the thin pool's metadata fill
	// (the model has no metadata of its own).
	MetadataPercent float64
}

// LV is one logical volume of the model.
type LV struct {
	Class     string
	Name      string
	SizeBytes uint64
	Tags      []string
	Major     uint32
	Minor     uint32
	Thin      bool
	// Origin is the LV this one is a (thick) snapshot of; a pool is a thin
	// pool; Pool is the thin pool of a thin LV added with Add.
	Origin string
	IsPool bool
	Pool   string
	// Attr is lv_attr as lvs prints it, filled in by List.
	Attr string
	// State, when set, is lv_attr's fifth character in place of 'a' for an
	// LV added with Add: 'i' is the device-mapper device with an inactive
	// table only that an lvcreate killed while activating leaves.
	State byte
	// Written is how much of a thin LV has been written (its mapped
	// blocks, which lvs' data_percent of the pool counts), set by Write.
	Written uint64
}

// Errors of the model; each dialect's server turns them into its daemon's
// own wire errors.
var (
	errNoClass  = errors.New("device-class not found")
	errNoSpace  = errors.New("no enough space left on VG")
	errExists   = errors.New("already exists")
	errNotFound = errors.New("not found")
	errBadSize  = errors.New("invalid size")
	// errUnimplemented and errTooSmall are lvmd's CreateLVSnapshot
	// refusals: a thick class or source, a size below the source's.
	errUnimplemented = errors.New("unimplemented")
	errTooSmall      = errors.New("too small")
)

type class struct {
	Class
	mu  sync.Mutex // held for the whole of an operation, as LVM's VG lock is
	lvs map[string]*LV
}

// errReserved is lvm's refusal of a reserved name part (one is modelled: the
// agent's validator knows lvm2's whole list; the model shows what lvmd says
// for a name that gets past it).
var errReserved = errors.New(`Names including "_cvol" are reserved. Please choose a different LV name.`)

// LVM is the in-memory state shared by the dialect servers.
type LVM struct {
	mu       sync.Mutex
	classes  map[string]*class
	latency  time.Duration
	minor    uint32
	hook     func(op, class, name string) error
	watchers map[chan struct{}]struct{}
	options  map[string]bool // lvcreate option classes
	// names are the LV names in use per volume group: unique in a VG,
	// whichever of its device classes holds the LV.
	names map[string]map[string]bool
}

// NewLVM makes a model with the given device classes.
func NewLVM(classes ...Class) *LVM {
	m := &LVM{classes: map[string]*class{}, watchers: map[chan struct{}]struct{}{}, names: map[string]map[string]bool{}}
	for _, c := range classes {
		if c.VG == "" {
			c.VG = c.Name
		}
		m.classes[c.Name] = &class{Class: c, lvs: map[string]*LV{}}
	}
	return m
}

// SetOptionClasses sets the lvcreate option classes the daemon knows; by
// default it knows none and refuses any.
func (m *LVM) SetOptionClasses(names ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.options = map[string]bool{}
	for _, n := range names {
		m.options[n] = true
	}
}

func (m *LVM) optionClass(name string) bool { m.mu.Lock(); defer m.mu.Unlock(); return m.options[name] }

// SetLatency makes every mutating operation take d, serialized per class.
func (m *LVM) SetLatency(d time.Duration) { m.mu.Lock(); m.latency = d; m.mu.Unlock() }

// SetHook installs fn, called at the start of every operation (op is
// "create", "remove", "resize", "snapshot" or "list"); a non-nil error is returned to the client
// as the daemon's internal error.
func (m *LVM) SetHook(fn func(op, class, name string) error) { m.mu.Lock(); m.hook = fn; m.mu.Unlock() }

// begin is what every operation does first: look the class up, then run the
// test hook. It returns the class and the latency to simulate.
func (m *LVM) begin(op, className, name string) (*class, time.Duration, error) {
	m.mu.Lock()
	c, ok := m.classes[className]
	latency, hook := m.latency, m.hook
	m.mu.Unlock()
	if !ok {
		return nil, 0, fmt.Errorf("%w: %s", errNoClass, className)
	}
	if hook != nil {
		if err := hook(op, className, name); err != nil {
			return nil, 0, err
		}
	}
	return c, latency, nil
}

// Create adds an LV, with LVM's rounding to whole extents.
func (m *LVM) Create(className, name string, size uint64, tags []string) (LV, error) {
	c, latency, err := m.begin("create", className, name)
	if err != nil {
		return LV{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	time.Sleep(latency)
	if size == 0 || size%4096 != 0 {
		return LV{}, fmt.Errorf("%w: %d is not a positive multiple of 4096", errBadSize, size)
	}
	if strings.Contains(name, "_cvol") {
		return LV{}, errReserved
	}
	if free := c.free(); free < size {
		return LV{}, fmt.Errorf("%w: free=%d, requested=%d", errNoSpace, free, size)
	}
	if !m.claim(c.VG, name) {
		return LV{}, fmt.Errorf("Logical Volume %q %w in volume group %q", name, errExists, c.VG)
	}
	m.mu.Lock()
	m.minor++
	minor := m.minor
	m.mu.Unlock()
	lv := &LV{Class: className, Name: name, SizeBytes: (size + ExtentSize - 1) / ExtentSize * ExtentSize,
		Tags: append([]string(nil), tags...), Major: 253, Minor: minor, Thin: c.Thin}
	c.lvs[name] = lv
	m.notify()
	return *lv, nil
}

// Snapshot makes a thin snapshot of source in a thin class, as topolvm's
// lvmd (v0.41, internal/lvmd/lvservice.go CreateLVSnapshot) does: the class
// must be thin (else errUnimplemented) and the source a thin LV of it
// (missing: errNotFound; thick: errUnimplemented); size 0 is the source's
// size, a smaller one errTooSmall; the pool's overprovisioned free space
// must hold size (errNoSpace); the name must be free (lvcreate's refusal,
// Internal). The snapshot is a thin LV with only the tags asked (lvcreate
// --addtag), not tied to its source: removing either leaves the other.
// access is the activation, "rw" or "ro"; any other fails after the
// lvcreate and the snapshot is removed again, as lvmd does.
func (m *LVM) Snapshot(className, name, source string, size uint64, tags []string, access string) (LV, error) {
	c, latency, err := m.begin("snapshot", className, name)
	if err != nil {
		return LV{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	time.Sleep(latency)
	if !c.Thin {
		return LV{}, fmt.Errorf("%w: device class is not thin. Thick snapshots are not implemented yet", errUnimplemented)
	}
	src, ok := c.lvs[source]
	switch {
	case !ok:
		return LV{}, fmt.Errorf("%w: source logical volume %s is not found", errNotFound, source)
	case !src.Thin && src.Pool == "":
		return LV{}, fmt.Errorf("%w: snapshot can be created for only thin volumes", errUnimplemented)
	case size == 0:
		size = src.SizeBytes
	case size < src.SizeBytes:
		return LV{}, fmt.Errorf("%w: requested size %v is smaller than source logical volume: %v", errTooSmall, size, src.SizeBytes)
	}
	if free := c.free(); free < size {
		return LV{}, fmt.Errorf("%w: free=%d, desiredSize=%d", errNoSpace, free, size)
	}
	if !m.claim(c.VG, name) {
		return LV{}, fmt.Errorf("Logical Volume %q %w in volume group %q", name, errExists, c.VG)
	}
	if access != "rw" && access != "ro" {
		m.unclaim(c.VG, name)
		return LV{}, fmt.Errorf("unknown access: %s for LogicalVolume %s/%s", access, c.VG, name)
	}
	m.mu.Lock()
	m.minor++
	minor := m.minor
	m.mu.Unlock()
	lv := &LV{Class: className, Name: name, SizeBytes: (size + ExtentSize - 1) / ExtentSize * ExtentSize,
		Tags: append([]string(nil), tags...), Major: 253, Minor: minor, Thin: true, Written: src.Written}
	c.lvs[name] = lv
	m.notify()
	return *lv, nil
}

// claim takes name in volume group vg, if no LV there has it.
func (m *LVM) claim(vg, name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.names[vg][name] {
		return false
	}
	if m.names[vg] == nil {
		m.names[vg] = map[string]bool{}
	}
	m.names[vg][name] = true
	return true
}

func (m *LVM) unclaim(vg, name string) { m.mu.Lock(); delete(m.names[vg], name); m.mu.Unlock() }

// Add puts lv into its class as it is, without lvmd: for LVs lvmd does not
// make (snapshots, thin pools, thin LVs of a pool named by Pool).
func (m *LVM) Add(lv LV) error {
	m.mu.Lock()
	c, ok := m.classes[lv.Class]
	m.minor++
	lv.Major, lv.Minor = 253, m.minor
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", errNoClass, lv.Class)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !m.claim(c.VG, lv.Name) {
		return fmt.Errorf("Logical Volume %q %w", lv.Name, errExists)
	}
	lv.Tags = append([]string(nil), lv.Tags...)
	c.lvs[lv.Name] = &lv
	m.notify()
	return nil
}

// Remove deletes an LV as lvmd's "lvremove -f" does: with its dependents (an
// origin's snapshots, a thin pool's thin LVs).
func (m *LVM) Remove(className, name string) error {
	c, latency, err := m.begin("remove", className, name)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	time.Sleep(latency)
	if _, ok := c.lvs[name]; !ok {
		return fmt.Errorf("%w: %s/%s", errNotFound, c.VG, name)
	}
	delete(c.lvs, name)
	m.unclaim(c.VG, name)
	for n, lv := range c.lvs {
		if lv.Origin == name || lv.Pool == name {
			delete(c.lvs, n)
			m.unclaim(c.VG, n)
		}
	}
	m.notify()
	return nil
}

// Resize grows an LV as lvmd's ResizeLV does: a size at most the LV's is
// no change (lvmd never shrinks and answers with the current size), more
// than the class's free space can add is errNoSpace, and otherwise the LV
// grows to the size rounded up to whole extents. Thick and thin LVs alike:
// a thin class's free space is its overprovisioned pool's.
func (m *LVM) Resize(className, name string, size uint64) (LV, error) {
	c, latency, err := m.begin("resize", className, name)
	if err != nil {
		return LV{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	lv, found := c.lvs[name]
	if !found {
		return LV{}, fmt.Errorf("%w: logical volume %s is not found", errNotFound, name)
	}
	if size <= lv.SizeBytes {
		return *lv, nil
	}
	time.Sleep(latency)
	if free := c.free(); free < size-lv.SizeBytes {
		return LV{}, fmt.Errorf("%w: free=%d, requested=%d", errNoSpace, free, size-lv.SizeBytes)
	}
	lv.SizeBytes = (size + ExtentSize - 1) / ExtentSize * ExtentSize
	m.notify()
	return *lv, nil
}

// Write records that n bytes of LV name have been written (at most its
// size): a thin pool's data fill counts written bytes, not provisioned ones.
func (m *LVM) Write(className, name string, n uint64) error {
	m.mu.Lock()
	c, ok := m.classes[className]
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", errNoClass, className)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	lv, found := c.lvs[name]
	if !found {
		return fmt.Errorf("%w: %s/%s", errNotFound, c.VG, name)
	}
	lv.Written = min(n, lv.SizeBytes)
	m.notify()
	return nil
}

// List returns the LVs of a class sorted by name.
func (m *LVM) List(className string) ([]LV, error) {
	c, _, err := m.begin("list", className, "")
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]LV, 0, len(c.lvs))
	for _, lv := range c.lvs {
		l := *lv
		l.Attr = c.attr(lv)
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Usage is a class's size (the VG's, or the thin pool's), its free bytes as
// lvmd reports them, the bytes its LVs take and the bytes written to them.
type Usage struct {
	Class                     string
	Size, Free, Used, Written uint64
	Thin                      bool
	MetadataPercent           float64
}

// Usage reports every class, sorted by name.
func (m *LVM) Usage() []Usage {
	m.mu.Lock()
	names := make([]string, 0, len(m.classes))
	for n := range m.classes {
		names = append(names, n)
	}
	m.mu.Unlock()
	sort.Strings(names)
	out := make([]Usage, 0, len(names))
	for _, n := range names {
		u, _ := m.usage(n)
		out = append(out, u)
	}
	return out
}

// vg is the volume group of a class ("" for an unknown class).
func (m *LVM) vg(class string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c, ok := m.classes[class]; ok {
		return c.VG
	}
	return ""
}

// usage reports one class.
func (m *LVM) usage(name string) (Usage, bool) {
	m.mu.Lock()
	c, ok := m.classes[name]
	m.mu.Unlock()
	if !ok {
		return Usage{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return Usage{Class: name, Size: c.SizeBytes, Free: c.free(), Used: c.used(), Written: c.written(), Thin: c.Thin, MetadataPercent: c.MetadataPercent}, true
}

// Subscribe returns a channel that receives after every change, and a cancel func.
func (m *LVM) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	m.mu.Lock()
	m.watchers[ch] = struct{}{}
	m.mu.Unlock()
	return ch, func() { m.mu.Lock(); delete(m.watchers, ch); m.mu.Unlock() }
}

func (m *LVM) notify() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for ch := range m.watchers {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// attr is the LV's lv_attr as lvs prints it: its kind's, with the state
// of an LV added with one (State).
func (c *class) attr(lv *LV) string {
	a := []byte(c.kind(lv))
	if lv.State != 0 {
		a[4] = lv.State
	}
	return string(a)
}

// kind is lv_attr for an active LV: a thin pool, a thin LV, a snapshot, an
// origin with snapshots, or a linear LV.
func (c *class) kind(lv *LV) string {
	switch {
	case lv.IsPool:
		return "twi-a-tz--"
	case lv.Thin || lv.Pool != "":
		return "Vwi-a-tz--"
	case lv.Origin != "":
		return "swi-a-s---"
	}
	for _, o := range c.lvs {
		if o.Origin == lv.Name {
			return "owi-a-s---"
		}
	}
	return "-wi-a-----"
}

func (c *class) used() uint64 {
	var used uint64
	for _, lv := range c.lvs {
		used += lv.SizeBytes
	}
	return used
}

func (c *class) written() uint64 {
	var w uint64
	for _, lv := range c.lvs {
		w += lv.Written
	}
	return w
}

// free is what lvmd reports: VG free space, or for a thin pool its size
// times the overprovision ratio minus the virtual sizes allocated.
func (c *class) free() uint64 {
	total := c.SizeBytes
	if c.Thin && c.Overprovision > 0 {
		total = uint64(float64(c.SizeBytes) * c.Overprovision)
	}
	if u := c.used(); u < total {
		return total - u
	}
	return 0
}
