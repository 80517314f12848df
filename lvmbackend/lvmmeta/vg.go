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
	return "LVM-" + strings.ReplaceAll(vg.UUID, "-", "") + strings.ReplaceAll(lv.UUID, "-", "")
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
	root, err := ParseText(text, lim)
	if err != nil {
		return nil, err
	}
	if len(root.Sections) != 1 {
		return nil, corrupt("metadata text", "%d top-level sections, want one VG", len(root.Sections))
	}
	if v, ok := root.Values["version"]; ok && (v.Kind != KindInt || v.Int != 1) {
		return nil, fmt.Errorf("%w: text format version %v", ErrUnsupported, v)
	}
	return buildVG(root.Sections[0])
}

// fields reads typed fields of one section and remembers the first error.
type fields struct {
	s   *Section
	err error
}

func (f *fields) fail(format string, args ...any) {
	if f.err == nil {
		f.err = corrupt("metadata text", "%s: %s", f.s.Name, fmt.Sprintf(format, args...))
	}
}

func (f *fields) str(key string, required bool) string {
	v, ok := f.s.String(key)
	if !ok && (required || f.s.Values[key].Kind != 0) {
		f.fail("%s is missing or not a string", key)
	}
	return v
}

func (f *fields) uint(key string, required bool, max uint64) uint64 {
	v, ok := f.s.Int(key)
	switch {
	case !ok && (required || f.s.Values[key].Kind != 0):
		f.fail("%s is missing or not an integer", key)
	case ok && (v < 0 || uint64(v) > max):
		f.fail("%s = %d is out of range", key, v)
	}
	return uint64(max0(v))
}

func max0(v int64) int64 {
	if v < 0 {
		return 0
	}
	return v
}

func (f *fields) strs(key string) []string {
	v, ok := f.s.Strings(key)
	if !ok {
		f.fail("%s is not a list of strings", key)
	}
	return v
}

func buildVG(s *Section) (*VG, error) {
	f := &fields{s: s}
	vg := &VG{
		Name:       s.Name,
		UUID:       f.str("id", true),
		Seqno:      f.uint("seqno", true, math.MaxInt64),
		ExtentSize: f.uint("extent_size", true, 1<<32) * sectorSize,
		Status:     f.strs("status"),
		Flags:      f.strs("flags"),
		Tags:       f.strs("tags"),
		LockType:   f.str("lock_type", false),
		SystemID:   f.str("system_id", false),
	}
	if f.err != nil {
		return nil, f.err
	}
	if vg.ExtentSize == 0 {
		return nil, corrupt("metadata text", "%s: extent_size is 0", s.Name)
	}
	if pvs := s.Section("physical_volumes"); pvs != nil {
		for _, ps := range pvs.Sections {
			pf := &fields{s: ps}
			pv := PV{Name: ps.Name, UUID: pf.str("id", true), Device: pf.str("device", false),
				PEStart: pf.uint("pe_start", true, math.MaxInt64), PECount: pf.uint("pe_count", true, maxExtentCount),
				Status: pf.strs("status"), Tags: pf.strs("tags")}
			if pf.err != nil {
				return nil, pf.err
			}
			vg.PVs = append(vg.PVs, pv)
		}
	}
	if lvs := s.Section("logical_volumes"); lvs != nil {
		for _, ls := range lvs.Sections {
			lv, err := buildLV(ls)
			if err != nil {
				return nil, err
			}
			vg.LVs = append(vg.LVs, lv)
		}
	}
	if err := vg.link(); err != nil {
		return nil, err
	}
	return vg, nil
}

func buildLV(s *Section) (LV, error) {
	f := &fields{s: s}
	lv := LV{Name: s.Name, UUID: f.str("id", true), Status: f.strs("status"), Flags: f.strs("flags"),
		Tags: f.strs("tags"), AllocationPolicy: f.str("allocation_policy", false)}
	n := f.uint("segment_count", true, 1<<20)
	if f.err != nil {
		return LV{}, f.err
	}
	if n != uint64(len(s.Sections)) {
		return LV{}, corrupt("metadata text", "%s: segment_count %d, %d segment sections", s.Name, n, len(s.Sections))
	}
	for i := uint64(1); i <= n; i++ {
		ss := s.Section("segment" + strconv.FormatUint(i, 10))
		if ss == nil {
			return LV{}, corrupt("metadata text", "%s: segment%d is missing", s.Name, i)
		}
		seg, err := buildSegment(ss)
		if err != nil {
			return LV{}, err
		}
		lv.Segments = append(lv.Segments, seg)
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

func buildSegment(s *Section) (Segment, error) {
	f := &fields{s: s}
	seg := Segment{
		StartExtent: f.uint("start_extent", true, maxExtentCount),
		ExtentCount: f.uint("extent_count", true, maxExtentCount),
		Type:        f.str("type", true),
		ThinPool:    f.str("thin_pool", false),
		Origin:      f.str("origin", false),
		CowStore:    f.str("cow_store", false),
		Metadata:    f.str("metadata", false),
		PoolData:    f.str("pool", false),
	}
	seg.ZeroNewBlocks = f.uint("zero_new_blocks", false, 1) == 1
	for _, key := range []string{"stripes", "mirrors", "raids"} {
		v, ok := s.Values[key]
		if !ok {
			continue
		}
		if v.Kind != KindList || len(v.List)%2 != 0 {
			f.fail("%s is not a list of name, extent pairs", key)
			break
		}
		for i := 0; i < len(v.List); i += 2 {
			name, start := v.List[i], v.List[i+1]
			if name.Kind != KindString || start.Kind != KindInt || start.Int < 0 {
				f.fail("%s has a bad entry", key)
				break
			}
			seg.Areas = append(seg.Areas, SegmentArea{Name: name.Str, Start: uint64(start.Int)})
		}
	}
	if f.err != nil {
		return Segment{}, f.err
	}
	if seg.Type == "striped" {
		n := f.uint("stripe_count", true, 1<<16)
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
