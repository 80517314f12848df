package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// ownerTag starts the tag lvm-agent puts on each LV it makes, followed by
// its claim's UID (agent.OwnerTagPrefix, docs/PROTOCOL.md): written out
// here as a user's `lvm lvs` shows it.
const ownerTag = "lvm-agent.pvc."

// LV is one LV of the volume group, as `lvm lvs` reports it.
type LV struct {
	Name       string
	Tags       []string
	Size       int64     // bytes
	ExtentSize int64     // bytes
	Extents    []Extents // its physical extents in the LV's order; none for a thin LV
}

// Extents are the physical extents First..Last (inclusive) of one PV.
type Extents struct {
	PV          string
	First, Last int64
}

func (e Extents) String() string { return fmt.Sprintf("%s:%d-%d", e.PV, e.First, e.Last) }

// LVs are the rows of one `lvm lvs`.
type LVs []LV

// Owned are the LVs tagged with the claim's UID.
func (l LVs) Owned(uid string) LVs {
	var owned LVs
	for _, lv := range l {
		if slices.Contains(lv.Tags, ownerTag+uid) {
			owned = append(owned, lv)
		}
	}
	return owned
}

// Named is the LV of that name.
func (l LVs) Named(name string) (LV, bool) {
	i := slices.IndexFunc(l, func(lv LV) bool { return lv.Name == name })
	if i < 0 {
		return LV{}, false
	}
	return l[i], true
}

// lvsArgs: one row per segment, in the JSON report (every value a string),
// sizes in bytes.
func lvsArgs(vg string) []string {
	return []string{"lvs", "--reportformat", "json", "--units", "b", "--nosuffix",
		"-o", "lv_name,lv_size,lv_tags,seg_start_pe,seg_pe_ranges,vg_extent_size", vg}
}

// parseLVs reads lvsArgs' report: an LV's segments are put in its order.
func parseLVs(report []byte) (LVs, error) {
	var r struct {
		Report []struct {
			LV []map[string]string `json:"lv"`
		} `json:"report"`
	}
	if err := json.Unmarshal(report, &r); err != nil {
		return nil, fmt.Errorf("lvs' JSON report: %w", err)
	}
	type segment struct {
		start   int64
		extents []Extents
	}
	var lvs LVs
	segments := map[string][]segment{}
	for _, rep := range r.Report {
		for _, row := range rep.LV {
			name := row["lv_name"]
			start, err1 := strconv.ParseInt(row["seg_start_pe"], 10, 64)
			size, err2 := strconv.ParseInt(row["vg_extent_size"], 10, 64)
			extents, err3 := parseRanges(row["seg_pe_ranges"])
			lvSize, err4 := strconv.ParseInt(row["lv_size"], 10, 64)
			if name == "" || err1 != nil || err2 != nil || err3 != nil || err4 != nil {
				return nil, fmt.Errorf("lvs row %v: lv_name, lv_size, seg_start_pe, vg_extent_size or seg_pe_ranges unreadable", row)
			}
			if _, seen := segments[name]; !seen {
				var tags []string
				if t := row["lv_tags"]; t != "" {
					tags = strings.Split(t, ",")
				}
				lvs = append(lvs, LV{Name: name, Tags: tags, Size: lvSize, ExtentSize: size})
			}
			segments[name] = append(segments[name], segment{start, extents})
		}
	}
	for i := range lvs {
		segs := segments[lvs[i].Name]
		slices.SortFunc(segs, func(a, b segment) int { return int(a.start - b.start) })
		for _, seg := range segs {
			lvs[i].Extents = append(lvs[i].Extents, seg.extents...)
		}
	}
	return lvs, nil
}

// parseRanges reads seg_pe_ranges: "PV:FIRST-LAST" ranges separated by
// spaces ("" for a segment without physical extents, a thin LV's).
func parseRanges(s string) ([]Extents, error) {
	var out []Extents
	for _, r := range strings.Fields(s) {
		i := strings.LastIndexByte(r, ':')
		first, last, ok := strings.Cut(r[i+1:], "-")
		a, err1 := strconv.ParseInt(first, 10, 64)
		b, err2 := strconv.ParseInt(last, 10, 64)
		if i <= 0 || !ok || err1 != nil || err2 != nil || b < a {
			return nil, fmt.Errorf("PE range %q: want PV:FIRST-LAST", r)
		}
		out = append(out, Extents{r[:i], a, b})
	}
	return out, nil
}

// count is the number of extents.
func count(es []Extents) int64 {
	var n int64
	for _, e := range es {
		n += e.Last - e.First + 1
	}
	return n
}

// overlap is the number of physical extents in both a and b.
func overlap(a, b []Extents) int64 {
	var n int64
	for _, x := range a {
		for _, y := range b {
			if x.PV == y.PV {
				n += max(0, min(x.Last, y.Last)-max(x.First, y.First)+1)
			}
		}
	}
	return n
}

// skip drops an LV's first n extents: what is left is its tail.
func skip(es []Extents, n int64) []Extents {
	var out []Extents
	for _, e := range es {
		if size := e.Last - e.First + 1; n >= size {
			n -= size
			continue
		}
		out = append(out, Extents{e.PV, e.First + n, e.Last})
		n = 0
	}
	return out
}

// lvs reads the volume group's LVs on the node.
func (s *Story) lvs(ctx context.Context) (LVs, error) {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "lvm", lvsArgs(s.VG)...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("lvm %s: %w: %s", strings.Join(lvsArgs(s.VG), " "), err, strings.TrimSpace(stderr.String()))
	}
	return parseLVs(out)
}

// LVs reads the volume group's LVs on the node; a failed read ends the story.
func (s *Story) LVs(ctx context.Context) LVs {
	lvs, err := s.lvs(ctx)
	s.Must(err, "reading %s's LVs", s.VG)
	return lvs
}

// ShowLVs prints the LVs as `lvm lvs -o lv_name,seg_pe_ranges,lv_tags` would.
func (s *Story) ShowLVs(lvs LVs) {
	var b bytes.Buffer
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  LV\tPE Ranges\tLV Tags")
	for _, lv := range lvs {
		ranges := make([]string, len(lv.Extents))
		for i, e := range lv.Extents {
			ranges[i] = e.String()
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\n", lv.Name, strings.Join(ranges, " "), strings.Join(lv.Tags, ","))
	}
	_ = w.Flush()
	s.Show("lvm lvs -o lv_name,seg_pe_ranges,lv_tags "+s.VG, b.String())
}

// Lvm runs lvm on the node with these arguments and shows it; a failure
// ends the story.
func (s *Story) Lvm(ctx context.Context, args ...string) { s.Run(ctx, "lvm", args...) }
