package lvmmeta

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseVG(t *testing.T) {
	vg, err := ParseVG(readTestdata(t, "vg0.vgtext"), DefaultLimits)
	require.NoError(t, err)
	assert.Equal(t, "vg0", vg.Name)
	assert.Equal(t, "Fz3l2c-0J3n-QY1a-9mB0-ZL6e-Qa0d-Tb7E1x", vg.UUID)
	assert.Equal(t, uint64(42), vg.Seqno)
	assert.Equal(t, uint64(4<<20), vg.ExtentSize)
	assert.Equal(t, []string{"node=a"}, vg.Tags)
	require.Len(t, vg.PVs, 2)
	assert.Equal(t, "GhIjKl-6666-7777-8888-9999-aaaa-bbbbbb", vg.PVs[1].UUID)
	assert.Equal(t, uint64(62), vg.TotalExtents())
	// lin 3 + str 4 + snap 1 + pmspare 1 + tmeta 1 + tdata 4.
	assert.Equal(t, uint64(62-14), vg.FreeExtents())

	type want struct {
		size         uint64
		typ          string
		visible      bool
		origin, pool string
		tags         []string
	}
	cases := map[string]want{
		"lin":           {size: 12 << 20, typ: "striped", visible: true, tags: []string{"lvm-agent.io/owned", "odd:tag=with/chars&more#", "a\"quote\\back"}},
		"str":           {size: 16 << 20, typ: "striped", visible: true},
		"pool":          {size: 16 << 20, typ: "thin-pool", visible: true},
		"thin":          {size: 32 << 20, typ: "thin", visible: true, pool: "pool", tags: []string{"t1"}},
		"tsnap":         {size: 32 << 20, typ: "thin", visible: true, pool: "pool", origin: "thin"},
		"snap":          {size: 12 << 20, typ: "striped", visible: true, origin: "lin"}, // lvs: the origin's size
		"lvol0_pmspare": {size: 4 << 20, typ: "striped"},
		"snapshot0":     {size: 12 << 20, typ: "snapshot"},
	}
	for name, w := range cases {
		t.Run(name, func(t *testing.T) {
			lv := vg.LV(name)
			require.NotNil(t, lv)
			assert.Equal(t, w.size, vg.SizeBytes(lv))
			assert.Equal(t, w.typ, lv.Type())
			assert.Equal(t, w.visible, lv.Visible())
			assert.Equal(t, w.origin, lv.Origin)
			assert.Equal(t, w.pool, lv.Pool)
			assert.Equal(t, w.tags, lv.Tags)
		})
	}
	assert.Equal(t, []string{"snap"}, vg.LV("lin").Snapshots)
	str := vg.LV("str").Segments[0]
	assert.Equal(t, []SegmentArea{{"pv0", 2}, {"pv1", 1}}, str.Areas)
	assert.True(t, vg.LV("pool").Segments[0].ZeroNewBlocks)
	assert.Equal(t, "LVM-Fz3l2c0J3nQY1a9mB0ZL6eQa0dTb7E1xlin00000000000000000000000000001", vg.DMUUID(vg.LV("lin")))
	assert.Equal(t, "my--vg-my--lv", DMName("my-vg", "my-lv"))
}

func TestParseVGRefuses(t *testing.T) {
	base := string(readTestdata(t, "vg0.vgtext"))
	cases := map[string]struct {
		text string
		err  error
	}{
		"empty":                 {"", ErrCorrupt},
		"two VGs":               {base + "\nvg1 { id = \"x\" seqno = 1 extent_size = 8 }\n", ErrCorrupt},
		"format version 2":      {"version = 2\n" + `vg { id = "x" seqno = 1 extent_size = 8 }`, ErrUnsupported},
		"no seqno":              {`vg { id = "x" extent_size = 8 }`, ErrCorrupt},
		"negative seqno":        {`vg { id = "x" seqno = -1 extent_size = 8 }`, ErrCorrupt},
		"seqno a string":        {`vg { id = "x" seqno = "1" extent_size = 8 }`, ErrCorrupt},
		"zero extent size":      {`vg { id = "x" seqno = 1 extent_size = 0 }`, ErrCorrupt},
		"tags not strings":      {`vg { id = "x" seqno = 1 extent_size = 8 tags = [1] }`, ErrCorrupt},
		"segment count too big": {`vg { id = "x" seqno = 1 extent_size = 8 logical_volumes { a { id = "y" segment_count = 2 segment1 { start_extent = 0 extent_count = 1 type = "zero" } } } }`, ErrCorrupt},
		"segment gap":           {`vg { id = "x" seqno = 1 extent_size = 8 logical_volumes { a { id = "y" segment_count = 1 segment1 { start_extent = 3 extent_count = 1 type = "zero" } } } }`, ErrCorrupt},
		"stripe on missing PV":  {`vg { id = "x" seqno = 1 extent_size = 8 logical_volumes { a { id = "y" segment_count = 1 segment1 { start_extent = 0 extent_count = 1 type = "striped" stripe_count = 1 stripes = ["pv9", 0] } } } }`, ErrCorrupt},
		"stripe count mismatch": {`vg { id = "x" seqno = 1 extent_size = 8 physical_volumes { pv0 { id = "p" pe_start = 1 pe_count = 9 } } logical_volumes { a { id = "y" segment_count = 1 segment1 { start_extent = 0 extent_count = 1 type = "striped" stripe_count = 2 stripes = ["pv0", 0] } } } }`, ErrCorrupt},
		"thin on missing pool":  {`vg { id = "x" seqno = 1 extent_size = 8 logical_volumes { a { id = "y" segment_count = 1 segment1 { start_extent = 0 extent_count = 1 type = "thin" thin_pool = "p" } } } }`, ErrCorrupt},
		"LV twice":              {`vg { id = "x" seqno = 1 extent_size = 8 logical_volumes { a { id = "y" segment_count = 0 } a { id = "z" segment_count = 0 } } }`, ErrCorrupt},
		"key twice":             {`vg { id = "x" id = "y" seqno = 1 extent_size = 8 }`, ErrCorrupt},
		"unclosed section":      {`vg { id = "x"`, ErrCorrupt},
		"unclosed string":       {`vg { id = "x`, ErrCorrupt},
		"stray brace":           {`}`, ErrCorrupt},
		"bad list":              {`vg { a = [1 2] }`, ErrCorrupt},
		"nested list":           {`vg { a = [[1]] }`, ErrCorrupt},
		"huge number":           {`vg { a = 99999999999999999999 }`, ErrCorrupt},
		"deep":                  {nest(17), ErrTooLarge},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ParseVG([]byte(c.text), DefaultLimits)
			require.ErrorIs(t, err, c.err)
		})
	}
}

func TestParseTextLimits(t *testing.T) {
	lim := Limits{MaxText: 64, MaxDepth: 2, MaxItems: 3}
	_, err := ParseText([]byte(`a = [1, 2, 3]`), lim)
	require.ErrorIs(t, err, ErrTooLarge, "items")
	_, err = ParseText(make([]byte, 65), lim)
	require.ErrorIs(t, err, ErrTooLarge, "size")
	_, err = ParseText([]byte(`a { b { c = 1 } }`), lim)
	require.NoError(t, err)
	_, err = ParseText([]byte(`a { b { c { } } }`), lim)
	require.ErrorIs(t, err, ErrTooLarge, "depth")
	root, err := ParseText([]byte("x = 1.5 # comment\ny = -3\x00\x00"), DefaultLimits)
	require.NoError(t, err)
	assert.Equal(t, []Field{{"x", Value{Kind: KindFloat, Str: "1.5"}}, {"y", Value{Kind: KindInt, Int: -3}}}, root.Fields)
	v, ok := root.Value("y")
	assert.True(t, ok)
	assert.Equal(t, int64(-3), v.Int)
	_, ok = root.Value("z")
	assert.False(t, ok)
}

func nest(n int) string {
	s := ""
	for i := 0; i < n; i++ {
		s += "a { "
	}
	for i := 0; i < n; i++ {
		s += "} "
	}
	return s
}

func TestAttr(t *testing.T) {
	vg, err := ParseVG(readTestdata(t, "vg0.vgtext"), DefaultLimits)
	require.NoError(t, err)
	cases := []struct {
		lv           string
		active, open bool
		want         string
	}{
		{"lin", true, true, "owi-aos---"},
		{"str", true, false, "-wi-a-----"},
		{"str", false, false, "-wi-------"},
		{"pool", true, false, "twi-a-tz--"},
		{"thin", true, false, "Vwi-a-tz--"},
		{"tsnap", false, false, "Vwi---tz-k"},
		{"snap", true, false, "sri-a-s---"},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, vg.Attr(vg.LV(c.lv), c.active, c.open), c.lv)
	}
}

// TestParseNumbers checks the integer scanner against strconv.ParseInt.
func TestParseNumbers(t *testing.T) {
	for _, lit := range []string{"0", "-0", "007", "42", "-42", "9223372036854775807", "9223372036854775808",
		"-9223372036854775808", "-9223372036854775809", "18446744073709551616", "99999999999999999999", "-"} {
		root, err := ParseText([]byte("x = "+lit), DefaultLimits)
		want, werr := strconv.ParseInt(lit, 10, 64)
		if werr != nil {
			require.ErrorIs(t, err, ErrCorrupt, lit)
			continue
		}
		require.NoError(t, err, lit)
		v, _ := root.Value("x")
		assert.Equal(t, Value{Kind: KindInt, Int: want}, v, lit)
	}
	root, err := ParseText([]byte("x = -1.5"), DefaultLimits)
	require.NoError(t, err)
	assert.Equal(t, []Field{{"x", Value{Kind: KindFloat, Str: "-1.5"}}}, root.Fields)
}

func TestLVMName(t *testing.T) {
	for dm, want := range map[string]string{
		"vg0-lv0":              "vg0/lv0",
		"vg0-pool0-tpool":      "vg0/pool0",
		"my--vg-pvc--1a2b--3c": "my-vg/pvc-1a2b-3c",
		"vg0-pool0_tdata":      "vg0/pool0_tdata",
		"cryptroot":            "cryptroot",
		"a-b-c-d":              "a-b-c-d",
		"-lv":                  "-lv",
		"vg--":                 "vg--",
	} {
		assert.Equal(t, want, LVMName(dm), dm)
	}
}
