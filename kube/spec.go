package kube

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// MaxSpecBytes bounds the spec annotation the agent will parse.
const MaxSpecBytes = 16 << 10

// CreateSpec is the JSON spec a provisioner writes on a PVC.
type CreateSpec struct {
	VolumeGroup string   `json:"volumeGroup"`
	Name        string   `json:"name"`
	Size        int64    `json:"size"`
	Tags        []string `json:"tags,omitempty"`
	Striping    bool     `json:"striping,omitempty"`
}

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
	dec := json.NewDecoder(strings.NewReader(s))
	if err := dec.Decode(&spec); err != nil {
		return spec, invalid("spec is not valid JSON of the expected shape: %v", err)
	}
	if dec.More() {
		return spec, invalid("spec has trailing data after the JSON object")
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
	for _, t := range spec.Tags {
		if err := lvmbackend.ValidateTag(t); err != nil {
			return spec, invalid("%v", err)
		}
	}
	return spec, nil
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
		if err := json.Unmarshal([]byte(s), &spec); err != nil {
			return "", "", invalid("spec is not valid JSON of the expected shape: %v", err)
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
