package timeline_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lvm-agent/lvm-agent/integration/timeline"
)

// make bench-peers' timeline (lvm-stories timeline) on the lines the bench
// keeps, written here as the watches, containerd, lvmd, the agent and
// kubelet write them: each hop at its time since the operation began, for
// both stacks, the agent's steps placed inside its done line's duration,
// TopoLVM's LV joined to its claim through volume ID, LogicalVolume and PV,
// and the SVG with a bar per hop and stack.
func TestTimeline(t *testing.T) {
	dir := t.TempDir()
	base := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return base.Add(time.Duration(s * float64(time.Second))) }
	epoch := func(s float64) string { return fmt.Sprintf("%.6f", float64(at(s).UnixNano())/1e9) }
	rfc := func(s float64) string { return at(s).Format(time.RFC3339Nano) }
	klog := func(s float64) string { return "I" + at(s).Format("0102 15:04:05.000000") }
	files := map[string]*strings.Builder{}
	add := func(name, format string, args ...any) {
		if files[name] == nil {
			files[name] = &strings.Builder{}
		}
		fmt.Fprintf(files[name], format+"\n", args...)
	}
	// pvc writes the claim's watch line: its fields as the bench's watch
	// prints them, the ones in set (k=v ...) given, the others empty.
	pvc := func(s float64, name, set string) {
		v := map[string]string{"req": "64Mi"}
		for _, kv := range strings.Fields(set) {
			k, val, _ := strings.Cut(kv, "=")
			v[k] = val
		}
		line := epoch(s) + " pvc " + name
		for _, k := range []string{"phase", "del", "req", "node", "state", "pv", "cap", "alloc", "rs"} {
			line += " " + k + "=" + v[k]
		}
		add("watch.log", "%s", line)
	}
	pvcBound := func(s float64, name, set string) {
		pvc(s, name, "phase=Bound node=n1 state=created pv=pv-"+name+" cap=64Mi "+set)
	}
	pod := func(s float64, name, rest string) { add("watch.log", "%s pod %s %s", epoch(s), name, rest) }
	pv := func(s float64, name, rest string) { add("watch.log", "%s pv %s %s", epoch(s), name, rest) }

	// lvm-agent, created at 100 s, deleted at 200 s.
	a := "lvm-agent-r1-1"
	pvc(100, a, "")
	pvc(100.5, a, "node=n1")
	pvc(101, a, "node=n1 state=creating")
	// The agent saw it at 101.2 (queued 0.3 s before its start at 101.5),
	// lvmd's CreateLV from 101.5+0.1+0.05+0.05 = 101.7 to 103.7; done at 104.
	add("logs/lvm-agent.lvm-agent-x.lvm-agent.log", `%s %s 1 agent.go:430] "Volume request done" request="pvc:default/%s" state="created" duration="2.5s" write="50ms" queued="300ms" lvmdList="100ms" checks="50ms" claimCheck="50ms" lvmdCreate="2s" claimCheckAfter="40ms" device="10ms"`,
		rfc(104), klog(104), a)
	pvc(104.1, a, "node=n1 state=created")
	pv(104.4, "pv-"+a, "claim="+a+" phase=Pending del= cap=64Mi state=")
	pvcBound(105, a, "")
	pod(105.5, a, "phase=Pending del= node=n1 nudge=")
	add("logs/kubelet.log", `%s    1234 operation_generator.go:1] "MountVolume.MountDevice succeeded for volume \"pv-%s\"" pod="default/%s"`, klog(107), a, a)
	pod(110, a, "phase=Running del= node=n1 nudge=")
	pvcBound(200, a, "del=2026-12-05T08:03:20Z")
	pv(201, "pv-"+a, "claim="+a+" phase=Released del= cap=64Mi state=")
	pv(201.5, "pv-"+a, "claim="+a+" phase=Released del= cap=64Mi state=deleting")
	add("logs/lvm-agent.lvm-agent-x.lvm-agent.log", `%s %s 1 agent.go:430] "Volume request done" request="pv:pv-%s" state="deleted" duration="1s" write="20ms" queued="100ms" read="200ms" checks="10ms" claimCheck="40ms" lvmdRemove="700ms" deviceCheck="10ms"`,
		rfc(203), klog(203), a)
	pv(203.1, "pv-"+a, "claim="+a+" phase=Released del= cap=64Mi state=deleted")
	pv(203.5, "pv-"+a, "claim="+a+" phase=Released del=2026-12-05T08:03:23Z cap=64Mi state=deleted")
	add("gone.log", "%s gone %s", epoch(202.9), a)

	// TopoLVM, created at 300 s.
	b := "topolvm-r1-1"
	pvc(300, b, "")
	pvc(300.4, b, "node=n1")
	add("watch.log", "%s lv pv-%s del= vid= size=64Mi cur=", epoch(301), b)
	add("logs/topolvm.topolvm-lvmd-0-x.lvmd.log", `%s {"level":"info","ts":"x","msg":"created a new LV","name":"vid-1","size":67108864}`, rfc(302))
	add("watch.log", "%s lv pv-%s del= vid=vid-1 size=64Mi cur=64Mi", epoch(302.5), b)
	pv(303, "pv-"+b, "claim="+b+" phase=Pending del= cap=64Mi state=")
	pvcBound(303.5, b, "")
	pod(304, b, "phase=Pending del= node=n1 nudge=")
	pod(309, b, "phase=Running del= node=n1 nudge=")

	// Grown: lvm-agent's claim raised at 400 s, seen grown in the Pod at 410.
	g := "lvm-agent-r1-g1"
	pvcBound(390, g, "")
	pv(390, "pv-"+g, "claim="+g+" phase=Bound del= cap=64Mi state=created")
	pvcBound(400, g, "req=128Mi")
	pvcBound(400.5, g, "req=128Mi alloc=128Mi rs=ControllerResizeInProgress")
	pv(401, "pv-"+g, "claim="+g+" phase=Bound del= cap=64Mi state=expanding")
	pv(403, "pv-"+g, "claim="+g+" phase=Bound del= cap=64Mi state=expanded")
	pv(403.5, "pv-"+g, "claim="+g+" phase=Bound del= cap=128Mi state=expanded")
	pvcBound(404, g, "req=128Mi alloc=128Mi rs=NodeResizePending")
	pod(404.2, g, "phase=Running del= node=n1 nudge=data=128Mi")
	pvcBound(409, g, "req=128Mi cap=128Mi alloc=128Mi")
	add("grown.log", "%s %s", rfc(410), g)

	for name, content := range files {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content.String()), 0o644))
	}
	logs, err := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	require.NoError(t, err)
	svg := filepath.Join(dir, "timeline.svg")
	args := append([]string{"-svg", svg, "-title", "test",
		filepath.Join(dir, "watch.log"), filepath.Join(dir, "gone.log"), filepath.Join(dir, "grown.log")}, logs...)
	var out, errOut strings.Builder
	require.Equal(t, 0, timeline.Command(args, &out, &errOut), "%s", errOut.String())
	assert.Empty(t, errOut.String())
	report := out.String()
	t.Log(report)

	// hop returns the row's two columns (lvm-agent, TopoLVM) in the section
	// that follows the heading.
	hop := func(section, label string) (string, string) {
		t.Helper()
		i := strings.Index(report, section)
		require.GreaterOrEqual(t, i, 0, "section %q", section)
		m := regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(label) + `\s+(\S+) \(\s*\d+\)\s+(\S+) \(\s*\d+\)$`).FindStringSubmatch(report[i:])
		require.NotNil(t, m, "hop %q in %q", label, section)
		return m[1], m[2]
	}
	for _, c := range []struct {
		section, label string
		agent, topolvm string
	}{
		{"Create:", "node selected (scheduler)", "0.50", "0.40"},
		{"Create:", "request (creating / LogicalVolume made)", "1.00", "1.00"},
		{"Create:", "agent saw the request", "1.20", "n/a"},
		{"Create:", "agent started", "1.50", "n/a"},
		{"Create:", "lvmd CreateLV called", "1.70", "n/a"},
		{"Create:", "lvmd CreateLV returned / LV made", "3.70", "2.00"},
		{"Create:", "answer (created / volumeID)", "4.10", "2.50"},
		{"Create:", "PV made", "4.40", "3.00"},
		{"Create:", "claim Bound", "5.00", "3.50"},
		{"Create:", "volume set up (kubelet)", "7.00", "n/a"},
		{"Create:", "Pod Running", "10.00", "9.00"},
		{"Delete:", "PV Released", "1.00", "n/a"},
		{"Delete:", "request (deleting / LogicalVolume deleted)", "1.50", "n/a"},
		{"Delete:", "lvmd RemoveLV called", "2.25", "n/a"},
		{"Delete:", "lvmd RemoveLV returned / LV removed", "2.95", "n/a"},
		{"Delete:", "answer (deleted)", "3.10", "n/a"},
		{"Delete:", "LV's device gone", "2.90", "n/a"},
		{"Grow:", "resizer took it (allocatedResources)", "0.50", "n/a"},
		{"Grow:", "request (expanding / LogicalVolume size)", "1.00", "n/a"},
		{"Grow:", "PV capacity raised", "3.50", "n/a"},
		{"Grow:", "NodeResizePending", "4.00", "n/a"},
		{"Grow:", "Pod nudged", "4.20", "n/a"},
		{"Grow:", "claim capacity (kubelet's resize)", "9.00", "n/a"},
		{"Grow:", "new size seen in the Pod", "10.00", "n/a"},
	} {
		agent, topolvm := hop(c.section, c.label)
		assert.Equal(t, c.agent, agent, "%s %s: lvm-agent", c.section, c.label)
		assert.Equal(t, c.topolvm, topolvm, "%s %s: TopoLVM", c.section, c.label)
	}
	// The project's own hops of PVC -> Bound: (1.0-0.5) + (1.7-1.0) +
	// (4.1-3.7) + (4.4-4.1) = 1.9 of 5.0 s.
	assert.Contains(t, report, "median of 1: 38.0%  goal <= 20%: MISSED")

	drawn, err := os.ReadFile(svg)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(drawn), "<svg "), "an SVG")
	assert.True(t, strings.HasSuffix(string(drawn), "</svg>\n"), "a whole SVG")
	// A bar per hop each stack has: lvm-agent 12 + 9 + 8, TopoLVM 8.
	assert.Equal(t, 12+9+8, strings.Count(string(drawn), `fill="#1f77b4"><title>`), "lvm-agent's bars")
	assert.Equal(t, 8, strings.Count(string(drawn), `fill="#ff7f0e"><title>`), "TopoLVM's bars")
	// Each bar where the printed medians put it: TopoLVM's LV made, after
	// three hops it does not have, from its request at 1.00 s (59 px a
	// second: lvm-agent's Pod Running at 10 s spans the 590 px).
	printed, err := timeline.ParseReport(strings.NewReader(report))
	require.NoError(t, err)
	assert.Empty(t, barDifferences(t, string(drawn), printed))
	assert.Contains(t, svgBars(t, string(drawn)), drawnBar{op: "create", stack: "TopoLVM", hop: "lvmd CreateLV returned / LV made",
		value: "2.00", x: 359.0, width: 59.0})
}
