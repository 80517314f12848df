package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	lvmdtypes "github.com/topolvm/topolvm/pkg/lvmd/types"
	"sigs.k8s.io/yaml"
)

// readChartSchema is charts/lvm-agent/values.schema.json.
func readChartSchema(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	require.NoError(t, err)
	var schema map[string]any
	require.NoError(t, json.Unmarshal(data, &schema))
	return schema
}

// schemaResolve follows a "#/definitions/NAME" reference.
func schemaResolve(t *testing.T, root, s map[string]any) map[string]any {
	t.Helper()
	for {
		ref, ok := s["$ref"].(string)
		if !ok {
			return s
		}
		name, ok := strings.CutPrefix(ref, "#/definitions/")
		require.True(t, ok, "a reference outside definitions: %s", ref)
		def, ok := root["definitions"].(map[string]any)[name].(map[string]any)
		require.True(t, ok, "no definition %s", name)
		s = def
	}
}

// schemaGaps lists the values of v (at path) that schema s does not
// describe: a key that is neither one of its properties nor allowed by an
// additionalProperties schema, or an array item without an items schema.
func schemaGaps(t *testing.T, root, s map[string]any, path string, v any) []string {
	t.Helper()
	s = schemaResolve(t, root, s)
	var gaps []string
	switch v := v.(type) {
	case map[string]any:
		props, _ := s["properties"].(map[string]any)
		for k, child := range v {
			if p, ok := props[k].(map[string]any); ok {
				gaps = append(gaps, schemaGaps(t, root, p, path+"."+k, child)...)
			} else if extra, ok := s["additionalProperties"].(map[string]any); ok {
				gaps = append(gaps, schemaGaps(t, root, extra, path+"."+k, child)...)
			} else if s["additionalProperties"] == false || props != nil {
				gaps = append(gaps, path+"."+k)
			}
			// A free object (affinity, global): Kubernetes' schema, or none.
		}
	case []any:
		items, ok := s["items"].(map[string]any)
		if !ok {
			return []string{path + "[]"}
		}
		for _, child := range v {
			gaps = append(gaps, schemaGaps(t, root, items, path+"[]", child)...)
		}
	}
	return gaps
}

// schemaOpen lists the object schemas with properties that still allow
// other keys: each must say additionalProperties: false, or a misspelt key
// there would install silently.
func schemaOpen(path string, s any) []string {
	var open []string
	switch s := s.(type) {
	case map[string]any:
		if _, ok := s["properties"]; ok && s["additionalProperties"] != false {
			open = append(open, path)
		}
		for k, child := range s {
			open = append(open, schemaOpen(path+"/"+k, child)...)
		}
	case []any:
		for _, child := range s {
			open = append(open, schemaOpen(path+"/[]", child)...)
		}
	}
	return open
}

// The schema describes every value of values.yaml and closes each object
// it lists the keys of; lvmd's configuration has exactly the keys topolvm's
// lvmd reads.
func TestChartSchemaCoversValues(t *testing.T) {
	schema := readChartSchema(t)
	assert.Equal(t, "http://json-schema.org/draft-07/schema#", schema["$schema"], "the draft Helm validates")
	data, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	require.NoError(t, err)
	var values map[string]any
	require.NoError(t, yaml.Unmarshal(data, &values))
	require.NotEmpty(t, values)
	assert.Empty(t, schemaGaps(t, schema, schema, "", values), "values.yaml's values the schema does not describe")
	assert.Empty(t, schemaOpen("", schema), "object schemas without additionalProperties: false")
	// Each key the schema lists is a value of values.yaml (or Helm's global),
	// so the schema has no stale key either.
	props := schema["properties"].(map[string]any)
	for k := range props {
		if k != "global" {
			assert.Contains(t, values, k, "the schema lists %s, values.yaml has none", k)
		}
	}

	jsonKeys := func(v any) []string {
		var keys []string
		rt := reflect.TypeOf(v)
		for i := range rt.NumField() {
			name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
			keys = append(keys, name)
		}
		slices.Sort(keys)
		return keys
	}
	lvmdConfig := schemaResolve(t, schema, props["lvmd"].(map[string]any)["properties"].(map[string]any)["config"].(map[string]any))
	keys := func(s map[string]any) []string {
		var out []string
		for k := range schemaResolve(t, schema, s)["properties"].(map[string]any) {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	cfg := lvmdConfig["properties"].(map[string]any)
	// socket-name is the chart's: lvmd.socketDir.
	assert.Equal(t, []string{"device-classes", "lvcreate-option-classes", "lvm-command-prefix"}, keys(lvmdConfig))
	dc := cfg["device-classes"].(map[string]any)["items"].(map[string]any)
	assert.Equal(t, jsonKeys(lvmdtypes.DeviceClass{}), keys(dc), "a device class's keys")
	assert.Equal(t, jsonKeys(lvmdtypes.ThinPoolConfig{}), keys(dc["properties"].(map[string]any)["thin-pool"].(map[string]any)), "a thin pool's keys")
	assert.Equal(t, jsonKeys(lvmdtypes.LvcreateOptionClass{}), keys(cfg["lvcreate-option-classes"].(map[string]any)["items"].(map[string]any)), "an option class's keys")
}

// A misspelt key, at the top or deeper, in --set or in a values file, and
// a value of the wrong kind, fail helm template (as they fail helm
// install), with an error that names the key.
func TestChartSchemaRefusesTypos(t *testing.T) {
	file := filepath.Join(t.TempDir(), "values.yaml")
	require.NoError(t, os.WriteFile(file, []byte("provisioner:\n  nodeLoss:\n    gracePeriod: 10m\n"), 0o644))
	for _, tc := range []struct {
		args []string
		key  string
	}{
		{[]string{"--set", "agnet.watchMode=all"}, "agnet"},
		{[]string{"--set", "agent.watchMod=all"}, "watchMod"},
		{[]string{"--set", "agent.orphanGC.intervall=1m"}, "intervall"},
		{[]string{"--set", "lvmd.config.device-classes[0].sparegb=5"}, "sparegb"},
		{[]string{"-f", file}, "gracePeriod"},
		{[]string{"--set", "agent.watchMode=everything"}, "watchMode"},
		{[]string{"--set", "provisioner.resize=maybe"}, "resize"},
		{[]string{"--set", "provisioner.nodeLoss.grace=0s"}, "grace"},
		{[]string{"--set", "agent.wipeRate=fast"}, "wipeRate"},
	} {
		_, err := helm(t, append([]string{"template", "lvm-agent", chartDir}, tc.args...)...)
		if assert.Error(t, err, "%v renders", tc.args) {
			assert.Contains(t, err.Error(), "schema", "%v: refused by the schema", tc.args)
			assert.Contains(t, err.Error(), tc.key, "%v: the error names the key", tc.args)
		}
	}
	// And the right spellings render.
	_, err := helm(t, "template", "lvm-agent", chartDir, "--set", "agent.watchMode=all", "--set", "agent.orphanGC.interval=0",
		"--set", "agent.wipeRate=0", "--set", "provisioner.nodeLoss.grace=90s", "--set", "lvmd.config.device-classes[0].spare-gb=5")
	assert.NoError(t, err)
}
