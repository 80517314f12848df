package lvmbackend

import (
	"fmt"
	"strings"
)

// SizeUnit is lvmd's allocation unit: topolvm's lvmd rejects sizes that are
// not multiples of it, and LVM rounds further up to its extent size.
const SizeUnit = 4096

// RoundSize rounds a positive byte count up to SizeUnit. It reports false when
// the size is not positive or would overflow.
func RoundSize(size int64) (int64, bool) {
	if size <= 0 || size > (1<<63-1)-(SizeUnit-1) {
		return 0, false
	}
	return (size + SizeUnit - 1) / SizeUnit * SizeUnit, true
}

// LVM reserves these name parts for its own sub-volumes.
var reservedParts = []string{"_cdata", "_cmeta", "_corig", "_mimage", "_mlog", "_pmspare",
	"_rimage", "_rmeta", "_tdata", "_tmeta", "_vorigin", "_vdata"}

// ValidateName checks that name is a valid LVM logical volume name, by LVM's
// own rules. Anything else (a path, an option such as "-rf", a reserved
// suffix, unicode) is refused before it reaches lvmd.
func ValidateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("LV name is empty")
	case len(name) > 127:
		return fmt.Errorf("LV name is %d bytes long, at most 127 allowed", len(name))
	case name == "." || name == "..":
		return fmt.Errorf("LV name %q is not allowed", name)
	case name[0] == '-':
		return fmt.Errorf("LV name %q must not start with '-'", name)
	case strings.HasPrefix(name, "snapshot") || strings.HasPrefix(name, "pvmove"):
		return fmt.Errorf("LV name %q must not start with %q or %q", name, "snapshot", "pvmove")
	}
	for i := 0; i < len(name); i++ {
		if !nameChar(name[i]) {
			return fmt.Errorf("LV name %q has the character %q: only letters, digits and + _ . - are allowed", name, name[i])
		}
	}
	for _, p := range reservedParts {
		if strings.Contains(name, p) {
			return fmt.Errorf("LV name %q contains %q, which LVM reserves", name, p)
		}
	}
	return nil
}

// ValidateTag checks an LVM tag: 1-1024 bytes of letters, digits and _ + . - / = ! : # &.
func ValidateTag(tag string) error {
	if tag == "" || len(tag) > 1024 {
		return fmt.Errorf("LVM tag %q must be 1 to 1024 bytes", tag)
	}
	if tag[0] == '-' {
		return fmt.Errorf("LVM tag %q must not start with '-'", tag)
	}
	for i := 0; i < len(tag); i++ {
		if !nameChar(tag[i]) && !strings.ContainsRune("/=!:#&", rune(tag[i])) {
			return fmt.Errorf("LVM tag %q has the character %q", tag, tag[i])
		}
	}
	return nil
}

func nameChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '+' || c == '_' || c == '.' || c == '-'
}
