package timeline

import (
	"fmt"
	"io"
	"strings"
)

// Bar is one stack's bar in one hop's row: from the end of the previous hop
// that stack has (0 for its first) to this hop's median. A hop that ends
// before the one above it (the LV's device gone before its PV) is a mark at
// its end.
type Bar struct {
	Hop        int // in the op's Hops
	Stack      Stack
	Start, End float64
}

// Bars are op's bars, row by row, lvm-agent's before TopoLVM's in a row.
// Only a hop the stack has a median of is a bar, and only such a hop ends
// where the stack's next bar starts.
func (r *Result) Bars(op string) []Bar {
	var bars []Bar
	var prev [2]float64
	for i, row := range r.Medians[op] {
		for _, s := range Stacks {
			m := row[s]
			if m == nil {
				continue
			}
			bars = append(bars, Bar{Hop: i, Stack: s, Start: min(prev[s], m.Seconds), End: m.Seconds})
			prev[s] = m.Seconds
		}
	}
	return bars
}

// The picture's geometry: its width, the labels' column, the room right of
// the longest bar for its number; a row per hop.
const (
	svgWidth = 980
	svgLeft  = 300
	svgRight = 90
	rowStep  = 26
)

var barColour = [2]string{"#1f77b4", "#ff7f0e"}

// WriteSVG draws the timeline: per operation a row per hop either stack
// has, in each row lvm-agent's bar (blue) above TopoLVM's (orange), its end
// written beside it. Each operation has its own scale: its longest median
// spans the width.
func (r *Result) WriteSVG(w io.Writer, title string) error {
	b := &strings.Builder{}
	rows := map[string]int{}
	h := 0
	for _, op := range Ops {
		for _, row := range r.Medians[op.Name] {
			if row[LVMAgent] != nil || row[TopoLVM] != nil {
				rows[op.Name]++
			}
		}
		h += 60 + rows[op.Name]*rowStep
	}
	L := svgLeft
	fmt.Fprintf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", svgWidth, h+50)
	fmt.Fprintf(b, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n")
	fmt.Fprintf(b, "<text x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">%s</text>\n", esc(title))
	fmt.Fprintf(b, "<rect x=\"%d\" y=\"30\" width=\"12\" height=\"8\" fill=\"%s\"/><text x=\"%d\" y=\"38\">%s</text>\n", L, barColour[LVMAgent], L+16, LVMAgent)
	fmt.Fprintf(b, "<rect x=\"%d\" y=\"30\" width=\"12\" height=\"8\" fill=\"%s\"/><text x=\"%d\" y=\"38\">%s</text>\n", L+100, barColour[TopoLVM], L+116, TopoLVM)
	fmt.Fprintf(b, "<text x=\"%d\" y=\"38\" fill=\"#555\">bar: from the hop before to this one; medians, seconds since the start</text>\n", L+200)
	y := 60
	for _, op := range Ops {
		longest := 0.0
		for _, row := range r.Medians[op.Name] {
			for _, m := range row {
				if m != nil && m.Seconds > longest {
					longest = m.Seconds
				}
			}
		}
		if longest <= 0 {
			longest = 1
		}
		px := float64(svgWidth-L-svgRight) / longest
		fmt.Fprintf(b, "<text x=\"10\" y=\"%d\" font-size=\"13\" font-weight=\"bold\">%s</text>\n", y+14, esc(op.Title))
		fmt.Fprintf(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#ccc\"/>\n", L, y+20, L, y+20+rowStep*rows[op.Name])
		y += 24
		bars := r.Bars(op.Name)
		for i, hop := range op.Hops {
			var inRow []Bar
			for _, bar := range bars {
				if bar.Hop == i {
					inRow = append(inRow, bar)
				}
			}
			if len(inRow) == 0 {
				continue
			}
			fmt.Fprintf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>\n", L-8, y+15, esc(hop.Label))
			for _, bar := range inRow {
				x0 := float64(L) + bar.Start*px
				width := max((bar.End-bar.Start)*px, 2)
				dy := int(bar.Stack) * 11
				fmt.Fprintf(b, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"10\" fill=\"%s\"><title>%s %s: %.2f s</title></rect>\n",
					x0, y+2+dy, width, barColour[bar.Stack], bar.Stack, esc(hop.Label), bar.End)
				fmt.Fprintf(b, "<text x=\"%.1f\" y=\"%d\" font-size=\"10\" fill=\"#333\">%.2f</text>\n", x0+width+4, y+11+dy, bar.End)
			}
			y += rowStep
		}
		y += 16
	}
	fmt.Fprintf(b, "</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

var escaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")

func esc(s string) string { return escaper.Replace(s) }
