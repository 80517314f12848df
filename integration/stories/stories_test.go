package main

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An lvs report of lvsArgs' shape: a thick LV in two segments (listed out
// of order), a thin one, the pool and an LV without tags.
const lvsReport = `  {
      "report": [
          {
              "lv": [
                  {"lv_name":"lv-b", "lv_size":"33554432", "lv_tags":"lvm-agent.pvc.u2,other", "seg_start_pe":"4", "seg_pe_ranges":"/dev/vda:100-103", "vg_extent_size":"4194304"},
                  {"lv_name":"lv-b", "lv_size":"33554432", "lv_tags":"lvm-agent.pvc.u2,other", "seg_start_pe":"0", "seg_pe_ranges":"/dev/vda:10-13", "vg_extent_size":"4194304"},
                  {"lv_name":"pool0", "lv_size":"268435456", "lv_tags":"", "seg_start_pe":"0", "seg_pe_ranges":"pool0_tdata:0-255", "vg_extent_size":"4194304"},
                  {"lv_name":"thin-1", "lv_size":"16777216", "lv_tags":"lvm-agent.pvc.u3", "seg_start_pe":"0", "seg_pe_ranges":"", "vg_extent_size":"4194304"},
                  {"lv_name":"lv-a", "lv_size":"67108864", "lv_tags":"lvm-agent.pvc.u1", "seg_start_pe":"0", "seg_pe_ranges":"/dev/vda:0-15", "vg_extent_size":"4194304"}
              ]
          }
      ]
  }
`

func TestParseLVs(t *testing.T) {
	lvs, err := parseLVs([]byte(lvsReport))
	require.NoError(t, err)
	require.Len(t, lvs, 4)
	b, ok := lvs.Named("lv-b")
	require.True(t, ok)
	assert.Equal(t, LV{Name: "lv-b", Tags: []string{"lvm-agent.pvc.u2", "other"}, Size: 32 << 20, ExtentSize: 4 << 20,
		Extents: []Extents{{"/dev/vda", 10, 13}, {"/dev/vda", 100, 103}}}, b, "segments in the LV's order")
	thin := lvs.Owned("u3")
	require.Len(t, thin, 1)
	assert.Equal(t, "thin-1", thin[0].Name)
	assert.Empty(t, thin[0].Extents)
	pool, _ := lvs.Named("pool0")
	assert.Nil(t, pool.Tags)
	assert.Empty(t, lvs.Owned("u"), "a tag's UID whole, not its prefix")
	_, ok = lvs.Named("gone")
	assert.False(t, ok)

	for _, bad := range []string{`not json`, `{"report":[{"lv":[{"lv_name":"x","lv_size":"4194304","seg_start_pe":"0","vg_extent_size":"4194304","seg_pe_ranges":"/dev/vda:5"}]}]}`,
		`{"report":[{"lv":[{"lv_name":"x","lv_size":"4194304","seg_start_pe":"","vg_extent_size":"4194304","seg_pe_ranges":""}]}]}`,
		`{"report":[{"lv":[{"lv_name":"x","lv_size":"","seg_start_pe":"0","vg_extent_size":"4194304","seg_pe_ranges":""}]}]}`} {
		_, err := parseLVs([]byte(bad))
		assert.Error(t, err, bad)
	}
}

func TestParseRanges(t *testing.T) {
	es, err := parseRanges("/dev/vda:0-3 /dev/vdb:7-7")
	require.NoError(t, err)
	assert.Equal(t, []Extents{{"/dev/vda", 0, 3}, {"/dev/vdb", 7, 7}}, es)
	es, err = parseRanges("")
	require.NoError(t, err)
	assert.Empty(t, es)
	for _, bad := range []string{"/dev/vda", ":1-2", "/dev/vda:3-1", "/dev/vda:a-2", "/dev/vda:1"} {
		_, err := parseRanges(bad)
		assert.Error(t, err, bad)
	}
}

func TestExtents(t *testing.T) {
	old := []Extents{{"/dev/vda", 10, 25}}
	for _, c := range []struct {
		name string
		now  []Extents
		want int64
	}{
		{"the same", []Extents{{"/dev/vda", 10, 25}}, 16},
		{"across its end", []Extents{{"/dev/vda", 20, 35}}, 6},
		{"two segments", []Extents{{"/dev/vda", 0, 10}, {"/dev/vda", 25, 40}}, 2},
		{"beside it", []Extents{{"/dev/vda", 26, 41}}, 0},
		{"another PV", []Extents{{"/dev/vdb", 10, 25}}, 0},
		{"thin", nil, 0},
	} {
		assert.Equal(t, c.want, overlap(old, c.now), c.name)
		assert.Equal(t, c.want, overlap(c.now, old), c.name)
	}
	lv := []Extents{{"/dev/vda", 10, 13}, {"/dev/vda", 100, 111}}
	assert.Equal(t, int64(16), count(lv))
	assert.Equal(t, lv, skip(lv, 0))
	assert.Equal(t, []Extents{{"/dev/vda", 12, 13}, {"/dev/vda", 100, 111}}, skip(lv, 2))
	assert.Equal(t, []Extents{{"/dev/vda", 100, 111}}, skip(lv, 4))
	assert.Equal(t, []Extents{{"/dev/vda", 104, 111}}, skip(lv, 8), "a 64 MiB clone's tail beyond 32 MiB")
	assert.Empty(t, skip(lv, 16))
}

func TestCountMarkers(t *testing.T) {
	m := []byte(marker)
	mib := 1 << 20
	zeros := func(n int) []byte { return make([]byte, n) }
	for _, c := range []struct {
		name string
		data []byte
		want int64
	}{
		{"empty", nil, 0},
		{"zeros", zeros(3 * mib), 0},
		{"a fill", bytes.Repeat(m, 3*mib/len(m)), int64(3 * mib / len(m))},
		{"one across the first chunk's end", append(append(zeros(mib-5), m...), zeros(100)...), 1},
		{"one ending the first chunk", append(zeros(mib-len(m)), m...), 1},
		{"one starting the second chunk", append(append(zeros(mib), m...), zeros(3)...), 1},
		{"unaligned, among other bytes", []byte("x" + marker + "LVM-AGENT-WIPE!" + marker + marker[:8]), 2},
		{"a cut marker", append(zeros(mib-3), m[:len(m)-1]...), 0},
	} {
		n, size, err := countMarkers(bytes.NewReader(c.data), m)
		require.NoError(t, err, c.name)
		assert.Equal(t, c.want, n, c.name)
		assert.Equal(t, int64(len(c.data)), size, c.name)
	}
}

func TestScriptsAndCounts(t *testing.T) {
	// What countScript's Pod prints (busybox dd's "records in").
	out := "head: lvm-agent clone source\ndevice: 0 markers, read 64+0 blocks of 1 MiB\ntail: 12 markers, read 31+1 blocks of 1 MiB\n"
	assert.Equal(t, map[string]podCount{"device": {0, 64}, "tail": {12, 32}}, parseCounts(out))
	assert.Empty(t, parseCounts("device: markers, read blocks\n"))
	assert.Len(t, marker, 16, "a MiB holds a whole number of markers")
	assert.Contains(t, fillScript, "'"+markerLine+"'")
	s := countScript("tail", 32)
	assert.Contains(t, s, "skip=32 ")
	assert.Contains(t, s, `echo "tail: $n markers`)
	assert.False(t, strings.Contains(markerLine, "'"), "quoted in the scripts")
}

func TestSpread(t *testing.T) {
	assert.Equal(t, "none", spread(nil))
	assert.Equal(t, "1 3 9", spread([]float64{9, 1, 3}))
	assert.Equal(t, "1 4 9", spread([]float64{9, 1, 3, 4}), "an even count: the upper middle value")
}

func TestAuditRow(t *testing.T) {
	assert.True(t, Audit{}.Zero())
	a := Audit{Lost: 1, Orphan: 2, Foreign: 1}
	assert.False(t, a.Zero())
	assert.Equal(t, "1 0 2 0 0 1", a.String(), "lost duplicated orphaned open failed foreign")
}

func TestHasArg(t *testing.T) {
	cmdline := []byte("/lvm-agent\x00--lvmd-socket=/run/lvmd.sock\x00--v=2\x00")
	assert.True(t, hasArg(cmdline, "--lvmd-socket="))
	assert.False(t, hasArg(cmdline, "--lvmd-socket=/other"))
	assert.False(t, hasArg([]byte("/lvm-agent\x00provisioner\x00"), "--lvmd-socket="), "the provisioner runs the same binary")
}

func TestDDSeconds(t *testing.T) {
	for out, want := range map[string]float64{
		"64+0 records in\n64+0 records out\nreal\t0m 2.25s\nuser\t0m 0.00s\nsys\t0m 0.51s\n": 2.25,
		"real\t1m 3.50s\n": 63.5,
	} {
		got, ok := ddSeconds(out)
		if !ok || got != want {
			t.Errorf("ddSeconds(%q) = %v, %v; want %v", out, got, ok, want)
		}
	}
	if _, ok := ddSeconds("64+0 records out\n"); ok {
		t.Error("no time line: not ok")
	}
}

// nodeProcs finds a process by its executable and an argument; kill9
// kills what it finds.
func TestNodeProcsAndKill9(t *testing.T) {
	cmd := exec.Command("sleep", "30017.5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	// Start returns before the child has exec'd sleep: its comm is ours until then.
	var got []int
	for i := 0; i < 200 && len(got) == 0; i++ {
		time.Sleep(10 * time.Millisecond)
		got = nodeProcs("sleep", "30017.5")
	}
	if len(got) != 1 || got[0] != cmd.Process.Pid {
		t.Fatalf("nodeProcs = %v, want [%d]", got, cmd.Process.Pid)
	}
	if got := nodeProcs("sleep", "--no-such-arg"); len(got) != 0 {
		t.Fatalf("nodeProcs with another argument = %v, want none", got)
	}
	if n := kill9("sleep", "30017.5"); n != 1 {
		t.Fatalf("kill9 killed %d, want 1", n)
	}
	if err := cmd.Wait(); err == nil {
		t.Fatal("sleep ended without being killed")
	}
}
