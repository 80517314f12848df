package timeline

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

const (
	headingSuffix = ": median seconds since the start (claims)"
	shareHead     = "lvm-agent's own share of PVC -> Bound (the provisioner's and the agent's hops; not lvmd's call,"
	shareLine     = "the scheduler, the PV controller or kubelet), median of %d: %.1f%%  goal <= 20%%: %s"
)

// WriteReport prints the bench's hop tables: for each operation, a row per
// hop either stack has, its median for each stack and over how many claims
// ("n/a" where the stack has none); then lvm-agent's own share of
// PVC -> Bound.
func (r *Result) WriteReport(w io.Writer) error {
	b := &strings.Builder{}
	for _, op := range Ops {
		fmt.Fprintf(b, "\n%s%s\n", op.Title, headingSuffix)
		fmt.Fprintf(b, "  %-44s %12s %12s\n", "hop", LVMAgent, TopoLVM)
		for i, h := range op.Hops {
			m := r.Medians[op.Name][i]
			if m[LVMAgent] == nil && m[TopoLVM] == nil {
				continue
			}
			fmt.Fprintf(b, "%s\n", strings.TrimRight(fmt.Sprintf("  %-44s %s %s", h.Label, column(m[LVMAgent]), column(m[TopoLVM])), " "))
		}
	}
	if r.Share != nil {
		met := "MISSED"
		if r.Share.Median <= ShareGoal {
			met = "met"
		}
		fmt.Fprintf(b, "\n%s\n"+shareLine+"\n", shareHead, r.Share.Claims, 100*r.Share.Median, met)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// column: "    0.66 ( 6)"; "     n/a ( 0)"; a median read without its count
// has none.
func column(m *Median) string {
	switch {
	case m == nil:
		return fmt.Sprintf("%8s (%2d)", "n/a", 0)
	case m.Claims == 0:
		return fmt.Sprintf("%8.2f     ", m.Seconds)
	}
	return fmt.Sprintf("%8.2f (%2d)", m.Seconds, m.Claims)
}

var (
	reportRow   = regexp.MustCompile(`^\s+(n/a|-?[0-9]+\.[0-9]+)(?:\s*\(\s*([0-9]+)\))?\s+(n/a|-?[0-9]+\.[0-9]+)(?:\s*\(\s*([0-9]+)\))?\s*$`)
	reportShare = regexp.MustCompile(`^the scheduler, the PV controller or kubelet\), median of ([0-9]+): (-?[0-9.]+)%`)
)

// ParseReport reads the medians back from the hop tables WriteReport
// printed (the bench's report.txt, whole or in part): a picture of a run
// whose records are gone is drawn from its report. A row's counts may be
// left out. Lines outside the tables are skipped.
func ParseReport(in io.Reader) (*Result, error) {
	res := newResult()
	var op *Op
	tables := 0
	sc := bufio.NewScanner(in)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		if title, ok := strings.CutSuffix(l, headingSuffix); ok {
			op = nil
			for i := range Ops {
				if Ops[i].Title == title {
					op = &Ops[i]
				}
			}
			if op == nil {
				return nil, fmt.Errorf("line %d: no operation titled %q", n, title)
			}
			tables++
			continue
		}
		if m := reportShare.FindStringSubmatch(l); m != nil {
			claims, _ := strconv.Atoi(m[1])
			pct, err := strconv.ParseFloat(m[2], 64)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
			res.Share = &Share{Claims: claims, Median: pct / 100}
			continue
		}
		if op == nil {
			continue
		}
		if !strings.HasPrefix(l, "  ") {
			op = nil // the table ends
			continue
		}
		if strings.HasPrefix(l, "  hop ") {
			continue
		}
		i, rest := hopOf(op, l[2:])
		if i < 0 {
			return nil, fmt.Errorf("line %d: no hop of %s in %q", n, op.Name, l)
		}
		m := reportRow.FindStringSubmatch(rest)
		if m == nil {
			return nil, fmt.Errorf("line %d: %s %q: not two columns of medians: %q", n, op.Name, op.Hops[i].Label, rest)
		}
		row := &res.Medians[op.Name][i]
		if row[LVMAgent] != nil || row[TopoLVM] != nil {
			return nil, fmt.Errorf("line %d: %s %q a second time", n, op.Name, op.Hops[i].Label)
		}
		for s, col := range [][2]string{{m[1], m[2]}, {m[3], m[4]}} {
			if col[0] == "n/a" {
				continue
			}
			x, err := strconv.ParseFloat(col[0], 64)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
			c, _ := strconv.Atoi(col[1]) // "" (left out): 0, not known
			row[s] = &Median{Seconds: x, Claims: c}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if tables == 0 {
		return nil, fmt.Errorf("no hop table (a line ending %q)", headingSuffix)
	}
	return res, nil
}

// hopOf is the hop of op whose label starts the row (the longest that
// does), and the rest of the row; -1 when none does.
func hopOf(op *Op, row string) (int, string) {
	best := -1
	for i, h := range op.Hops {
		if rest, ok := strings.CutPrefix(row, h.Label); ok && (rest == "" || rest[0] == ' ') &&
			(best < 0 || len(h.Label) > len(op.Hops[best].Label)) {
			best = i
		}
	}
	if best < 0 {
		return -1, ""
	}
	return best, row[len(op.Hops[best].Label):]
}
