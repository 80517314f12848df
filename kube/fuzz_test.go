package kube

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// The spec annotations are written by whoever may edit a PVC or PV, so the
// parsers see hostile text. Whatever they are given, they must not panic,
// must refuse with ErrInvalidSpec and a message a person can act on, and
// what they accept must be safe to hand to lvmd. The committed corpora are
// in testdata/fuzz/<target>; `make fuzz` runs each target for a bounded time.

// checkInvalid holds for every refusal: the typed error, and a message that
// still says what is wrong once the agent has made it fit volume.error.
func checkInvalid(t *testing.T, in string, err error) {
	t.Helper()
	if !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("error for %q is not ErrInvalidSpec: %v", in, err)
	}
	msg := OneLine(err)
	if !strings.HasPrefix(msg, ErrInvalidSpec.Error()+": ") || len(msg) <= len(ErrInvalidSpec.Error())+2 {
		t.Fatalf("error for %q says nothing: %q", in, msg)
	}
	if len(msg) > MaxErrorBytes || strings.ContainsAny(msg, "\n\r") || !utf8.ValidString(msg) {
		t.Fatalf("error for %q does not fit volume.error: %q", in, msg)
	}
}

// checkVolume holds for every accepted VG and LV name.
func checkVolume(t *testing.T, in, vg, lv string) {
	t.Helper()
	for _, n := range []string{vg, lv} {
		if err := lvmbackend.ValidateName(n); err != nil {
			t.Fatalf("%q accepted with an invalid name %q: %v", in, n, err)
		}
		if strings.ContainsAny(n, "/ \t\n\x00") || n[0] == '-' {
			t.Fatalf("%q accepted with a path- or option-like name %q", in, n)
		}
	}
}

func FuzzParseCreateSpec(f *testing.F) {
	f.Add(`{"volumeGroup":"vg1","name":"pvc-1","size":1073741824}`)
	f.Add(`{"volumeGroup":"vg1","name":"lv","size":1,"tags":["a=b","c:d"],"striping":true}`)
	f.Fuzz(func(t *testing.T, s string) {
		spec, err := ParseCreateSpec(s)
		if err != nil {
			checkInvalid(t, s, err)
			return
		}
		if len(s) > MaxSpecBytes {
			t.Fatalf("accepted a %d-byte spec", len(s))
		}
		checkVolume(t, s, spec.VolumeGroup, spec.Name)
		for _, tag := range spec.Tags {
			if err := lvmbackend.ValidateTag(tag); err != nil {
				t.Fatalf("%q accepted with tag %q: %v", s, tag, err)
			}
		}
		// The size is what was asked for, rounded up to lvmd's unit.
		var raw CreateSpec
		if err := json.NewDecoder(strings.NewReader(s)).Decode(&raw); err != nil {
			t.Fatalf("%q accepted but does not decode: %v", s, err)
		}
		if spec.Size <= 0 || spec.Size%lvmbackend.SizeUnit != 0 || spec.Size < raw.Size || spec.Size-raw.Size >= lvmbackend.SizeUnit {
			t.Fatalf("size %d from %d in %q", spec.Size, raw.Size, s)
		}
		// What the parser accepts, a provisioner can write back unchanged.
		out, err := json.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseCreateSpec(string(out))
		if err != nil {
			t.Fatalf("%s (from %q) no longer parses: %v", out, s, err)
		}
		if again.VolumeGroup != spec.VolumeGroup || again.Name != spec.Name || again.Size != spec.Size ||
			again.Striping != spec.Striping || strings.Join(again.Tags, "\x00") != strings.Join(spec.Tags, "\x00") {
			t.Fatalf("round trip of %q changed the spec: %+v → %+v", s, spec, again)
		}
	})
}

func FuzzParsePVSpec(f *testing.F) {
	f.Add("vg1/pvc-1")
	f.Add(`{"volumeGroup":"vg1","name":"pvc-1","size":4096}`)
	f.Fuzz(func(t *testing.T, s string) {
		vg, lv, err := ParsePVSpec(s)
		if err != nil {
			checkInvalid(t, s, err)
			return
		}
		if len(s) > MaxSpecBytes {
			t.Fatalf("accepted a %d-byte spec", len(s))
		}
		checkVolume(t, s, vg, lv)
		// The original form names exactly one VG and one LV.
		if trimmed := strings.TrimSpace(s); !strings.HasPrefix(trimmed, "{") && vg+"/"+lv != trimmed {
			t.Fatalf("%q parsed as %q/%q", s, vg, lv)
		}
	})
}

// NodeLabelValue must give every node name a selectable label value, the
// same one every time (the provisioner and the agent compute it apart), and
// different ones for different names (or an agent would take another node's
// requests).
func FuzzNodeLabelValue(f *testing.F) {
	f.Add("node-a", "node-b")
	f.Add(strings.Repeat("n", 64), strings.Repeat("n", 65))
	f.Fuzz(func(t *testing.T, a, b string) {
		la, lb := NodeLabelValue(a), NodeLabelValue(b)
		for in, out := range map[string]string{a: la, b: lb} {
			if errs := validation.IsValidLabelValue(out); len(errs) != 0 {
				t.Fatalf("NodeLabelValue(%q) = %q is not a label value: %v", in, out, errs)
			}
			if again := NodeLabelValue(in); again != out {
				t.Fatalf("NodeLabelValue(%q) is %q, then %q", in, out, again)
			}
			if len(validation.IsValidLabelValue(in)) == 0 {
				if out != in {
					t.Fatalf("valid label value %q became %q", in, out)
				}
			} else if len(out) != 42 || !strings.HasPrefix(out, "h-") {
				t.Fatalf("NodeLabelValue(%q) = %q, want h- and 40 hex digits", in, out)
			}
		}
		if a != b && la == lb {
			t.Fatalf("%q and %q both map to %q", a, b, la)
		}
	})
}

// Inputs too large to be worth a fuzzer's time, refused like any other.
// (Other hostile inputs are the committed corpora, which plain `go test`
// runs too.)
func TestParseSpecOversize(t *testing.T) {
	valid := `{"volumeGroup":"vg1","name":"lv","size":4096}`
	for name, s := range map[string]string{
		"padded":        valid + strings.Repeat(" ", MaxSpecBytes),
		"huge name":     `{"volumeGroup":"vg1","name":"` + strings.Repeat("a", 200<<10) + `","size":4096}`,
		"many tags":     `{"volumeGroup":"vg1","name":"lv","size":4096,"tags":[` + strings.Repeat(`"t",`, 8<<10) + `"t"]}`,
		"huge PV spec":  "vg1/" + strings.Repeat("a", MaxSpecBytes),
		"deep nesting":  strings.Repeat("[", MaxSpecBytes/2+1) + strings.Repeat("]", MaxSpecBytes/2+1),
		"just at limit": valid + strings.Repeat(" ", MaxSpecBytes-len(valid)+1),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseCreateSpec(s)
			checkInvalid(t, s, err)
			if !strings.Contains(err.Error(), "at most 16384 allowed") {
				t.Fatalf("error does not give the limit: %v", err)
			}
			_, _, err = ParsePVSpec(s)
			checkInvalid(t, s, err)
		})
	}
	// One byte under the limit is still parsed on its merits.
	if _, err := ParseCreateSpec(valid + strings.Repeat(" ", MaxSpecBytes-len(valid))); err != nil {
		t.Fatalf("a spec of exactly %d bytes: %v", MaxSpecBytes, err)
	}
}
