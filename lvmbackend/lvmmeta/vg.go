package lvmmeta

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// VG is one volume group as its committed metadata describes it.
type VG struct {
	Name, UUID string
	Seqno      uint64
	// ExtentSize is in bytes.
	ExtentSize uint64
	Status     []string
	Flags      []string
	Tags       []string
	// LockType is set for shared (lvmlockd) VGs, SystemID for VGs owned
	// by one host; this reader does not interpret either.
	LockType, SystemID string
	PVs                []PV
	LVs                []LV
}

// PV is a physical volume of a VG.
type PV struct {
	// Name is the key the VG text uses for it ("pv0"), UUID its uuid.
	Name, UUID string
	// Device is the path lvm last saw it at: a hint only.
	Device  string
	PEStart uint64 // sectors
	PECount uint64
	Status  []string
	Tags    []string
}

// LV is a logical volume, visible or one of lvm's hidden sub-volumes.
type LV struct {
	Name, UUID string
	Status     []string
	Flags      []string
	Tags       []string
	// AllocationPolicy is lvm's allocation_policy ("" for inherit).
	AllocationPolicy string
	Segments         []Segment
	// Origin is the LV this one is a snapshot of (old-style COW snapshot or
	// thin snapshot), Pool the thin pool of a thin volume.
	Origin, Pool string
	// Snapshots are the old-style snapshots of this LV (it is an origin).
	Snapshots []string
}

// Segment is one segmentN section of an LV.
type Segment struct {
	StartExtent, ExtentCount uint64
	Type                     string
	// Areas are the stripes (on PVs) of a striped segment, or the
	// sub-LVs of a mirror or raid segment.
	Areas []SegmentArea
	// Thin-pool segments: the metadata and data sub-LVs; thin segments:
	// the pool and the origin of a thin snapshot; snapshot segments: the
	// origin and the COW LV.
	ThinPool, Origin, CowStore, Metadata, PoolData string
	// ZeroNewBlocks is a thin pool's zeroing.
	ZeroNewBlocks bool
}

// SegmentArea is one area of a segment: a PV or LV and where in it.
type SegmentArea struct {
	Name  string
	Start uint64
}

// Visible reports whether lvs lists the LV without -a.
func (lv *LV) Visible() bool { return slices.Contains(lv.Status, "VISIBLE") }

// Extents is the LV's length in extents.
func (lv *LV) Extents() uint64 {
	var n uint64
	for _, s := range lv.Segments {
		n += s.ExtentCount
	}
	return n
}

// Type is the type of the LV's first segment ("" for none).
func (lv *LV) Type() string {
	if len(lv.Segments) == 0 {
		return ""
	}
	return lv.Segments[0].Type
}

// LV returns the named LV or nil.
func (vg *VG) LV(name string) *LV {
	for i := range vg.LVs {
		if vg.LVs[i].Name == name {
			return &vg.LVs[i]
		}
	}
	return nil
}

// SizeBytes is the LV's size as lvs reports it: its extents times the
// extent size, except that an old-style snapshot reports its origin's size.
func (vg *VG) SizeBytes(lv *LV) uint64 {
	if lv.Origin != "" && lv.Pool == "" {
		if o := vg.LV(lv.Origin); o != nil {
			return o.Extents() * vg.ExtentSize
		}
	}
	return lv.Extents() * vg.ExtentSize
}

// TotalExtents and FreeExtents are the VG's physical extents and those no
// striped segment uses (the segment type that allocates PV space; every
// other type maps sub-LVs that are striped themselves).
func (vg *VG) TotalExtents() uint64 {
	var n uint64
	for _, pv := range vg.PVs {
		n += pv.PECount
	}
	return n
}

// FreeExtents: see TotalExtents.
func (vg *VG) FreeExtents() uint64 {
	used := uint64(0)
	for _, lv := range vg.LVs {
		for _, s := range lv.Segments {
			if s.Type == "striped" {
				used += s.ExtentCount
			}
		}
	}
	total := vg.TotalExtents()
	if used > total {
		return 0
	}
	return total - used
}

// DMUUID is the device-mapper uuid lvm gives an LV's device:
// "LVM-" + the VG's and the LV's uuids without dashes.
func (vg *VG) DMUUID(lv *LV) string {
	return string(vg.AppendDMUUID(make([]byte, 0, 4+len(vg.UUID)+len(lv.UUID)), lv))
}

// AppendDMUUID appends DMUUID(lv) to b: a listing looks each LV's device
// up with one buffer instead of a string per LV.
func (vg *VG) AppendDMUUID(b []byte, lv *LV) []byte {
	b = append(b, "LVM-"...)
	for _, u := range [2]string{vg.UUID, lv.UUID} {
		for i := 0; i < len(u); i++ {
			if u[i] != '-' {
				b = append(b, u[i])
			}
		}
	}
	return b
}

// DMDevice is the name and uuid of the device-mapper device whose state
// is the LV's: its own, or for a thin pool the "-tpool" layer (the pool's
// own device exists only while a thin volume of it is active).
func (vg *VG) DMDevice(lv *LV) (name, uuid string) {
	name, uuid = DMName(vg.Name, lv.Name), vg.DMUUID(lv)
	if lv.Type() == "thin-pool" {
		name, uuid = name+"-tpool", uuid+"-tpool"
	}
	return name, uuid
}

// DMName is the device-mapper name of an LV: "vg-lv" with dashes inside
// either name doubled.
func DMName(vg, lv string) string {
	return strings.ReplaceAll(vg, "-", "--") + "-" + strings.ReplaceAll(lv, "-", "--")
}

// LVMName is "vg/lv" for the device-mapper name LVM gives an LV's device,
// the inverse of DMName (dashes in either name doubled, "-layer" appended
// for internal layers such as a thin pool's "-tpool"), and the name itself
// for other devices.
func LVMName(dmName string) string {
	var parts []string
	var cur []byte
	for i := 0; i < len(dmName); i++ {
		switch {
		case dmName[i] != '-':
			cur = append(cur, dmName[i])
		case i+1 < len(dmName) && dmName[i+1] == '-':
			cur = append(cur, '-')
			i++
		default:
			parts = append(parts, string(cur))
			cur = cur[:0]
		}
	}
	parts = append(parts, string(cur))
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return dmName
	}
	return parts[0] + "/" + parts[1]
}

// maxExtentCount keeps extent arithmetic (count times extent size) far from
// overflow; 2^40 extents is beyond any real VG.
const maxExtentCount = 1 << 40

// ParseVG parses committed VG text. The text holds exactly one section, the
// VG, besides a few top-level assignments (contents, version, description).
func ParseVG(text []byte, lim Limits) (*VG, error) {
	return parseVG(string(text), lim)
}

// parseVG is ParseVG on a text the caller will not change: the VG's
// strings are slices of it.
func parseVG(text string, lim Limits) (*VG, error) {
	// lvm writes well over lvBytes of text per LV, so the VG's LVs fit
	// without regrowing (a copy of every LV each time), and a hostile text
	// gets no more room than its own size.
	b := builder{lvs: make([]LV, 0, len(text)/lvBytes)}
	root, err := parse(text, lim, &b)
	if err != nil {
		return nil, err
	}
	if len(root.Sections) != 1 {
		return nil, corrupt("metadata text", "%d top-level sections, want one VG", len(root.Sections))
	}
	if v, ok := root.Value("version"); ok && (v.Kind != KindInt || v.Int != 1) {
		return nil, fmt.Errorf("%w: text format version %v", ErrUnsupported, v)
	}
	return b.vg(root.Sections[0])
}

// lvBytes is less than the text of any LV lvm writes (its id line alone is
// 47 bytes; a linear LV takes some 330).
const lvBytes = 256

// builder turns sections into a VG. It takes each PV and LV from the
// parser as its section closes (an itemSink); its slabs hold the VG's
// small slices (status, flags and tags lists, segments, areas), a few
// allocations for the whole VG instead of several per LV.
type builder struct {
	pvs   []PV
	lvs   []LV
	strs  slab[string]
	segs  slab[Segment]
	areas slab[SegmentArea]
	// scratch collects one segment's areas.
	scratch []SegmentArea
}

// fields reads one section's typed values, in one pass over its
// assignments with a switch on the name (a lookup per key would compare
// every name again for each), and remembers the first error.
type fields struct {
	s   *Section
	b   *builder
	err error
	// have has bit i set once the i-th key passed to require was seen.
	have uint8
}

func (f *fields) fail(format string, args ...any) {
	if f.err == nil {
		f.err = corrupt("metadata text", "%s: %s", f.s.Name, fmt.Sprintf(format, args...))
	}
}

// require fails for the first of keys whose bit in have is clear.
func (f *fields) require(keys ...string) {
	for i, k := range keys {
		if f.have&(1<<i) == 0 {
			f.fail("%s is missing", k)
		}
	}
}

func (f *fields) str(fl *Field) string {
	if fl.Kind != KindString {
		f.fail("%s is not a string", fl.Name)
	}
	return fl.Str
}

func (f *fields) uint(fl *Field, max uint64) uint64 {
	switch {
	case fl.Kind != KindInt:
		f.fail("%s is not an integer", fl.Name)
	case fl.Int < 0 || uint64(fl.Int) > max:
		f.fail("%s = %d is out of range", fl.Name, fl.Int)
	}
	return uint64(max0(fl.Int))
}

func max0(v int64) int64 {
	if v < 0 {
		return 0
	}
	return v
}

func (f *fields) strs(fl *Field) []string {
	v, ok := fl.strings(&f.b.strs)
	if !ok {
		f.fail("%s is not a list of strings", fl.Name)
	}
	return v
}

func (b *builder) vg(s *Section) (*VG, error) {
	f := &fields{s: s, b: b}
	vg := &VG{Name: s.Name}
	for i := range s.Fields {
		switch fl := &s.Fields[i]; fl.Name {
		case "id":
			vg.UUID, f.have = f.str(fl), f.have|1
		case "seqno":
			vg.Seqno, f.have = f.uint(fl, math.MaxInt64), f.have|2
		case "extent_size":
			vg.ExtentSize, f.have = f.uint(fl, 1<<32)*sectorSize, f.have|4
		case "status":
			vg.Status = f.strs(fl)
		case "flags":
			vg.Flags = f.strs(fl)
		case "tags":
			vg.Tags = f.strs(fl)
		case "lock_type":
			vg.LockType = f.str(fl)
		case "system_id":
			vg.SystemID = f.str(fl)
		}
	}
	f.require("id", "seqno", "extent_size")
	if f.err != nil {
		return nil, f.err
	}
	if vg.ExtentSize == 0 {
		return nil, corrupt("metadata text", "%s: extent_size is 0", s.Name)
	}
	for _, list := range []string{"physical_volumes", "logical_volumes"} {
		if n := countSections(s, list); n > 1 {
			return nil, corrupt("metadata text", "%s: %d %s sections", s.Name, n, list)
		}
	}
	vg.PVs, vg.LVs = b.pvs, b.lvs
	if err := vg.link(); err != nil {
		return nil, err
	}
	return vg, nil
}

func (b *builder) takes(list string) bool {
	return list == "physical_volumes" || list == "logical_volumes"
}

func (b *builder) item(list string, s *Section) error {
	if list == "physical_volumes" {
		pv, err := b.pv(s)
		b.pvs = append(b.pvs, pv)
		return err
	}
	lv, err := b.lv(s)
	b.lvs = append(b.lvs, lv)
	return err
}

func countSections(s *Section, name string) int {
	n := 0
	for _, c := range s.Sections {
		if c.Name == name {
			n++
		}
	}
	return n
}

func (b *builder) pv(s *Section) (PV, error) {
	f := &fields{s: s, b: b}
	pv := PV{Name: s.Name}
	for i := range s.Fields {
		switch fl := &s.Fields[i]; fl.Name {
		case "id":
			pv.UUID, f.have = f.str(fl), f.have|1
		case "pe_start":
			pv.PEStart, f.have = f.uint(fl, math.MaxInt64), f.have|2
		case "pe_count":
			pv.PECount, f.have = f.uint(fl, maxExtentCount), f.have|4
		case "device":
			pv.Device = f.str(fl)
		case "status":
			pv.Status = f.strs(fl)
		case "tags":
			pv.Tags = f.strs(fl)
		}
	}
	f.require("id", "pe_start", "pe_count")
	return pv, f.err
}

func (b *builder) lv(s *Section) (LV, error) {
	f := &fields{s: s, b: b}
	lv := LV{Name: s.Name}
	var n uint64
	for i := range s.Fields {
		switch fl := &s.Fields[i]; fl.Name {
		case "id":
			lv.UUID, f.have = f.str(fl), f.have|1
		case "segment_count":
			n, f.have = f.uint(fl, 1<<20), f.have|2
		case "status":
			lv.Status = f.strs(fl)
		case "flags":
			lv.Flags = f.strs(fl)
		case "tags":
			lv.Tags = f.strs(fl)
		case "allocation_policy":
			lv.AllocationPolicy = f.str(fl)
		}
	}
	f.require("id", "segment_count")
	if f.err != nil {
		return LV{}, f.err
	}
	if n != uint64(len(s.Sections)) {
		return LV{}, corrupt("metadata text", "%s: segment_count %d, %d segment sections", s.Name, n, len(s.Sections))
	}
	lv.Segments = b.segs.take(int(n))
	for i := range lv.Segments {
		// lvm writes them in order; any order is read, but the usual one
		// without a search per segment.
		num := strconv.Itoa(i + 1)
		ss := s.Sections[i]
		if !strings.HasPrefix(ss.Name, "segment") || ss.Name[len("segment"):] != num {
			if ss = s.Section("segment" + num); ss == nil {
				return LV{}, corrupt("metadata text", "%s: segment%s is missing", s.Name, num)
			}
		}
		seg, err := b.segment(ss)
		if err != nil {
			return LV{}, err
		}
		lv.Segments[i] = seg
	}
	var total uint64
	for _, seg := range lv.Segments {
		if seg.StartExtent != total {
			return LV{}, corrupt("metadata text", "%s: segment at extent %d, expected %d", s.Name, seg.StartExtent, total)
		}
		total += seg.ExtentCount
		if total > maxExtentCount {
			return LV{}, corrupt("metadata text", "%s: %d extents", s.Name, total)
		}
	}
	return lv, nil
}

func (b *builder) segment(s *Section) (Segment, error) {
	f := &fields{s: s, b: b}
	var seg Segment
	// The area lists, read in this order: stripes, mirrors, raids.
	var areas [3]*Field
	var stripeCount *Field
	for i := range s.Fields {
		switch fl := &s.Fields[i]; fl.Name {
		case "start_extent":
			seg.StartExtent, f.have = f.uint(fl, maxExtentCount), f.have|1
		case "extent_count":
			seg.ExtentCount, f.have = f.uint(fl, maxExtentCount), f.have|2
		case "type":
			seg.Type, f.have = f.str(fl), f.have|4
		case "thin_pool":
			seg.ThinPool = f.str(fl)
		case "origin":
			seg.Origin = f.str(fl)
		case "cow_store":
			seg.CowStore = f.str(fl)
		case "metadata":
			seg.Metadata = f.str(fl)
		case "pool":
			seg.PoolData = f.str(fl)
		case "zero_new_blocks":
			seg.ZeroNewBlocks = f.uint(fl, 1) == 1
		case "stripe_count":
			stripeCount = fl
		case "stripes":
			areas[0] = fl
		case "mirrors":
			areas[1] = fl
		case "raids":
			areas[2] = fl
		}
	}
	f.require("start_extent", "extent_count", "type")
	b.scratch = b.scratch[:0]
	for _, fl := range areas {
		if fl == nil {
			continue
		}
		if fl.Kind != KindList || len(fl.List)%2 != 0 {
			f.fail("%s is not a list of name, extent pairs", fl.Name)
			break
		}
		for i := 0; i < len(fl.List); i += 2 {
			name, start := fl.List[i], fl.List[i+1]
			if name.Kind != KindString || start.Kind != KindInt || start.Int < 0 {
				f.fail("%s has a bad entry", fl.Name)
				break
			}
			b.scratch = append(b.scratch, SegmentArea{Name: name.Str, Start: uint64(start.Int)})
		}
	}
	seg.Areas = b.areas.copyOf(b.scratch)
	if f.err != nil {
		return Segment{}, f.err
	}
	if seg.Type == "striped" {
		if stripeCount == nil {
			f.fail("stripe_count is missing")
			return Segment{}, f.err
		}
		n := f.uint(stripeCount, 1<<16)
		if f.err == nil && (n == 0 || uint64(len(seg.Areas)) != n || seg.ExtentCount%n != 0) {
			f.fail("stripe_count %d with %d stripes over %d extents", n, len(seg.Areas), seg.ExtentCount)
		}
	}
	return seg, f.err
}

// link fills the relations lvs reports and checks that every name a segment
// refers to exists.
func (vg *VG) link() error {
	names := make(map[string]int, len(vg.LVs))
	for i, lv := range vg.LVs {
		if _, dup := names[lv.Name]; dup {
			return corrupt("metadata text", "LV %s defined twice", lv.Name)
		}
		names[lv.Name] = i
	}
	pvs := make(map[string]bool, len(vg.PVs))
	for _, pv := range vg.PVs {
		pvs[pv.Name] = true
	}
	ref := func(lv, name string) (int, error) {
		i, ok := names[name]
		if !ok {
			return 0, corrupt("metadata text", "LV %s refers to a missing LV %q", lv, name)
		}
		return i, nil
	}
	for i := range vg.LVs {
		lv := &vg.LVs[i]
		for _, seg := range lv.Segments {
			for _, a := range seg.Areas {
				if seg.Type == "striped" && !pvs[a.Name] {
					return corrupt("metadata text", "LV %s has a stripe on a missing PV %q", lv.Name, a.Name)
				}
			}
			switch seg.Type {
			case "thin":
				if _, err := ref(lv.Name, seg.ThinPool); err != nil {
					return err
				}
				lv.Pool = seg.ThinPool
				if seg.Origin != "" {
					if _, err := ref(lv.Name, seg.Origin); err != nil {
						return err
					}
					lv.Origin = seg.Origin
				}
			case "snapshot":
				o, err := ref(lv.Name, seg.Origin)
				if err != nil {
					return err
				}
				c, err := ref(lv.Name, seg.CowStore)
				if err != nil {
					return err
				}
				// The hidden snapshotN LV ties origin and COW together;
				// lvs shows the relation on the COW LV.
				vg.LVs[c].Origin = vg.LVs[o].Name
				vg.LVs[o].Snapshots = append(vg.LVs[o].Snapshots, vg.LVs[c].Name)
			}
		}
	}
	return nil
}
