package kube

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseCreateSpec(t *testing.T) {
	cases := []struct {
		in      string
		want    CreateSpec
		wantErr string
	}{
		{in: `{"volumeGroup":"vg1","name":"pvc-1","size":1073741824,"tags":[],"striping":false}`,
			want: CreateSpec{VolumeGroup: "vg1", Name: "pvc-1", Size: 1 << 30, Tags: []string{}}},
		{in: `{"volumeGroup":"vg1","name":"a","size":1}`, want: CreateSpec{VolumeGroup: "vg1", Name: "a", Size: 4096}},
		{in: `{"volumeGroup":"vg1","name":"a","size":4097,"tags":["x=y","k8s:app"]}`, want: CreateSpec{VolumeGroup: "vg1", Name: "a", Size: 8192, Tags: []string{"x=y", "k8s:app"}}},
		{in: ``, wantErr: "missing or empty"},
		{in: `{`, wantErr: "not valid JSON"},
		{in: `{"volumeGroup":"vg1","name":"a","size":1}{}`, wantErr: "trailing data"},
		{in: `{"volumeGroup":"vg1","name":"a","size":"1Gi"}`, wantErr: "not valid JSON"},
		{in: `{"volumeGroup":"vg1","name":"a","size":1.5}`, wantErr: "not valid JSON"},
		{in: `{"volumeGroup":"vg1","name":"a","size":99999999999999999999}`, wantErr: "not valid JSON"},
		{in: `{"volumeGroup":"vg1","name":"a","size":9223372036854775807}`, wantErr: "too large"},
		{in: `{"volumeGroup":"vg1","name":"a","size":0}`, wantErr: "positive number"},
		{in: `{"volumeGroup":"vg1","name":"a","size":-5}`, wantErr: "positive number"},
		{in: `{"name":"a","size":1}`, wantErr: "volumeGroup is missing"},
		{in: `{"volumeGroup":"vg1","size":1}`, wantErr: "name is missing"},
		{in: `{"volumeGroup":"vg1","name":"-rf","size":1}`, wantErr: "must not start with '-'"},
		{in: `{"volumeGroup":"vg1","name":"../../etc","size":1}`, wantErr: "character '/'"},
		{in: `{"volumeGroup":"vg/x","name":"a","size":1}`, wantErr: "volumeGroup"},
		{in: `{"volumeGroup":"vg1","name":"ab_tdata","size":1}`, wantErr: "reserves"},
		{in: `{"volumeGroup":"vg1","name":"snapshot0","size":1}`, wantErr: "must not start with"},
		{in: `{"volumeGroup":"vg1","name":"..","size":1}`, wantErr: "not allowed"},
		{in: `{"volumeGroup":"vg1","name":"ünï","size":1}`, wantErr: "character"},
		{in: `{"volumeGroup":"vg1","name":"` + strings.Repeat("a", 128) + `","size":1}`, wantErr: "at most 127"},
		{in: `{"volumeGroup":"vg1","name":"a","size":1,"tags":["bad tag"]}`, wantErr: "tag"},
		{in: `{"volumeGroup":"vg1","name":"a","size":1,"tags":[""]}`, wantErr: "tag"},
		{in: strings.Repeat(" ", MaxSpecBytes+1), wantErr: "at most"},
		// Issue 14, item 4: exact keys, once each, no others; bounded tags.
		{in: `{"volumeGroup":"vg1","name":"a","NAME":"evil","size":1}`, wantErr: `unknown key "NAME"`},
		{in: `{"VolumeGroup":"vg1","name":"a","size":1}`, wantErr: `unknown key "VolumeGroup"`},
		{in: `{"volumeGroup":"vg1","name":"a","size":1,"name":"evil"}`, wantErr: `key "name" twice`},
		{in: `{"volumeGroup":"vg1","name":"a","size":1,"thin":true}`, wantErr: `unknown key "thin"`},
		{in: `[]`, wantErr: "not a JSON object"},
		// Issue 27: a clone names its source LV and the kind of copy.
		{in: `{"volumeGroup":"vg1","name":"a","size":1,"source":{"name":"src","kind":"snapshot"}}`,
			want: CreateSpec{VolumeGroup: "vg1", Name: "a", Size: 4096, Source: &CloneSource{Name: "src", Kind: CloneSnapshot}}},
		{in: `{"volumeGroup":"vg1","name":"a","size":1,"source":{"name":"src","kind":"copy"}}`,
			want: CreateSpec{VolumeGroup: "vg1", Name: "a", Size: 4096, Source: &CloneSource{Name: "src", Kind: CloneCopy}}},
		{in: `{"volumeGroup":"vg1","name":"a","size":1,"source":{"name":"src","kind":"mirror"}}`, wantErr: `source kind "mirror"`},
		{in: `{"volumeGroup":"vg1","name":"a","size":1,"source":{"name":"src"}}`, wantErr: `source kind ""`},
		{in: `{"volumeGroup":"vg1","name":"a","size":1,"source":{"name":"a","kind":"copy"}}`, wantErr: `source "a" is the LV to be made`},
		{in: `{"volumeGroup":"vg1","name":"a","size":1,"source":{"kind":"copy"}}`, wantErr: "source: invalid volume spec: name is missing"},
		{in: `{"volumeGroup":"vg1","name":"a","size":1,"source":{"name":"-x","kind":"copy"}}`, wantErr: "source:"},
		{in: `{"volumeGroup":"vg1","name":"a","size":1,"source":{"name":"s","Name":"t","kind":"copy"}}`, wantErr: `spec's source has the unknown key "Name"`},
		{in: `{"volumeGroup":"vg1","name":"a","size":1,"source":{"name":"s","kind":"copy","vg":"x"}}`, wantErr: `unknown key "vg"`},
		{in: `{"volumeGroup":"vg1","name":"a","size":1,"source":"s"}`, wantErr: "spec's source is not valid JSON of the expected shape"},
		{in: `{"volumeGroup":"vg1","name":"a","size":1,"tags":[` + strings.TrimSuffix(strings.Repeat(`"t",`, MaxTags+1), ",") + `]}`, wantErr: "tags, at most"},
		{in: `{"volumeGroup":"vg1","name":"a","size":1,"tags":["` + strings.Repeat("a", 1024) + `","` + strings.Repeat("b", 1024) + `","c"]}`, wantErr: "bytes, at most"},
		{in: `{"volumeGroup":"vg1","name":"a","size":1,"tags":[` + strings.TrimSuffix(strings.Repeat(`"t",`, 2000), ",") + `]}`, wantErr: "tags, at most"},
	}
	for _, tc := range cases {
		t.Run(tc.in[:min(len(tc.in), 40)], func(t *testing.T) {
			got, err := ParseCreateSpec(tc.in)
			if tc.wantErr != "" {
				require.ErrorIs(t, err, ErrInvalidSpec)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestParsePVSpec(t *testing.T) {
	cases := []struct{ in, vg, lv, wantErr string }{
		{in: "vg1/pvc-1", vg: "vg1", lv: "pvc-1"},
		{in: ` {"volumeGroup":"vg1","name":"pvc-1","size":5} `, vg: "vg1", lv: "pvc-1"},
		{in: "vg1", wantErr: "<vg>/<lv>"},
		{in: "vg1/a/b", wantErr: "character '/'"},
		{in: "/a", wantErr: "volumeGroup is missing"},
		{in: "vg1/", wantErr: "name is missing"},
		{in: "vg1/-f", wantErr: "'-'"},
		{in: "", wantErr: "missing"},
		{in: "{bad", wantErr: "JSON"},
		{in: `{"volumeGroup":"vg1","name":"a","NAME":"evil"}`, wantErr: "unknown key"},
		{in: `{"volumeGroup":"vg1","name":"a","name":"evil"}`, wantErr: "twice"},
	}
	for _, tc := range cases {
		vg, lv, err := ParsePVSpec(tc.in)
		if tc.wantErr != "" {
			require.ErrorIs(t, err, ErrInvalidSpec, tc.in)
			assert.Contains(t, err.Error(), tc.wantErr, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		assert.Equal(t, [2]string{tc.vg, tc.lv}, [2]string{vg, lv})
	}
}

// SpecName reads what ParsePVSpec refuses, too: a reference kept by a
// spec the agent would answer failed still keeps its LV.
func TestSpecName(t *testing.T) {
	for in, want := range map[string]string{
		"vg1/pvc-1": "pvc-1",
		` {"volumeGroup":"vg1","name":"pvc-1","size":5} `: "pvc-1",
		`{"name":"lv1"}`:                   "lv1",
		`{"name":"lv1","size":"huge"}`:     "lv1",
		`{"volumeGroup":"vg1","NAME":"b"}`: "b",
		"vg1/-f":                           "-f",
		"vg1":                              "",
		"":                                 "",
		"{bad":                             "",
		`{"name":5}`:                       "",
	} {
		assert.Equal(t, want, SpecName(in), in)
	}
}

func TestNodeLabelValue(t *testing.T) {
	assert.Equal(t, "node-1", NodeLabelValue("node-1"))
	assert.Equal(t, "ip-10-0-0-1.ec2.internal", NodeLabelValue("ip-10-0-0-1.ec2.internal"))
	long := strings.Repeat("n", 64)
	h := NodeLabelValue(long)
	assert.Len(t, h, 42)
	assert.True(t, strings.HasPrefix(h, "h-"))
	assert.Equal(t, h, NodeLabelValue(long), "deterministic")
	assert.NotEqual(t, h, NodeLabelValue(long+"x"))
	assert.True(t, strings.HasPrefix(NodeLabelValue("Node_With:Colon"), "h-"))
}
