package kube

import (
	"strings"
	"testing"
)

func TestProbeMessages(t *testing.T) {
	for _, s := range []string{
		`{"volumeGroup":"vg1","name":"données","size":4096}`,
		`{"volumeGroup":"vg1","name":"lv","size":4096,"tags":["` + strings.Repeat("t", 1025) + `"]}`,
		`{"volumeGroup":"vg1","name":"lv","size":4096,"tags":["` + strings.Repeat("t", 1000) + ` "]}`,
		`{"volumeGroup":"vg1","name":"lv","size":9223372036854775807}`,
	} {
		_, err := ParseCreateSpec(s)
		t.Logf("%s", OneLine(err)[max(0, len(OneLine(err))-120):])
	}
}
