package kube

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// MaxSpecBytes bounds the spec annotation the agent will parse.
const MaxSpecBytes = 16 << 10

// MaxTags and MaxTagBytes bound a spec's tags: each LV's tags live in the
// VG's metadata area (about 1 MiB by default, shared by every LV of the VG),
// and a few thousand tags fill it.
const (
	MaxTags     = 16
	MaxTagBytes = 2048
)

// specKeys and sourceKeys are the keys of the JSON spec and of its
// source, exactly as written.
var (
	specKeys   = map[string]bool{"volumeGroup": true, "name": true, "size": true, "tags": true, "striping": true, "source": true}
	sourceKeys = map[string]bool{"name": true, "kind": true}
)

// CreateSpec is the JSON spec a provisioner writes on a PVC.
type CreateSpec struct {
	VolumeGroup string   `json:"volumeGroup"`
	Name        string   `json:"name"`
	Size        int64    `json:"size"`
	Tags        []string `json:"tags,omitempty"`
	Striping    bool     `json:"striping,omitempty"`
	// Source, in a clone's spec, is the LV of the same volume group whose
	// data the new LV starts with.
	Source *CloneSource `json:"source,omitempty"`
}

// CloneSource names a clone's source LV and how it is copied.
type CloneSource struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
}

// Clone kinds: what an agent makes of a clone request for a volume group,
// as it says in the Node capacity annotation's "clone" field.
const (
	// CloneSnapshot: a thin snapshot of the source, activated read-write
	// (a thin device class, topolvm's lvmd).
	CloneSnapshot = "snapshot"
	// CloneCopy: a new LV, and the source's blocks copied into it by the
	// agent, verified, while nothing has the source open.
	CloneCopy = "copy"
)

// ErrInvalidSpec wraps every spec error.
var ErrInvalidSpec = errors.New("invalid volume spec")

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidSpec, fmt.Sprintf(format, a...))
}

// ParseCreateSpec parses and validates a PVC spec; the size is rounded up to
// lvmd's 4096-byte unit.
func ParseCreateSpec(s string) (CreateSpec, error) {
	var spec CreateSpec
	if _, err := specText(s); err != nil {
		return spec, err
	}
	if err := decodeSpec(s, &spec); err != nil {
		return spec, err
	}
	if err := validateVolume(spec.VolumeGroup, spec.Name); err != nil {
		return spec, err
	}
	size, ok := lvmbackend.RoundSize(spec.Size)
	switch {
	case !ok && spec.Size > 0:
		return spec, invalid("size %d is too large", spec.Size)
	case !ok:
		return spec, invalid("size %d must be a positive number of bytes", spec.Size)
	}
	spec.Size = size
	if len(spec.Tags) > MaxTags {
		return spec, invalid("spec has %d tags, at most %d allowed", len(spec.Tags), MaxTags)
	}
	n := 0
	for _, t := range spec.Tags {
		if err := lvmbackend.ValidateTag(t); err != nil {
			return spec, invalid("%v", err)
		}
		n += len(t)
	}
	if n > MaxTagBytes {
		return spec, invalid("spec's tags are %d bytes, at most %d allowed", n, MaxTagBytes)
	}
	if src := spec.Source; src != nil {
		switch {
		case src.Kind != CloneSnapshot && src.Kind != CloneCopy:
			return spec, invalid("source kind %q is neither %q nor %q", src.Kind, CloneSnapshot, CloneCopy)
		case src.Name == spec.Name:
			return spec, invalid("source %q is the LV to be made", src.Name)
		}
		if err := validateVolume(spec.VolumeGroup, src.Name); err != nil {
			return spec, invalid("source: %v", err)
		}
	}
	return spec, nil
}

// decodeSpec decodes a JSON spec object into spec with exact keys: each key
// of specKeys (and of sourceKeys in its source) at most once, as written,
// and no other. encoding/json alone matches keys case-insensitively, lets
// the last duplicate win and skips unknown keys, so `{"name":"a","NAME":"b"}`
// would name b; the keys are checked on the token stream first, and the
// object decoded once they pass.
func decodeSpec(s string, spec *CreateSpec) error {
	raw, err := exactKeys(s, specKeys, "spec", "volumeGroup, name, size, tags, striping, source")
	if err != nil {
		return err
	}
	if src, ok := raw["source"]; ok && string(src) != "null" {
		if _, err := exactKeys(string(src), sourceKeys, "spec's source", "name, kind"); err != nil {
			return err
		}
	}
	if err := json.Unmarshal([]byte(s), spec); err != nil {
		return invalid("spec is not valid JSON of the expected shape: %v", err)
	}
	return nil
}

// exactKeys checks that s is one JSON object with only the given keys, each
// once, and returns its values by key; what and known name them in errors.
func exactKeys(s string, keys map[string]bool, what, known string) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, invalid("%s is not valid JSON of the expected shape: not a JSON object", what)
	}
	values := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, invalid("%s is not valid JSON of the expected shape: %v", what, err)
		}
		key, _ := tok.(string)
		if !keys[key] {
			return nil, invalid("%s has the unknown key %s (keys are exact: %s)", what, quoteKey(key), known)
		}
		if _, seen := values[key]; seen {
			return nil, invalid("%s has the key %q twice", what, key)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, invalid("%s is not valid JSON of the expected shape: %v", what, err)
		}
		values[key] = v
	}
	if _, err := dec.Token(); err != nil {
		return nil, invalid("%s is not valid JSON of the expected shape: %v", what, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, invalid("%s has trailing data after the JSON object", what)
	}
	return values, nil
}

func quoteKey(k string) string {
	if len(k) > 64 {
		return fmt.Sprintf("%q...", k[:64])
	}
	return fmt.Sprintf("%q", k)
}

// ParsePVSpec reads the PV spec: "<vg>/<lv>" in the original form, or the
// same JSON as on the PVC (only volumeGroup and name are used).
func ParsePVSpec(s string) (vg, lv string, err error) {
	s, err = specText(s)
	if err != nil {
		return "", "", err
	}
	if strings.HasPrefix(s, "{") {
		var spec CreateSpec
		if err := decodeSpec(s, &spec); err != nil {
			return "", "", err
		}
		vg, lv = spec.VolumeGroup, spec.Name
	} else {
		var ok bool
		if vg, lv, ok = strings.Cut(s, "/"); !ok {
			return "", "", invalid("spec %q is not of the form <vg>/<lv>", s)
		}
	}
	if err := validateVolume(vg, lv); err != nil {
		return "", "", err
	}
	return vg, lv, nil
}

// ParseGrowSpec reads a PV's grow request: the JSON spec (as on a PVC),
// whose size is the size asked for, rounded up to lvmd's unit. The
// original "<vg>/<lv>" form has no size and is refused. A grow reads
// volumeGroup, name and size; tags and striping are what the LV was
// created with and are not changed.
func ParseGrowSpec(s string) (CreateSpec, error) {
	t, err := specText(s)
	if err != nil {
		return CreateSpec{}, err
	}
	if !strings.HasPrefix(t, "{") {
		return CreateSpec{}, invalid("a grow needs the JSON spec with the new size, not %q", t)
	}
	return ParseCreateSpec(t)
}

// specText refuses a spec annotation that is too large or blank, and
// returns it without surrounding space.
func specText(s string) (string, error) {
	if len(s) > MaxSpecBytes {
		return "", invalid("spec is %d bytes, at most %d allowed", len(s), MaxSpecBytes)
	}
	if s = strings.TrimSpace(s); s == "" {
		return "", invalid("annotation %s is missing or empty", AnnSpec)
	}
	return s, nil
}

func validateVolume(vg, lv string) error {
	if vg == "" {
		return invalid("volumeGroup is missing")
	}
	if err := lvmbackend.ValidateName(vg); err != nil {
		return invalid("volumeGroup: %v", strings.Replace(err.Error(), "LV name", "name", 1))
	}
	if lv == "" {
		return invalid("name is missing")
	}
	if err := lvmbackend.ValidateName(lv); err != nil {
		return invalid("%v", err)
	}
	return nil
}

// SpecName is the LV name a spec annotation gives (a PVC's or a PV's, JSON
// or "<vg>/<lv>"), read leniently: unlike ParsePVSpec it takes a spec that
// the agent would refuse, since what it answers is "does something still
// name this LV?", where keeping an LV is the safe error. "" when no name can
// be read at all.
func SpecName(s string) string {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "{") {
		var spec CreateSpec
		_ = json.Unmarshal([]byte(s), &spec) // what decoded before an error is kept
		return spec.Name
	}
	_, lv, _ := strings.Cut(s, "/")
	return lv
}
