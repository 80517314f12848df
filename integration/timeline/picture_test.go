package timeline_test

import (
	"bytes"
	"flag"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lvm-agent/lvm-agent/integration/timeline"
)

var update = flag.Bool("update", false, "draw docs/bench-peers-timeline.svg again from testdata/bench-peers-run21.txt")

// The committed picture, the run it is of, and that run's title.
const (
	committedSVG    = "../../docs/bench-peers-timeline.svg"
	committedReport = "testdata/bench-peers-run21.txt"
	committedTitle  = "make bench-peers: where the seconds go, one volume at a time (3 x 2 rounds, 64Mi ext4)"
)

func committedMedians(t *testing.T) *timeline.Result {
	t.Helper()
	f, err := os.Open(committedReport)
	require.NoError(t, err)
	defer f.Close()
	res, err := timeline.ParseReport(f)
	require.NoError(t, err)
	return res
}

// The committed picture is the one its run's medians draw, byte for byte
// (go test ./integration/timeline -update draws it).
func TestCommittedPictureIsDrawnFromItsRun(t *testing.T) {
	b := &bytes.Buffer{}
	require.NoError(t, committedMedians(t).WriteSVG(b, committedTitle))
	if *update {
		require.NoError(t, os.WriteFile(committedSVG, b.Bytes(), 0o644))
	}
	committed, err := os.ReadFile(committedSVG)
	require.NoError(t, err)
	assert.Equal(t, b.String(), string(committed), "docs/bench-peers-timeline.svg is not its run's medians drawn: go test ./integration/timeline -update")
}

// The command draws a report's medians as the tests do; without records
// or a report it says how it is used.
func TestCommandDrawsAReport(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "timeline.svg")
	var out, errOut strings.Builder
	require.Equal(t, 0, timeline.Command([]string{"-medians", committedReport, "-svg", svg, "-title", committedTitle}, &out, &errOut), "%s", errOut.String())
	drawn, err := os.ReadFile(svg)
	require.NoError(t, err)
	committed, err := os.ReadFile(committedSVG)
	require.NoError(t, err)
	assert.Equal(t, string(committed), string(drawn))
	assert.Contains(t, out.String(), "  lvmd RemoveLV returned / LV removed              5.66          5.13\n", "the report printed again, without counts")

	for _, args := range [][]string{nil, {"-svg", svg}, {"-medians", committedReport, "watch.log"}, {"-nope"}} {
		errOut.Reset()
		assert.Equal(t, 2, timeline.Command(args, &out, &errOut), "%q", args)
		assert.Contains(t, errOut.String(), "usage: lvm-stories timeline", "%q", args)
	}
	errOut.Reset()
	assert.Equal(t, 1, timeline.Command([]string{"-medians", filepath.Join(t.TempDir(), "none")}, &out, &errOut))
	assert.Contains(t, errOut.String(), "no such file")
}

// Every bar of the committed picture starts where its stack's previous hop
// ends and ends at its hop's median, and a hop a stack does not have is no
// bar: checked from the picture's own numbers, not by drawing it again.
func TestCommittedPictureBarsAreTheMedians(t *testing.T) {
	committed, err := os.ReadFile(committedSVG)
	require.NoError(t, err)
	res := committedMedians(t)
	bars := svgBars(t, string(committed))
	assert.Len(t, bars, 12+9+12+9+5+8, "a bar per hop each stack has: lvm-agent's 12, 9 and 12, TopoLVM's 9, 5 and 8")
	assert.Empty(t, barDifferences(t, string(committed), res))
}

// A stack's bar starts where the previous hop *it has* ends: the hops it
// lacks (no median) are no bars and move no start, whichever stack lacks
// them, and a row neither stack has is left out.
func TestMissingHops(t *testing.T) {
	res, err := timeline.ParseReport(strings.NewReader(`
Create: PVC seen -> Pod Running: median seconds since the start (claims)
  hop                                             lvm-agent      TopoLVM
  node selected (scheduler)                        0.50 ( 3)     0.40 ( 2)
  request (creating / LogicalVolume made)          1.00 ( 3)     1.00 ( 2)
  agent saw the request                            1.20 ( 3)      n/a ( 0)
  lvmd CreateLV returned / LV made                 3.70 ( 3)     2.00 ( 2)
  PV made                                          4.40 ( 3)      n/a ( 0)
  claim Bound                                      5.00 ( 3)     3.50 ( 2)
  volume set up (kubelet)                           n/a ( 0)     7.00 ( 1)
  Pod Running                                     10.00 ( 3)     9.00 ( 2)

Delete: PVC and Pod deleted -> LV gone: median seconds since the start (claims)
  hop                                             lvm-agent      TopoLVM
  PV deleted                                       5.98 ( 3)      n/a ( 0)
  LV's device gone                                 5.60 ( 3)     5.12 ( 2)
`))
	require.NoError(t, err)
	type span struct {
		stack      timeline.Stack
		hop        string
		start, end float64
	}
	spans := func(op timeline.Op) []span {
		var out []span
		for _, b := range res.Bars(op.Name) {
			out = append(out, span{b.Stack, op.Hops[b.Hop].Label, b.Start, b.End})
		}
		return out
	}
	a, b := timeline.LVMAgent, timeline.TopoLVM
	assert.Equal(t, []span{
		{a, "node selected (scheduler)", 0, 0.5}, {b, "node selected (scheduler)", 0, 0.4},
		{a, "request (creating / LogicalVolume made)", 0.5, 1}, {b, "request (creating / LogicalVolume made)", 0.4, 1},
		{a, "agent saw the request", 1, 1.2},
		{a, "lvmd CreateLV returned / LV made", 1.2, 3.7}, {b, "lvmd CreateLV returned / LV made", 1, 2},
		{a, "PV made", 3.7, 4.4},
		{a, "claim Bound", 4.4, 5}, {b, "claim Bound", 2, 3.5},
		{b, "volume set up (kubelet)", 3.5, 7},
		{a, "Pod Running", 5, 10}, {b, "Pod Running", 7, 9},
	}, spans(timeline.Ops[0]))
	// The device gone before the PV: a mark at its end. TopoLVM's first bar
	// of the delete starts at 0.
	assert.Equal(t, []span{{a, "PV deleted", 0, 5.98}, {a, "LV's device gone", 5.6, 5.6}, {b, "LV's device gone", 0, 5.12}},
		spans(timeline.Ops[1]))
	assert.Empty(t, res.Bars("grow"))

	svg := &bytes.Buffer{}
	require.NoError(t, res.WriteSVG(svg, "missing hops"))
	assert.Empty(t, barDifferences(t, svg.String(), res))
	bars := svgBars(t, svg.String())
	assert.Len(t, bars, 13+3)
	assert.Contains(t, bars, drawnBar{op: "create", stack: "TopoLVM", hop: "lvmd CreateLV returned / LV made", value: "2.00", x: 359.0, width: 59.0},
		"from TopoLVM's request at 1 s (59 px a second)")
	assert.Contains(t, bars, drawnBar{op: "create", stack: "TopoLVM", hop: "volume set up (kubelet)", value: "7.00", x: 506.5, width: 206.5},
		"from TopoLVM's claim Bound at 3.5 s")
	assert.Contains(t, bars, drawnBar{op: "create", stack: "lvm-agent", hop: "Pod Running", value: "10.00", x: 595.0, width: 295.0},
		"from lvm-agent's claim Bound at 5 s")
	for _, hop := range []string{"agent started", "lvmd CreateLV called", "answer (created / volumeID)", "Pod bound to the node"} {
		assert.NotContains(t, svg.String(), ">"+hop+"<", "a row neither stack has")
	}
}

// The hop tables read back as printed: with their counts (a run's report)
// or without (the committed run's).
func TestReportReadsBack(t *testing.T) {
	for _, res := range []*timeline.Result{committedMedians(t), scenarioResult(t)} {
		printed := &bytes.Buffer{}
		require.NoError(t, res.WriteReport(printed))
		again, err := timeline.ParseReport(bytes.NewReader(printed.Bytes()))
		require.NoError(t, err, "%s", printed)
		assert.Equal(t, res, again, "%s", printed)
	}
	for _, c := range []struct{ name, report, err string }{
		{"no table", "seconds unless said\n", "no hop table"},
		{"an unknown hop", "Delete: PVC and Pod deleted -> LV gone: median seconds since the start (claims)\n  PV gone   1.00 ( 1)  n/a ( 0)\n", "no hop of delete"},
		{"a row twice", "Delete: PVC and Pod deleted -> LV gone: median seconds since the start (claims)\n  PV Released   1.00 ( 1)  n/a ( 0)\n  PV Released   1.00 ( 1)  n/a ( 0)\n", "a second time"},
		{"one column", "Delete: PVC and Pod deleted -> LV gone: median seconds since the start (claims)\n  PV Released   1.00 ( 1)\n", "not two columns"},
	} {
		_, err := timeline.ParseReport(strings.NewReader(c.report))
		assert.ErrorContains(t, err, c.err, c.name)
	}
}

// scenarioResult: a result with counts and a share, as a run prints it.
func scenarioResult(t *testing.T) *timeline.Result {
	t.Helper()
	res, err := timeline.ParseReport(strings.NewReader(`
Create: PVC seen -> Pod Running: median seconds since the start (claims)
  hop                                             lvm-agent      TopoLVM
  node selected (scheduler)                        0.50 ( 6)     0.40 ( 6)
  Pod Running                                     10.00 ( 6)     9.00 ( 5)

Grow: request raised -> new size seen in the Pod: median seconds since the start (claims)
  hop                                             lvm-agent      TopoLVM
  lvmd ResizeLV returned                           4.71 ( 4)      n/a ( 0)

lvm-agent's own share of PVC -> Bound (the provisioner's and the agent's hops; not lvmd's call,
the scheduler, the PV controller or kubelet), median of 6: 30.3%  goal <= 20%: MISSED
`))
	require.NoError(t, err)
	require.NotNil(t, res.Share)
	assert.Equal(t, timeline.Share{Claims: 6, Median: 0.303}, *res.Share)
	return res
}

// drawnBar is a bar as the picture draws it.
type drawnBar struct {
	op, stack, hop string
	value          string // written in its title
	x, width       float64
}

var (
	svgSection = regexp.MustCompile(`^<text x="10" y="\d+" font-size="13" font-weight="bold">([^<]*)</text>$`)
	svgBar     = regexp.MustCompile(`^<rect x="([0-9.]+)" y="\d+" width="([0-9.]+)" height="10" fill="#[0-9a-f]+"><title>(lvm-agent|TopoLVM) ([^<]*): (-?[0-9.]+) s</title></rect>$`)
)

// svgBars are the picture's bars, each in its operation's section.
func svgBars(t *testing.T, svg string) []drawnBar {
	t.Helper()
	var bars []drawnBar
	op := ""
	for _, l := range strings.Split(svg, "\n") {
		if m := svgSection.FindStringSubmatch(l); m != nil {
			op = ""
			for _, o := range timeline.Ops {
				if o.Title == html.UnescapeString(m[1]) {
					op = o.Name
				}
			}
			require.NotEmpty(t, op, "a section of no operation: %s", l)
			continue
		}
		if m := svgBar.FindStringSubmatch(l); m != nil {
			require.NotEmpty(t, op, "a bar before any section: %s", l)
			x, err := strconv.ParseFloat(m[1], 64)
			require.NoError(t, err)
			w, err := strconv.ParseFloat(m[2], 64)
			require.NoError(t, err)
			bars = append(bars, drawnBar{op: op, stack: m[3], hop: html.UnescapeString(m[4]), value: m[5], x: x, width: w})
		}
	}
	return bars
}

// barDifferences is every bar of the picture that is not where res's
// medians put it, and every bar they have that it lacks. The geometry is
// the picture's: bars from x=300 to 890 px, each operation's longest median
// spanning the 590 px, a bar at least 2 px wide. A bar's start and end may
// differ from the medians by 0.01 s: a picture drawn in a run, from medians
// not yet rounded to the report's 0.01 s, is compared with the rounded ones.
func barDifferences(t *testing.T, svg string, res *timeline.Result) []string {
	t.Helper()
	type key struct{ op, stack, hop string }
	want := map[key][2]float64{} // start, end
	longest := map[string]float64{}
	for _, op := range timeline.Ops {
		for _, s := range timeline.Stacks {
			prev := 0.0
			for i, hop := range op.Hops {
				m := res.Medians[op.Name][i][s]
				if m == nil {
					continue
				}
				want[key{op.Name, s.String(), hop.Label}] = [2]float64{math.Min(prev, m.Seconds), m.Seconds}
				prev = m.Seconds
				longest[op.Name] = math.Max(longest[op.Name], m.Seconds)
			}
		}
	}
	var diffs []string
	seen := map[key]bool{}
	for _, b := range svgBars(t, svg) {
		k := key{b.op, b.stack, b.hop}
		se, ok := want[k]
		if !ok {
			diffs = append(diffs, fmt.Sprintf("%s %s %q: drawn (%s s), but the stack has no such hop", b.op, b.stack, b.hop, b.value))
			continue
		}
		if seen[k] {
			diffs = append(diffs, fmt.Sprintf("%s %s %q: drawn twice", b.op, b.stack, b.hop))
			continue
		}
		seen[k] = true
		px := 590 / longest[b.op]
		start, end := (b.x-300)/px, (b.x-300+b.width)/px
		const tolerance = 0.01 // seconds
		placed := math.Abs(start-se[0]) <= tolerance
		if b.width > 2.05 {
			placed = placed && math.Abs(end-se[1]) <= tolerance
		} else { // the narrowest bar: a hop that ends soon after the one before, or before it
			placed = placed && b.width >= 1.95 && (se[1]-se[0])*px <= 2+tolerance*px
		}
		if b.value != fmt.Sprintf("%.2f", se[1]) || !placed {
			diffs = append(diffs, fmt.Sprintf("%s %s %q: drawn from %.2f to %.2f s (title %s), the medians say %.2f to %.2f s",
				b.op, b.stack, b.hop, start, end, b.value, se[0], se[1]))
		}
	}
	for k, se := range want {
		if !seen[k] {
			diffs = append(diffs, fmt.Sprintf("%s %s %q: not drawn; the medians say %.2f to %.2f s", k.op, k.stack, k.hop, se[0], se[1]))
		}
	}
	return diffs
}
