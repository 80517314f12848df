package lvmbackend

import (
	"fmt"
	"strings"
	"unicode/utf8"
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

// LVM reserves these name parts for its own sub-volumes: the component
// suffixes of lvm2's lib/misc/lvm-string.c (cache, writecache, mirror, raid,
// thin, VDO and integrity components) and the two it adds for other LVs.
// lvcreate refuses a name containing any of them, so the agent refuses it
// first: lvmd would report it as an internal error, which looks transient.
var reservedParts = []string{"_cdata", "_cmeta", "_corig", "_cpool", "_cvol", "_wcorig",
	"_mimage", "_mlog", "_rimage", "_rmeta", "_tdata", "_tmeta", "_vdata", "_imeta", "_iorig",
	"_pmspare", "_vorigin"}

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
	if r, ok := badRune(name, ""); ok {
		return fmt.Errorf("LV name %q has the character %q: only letters, digits and + _ . - are allowed", name, r)
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
	switch {
	case tag == "" || len(tag) > 1024:
		return fmt.Errorf("LVM tag must be 1 to 1024 bytes, not %d: %s", len(tag), quoteShort(tag))
	case tag[0] == '-':
		return fmt.Errorf("LVM tag must not start with '-': %s", quoteShort(tag))
	}
	if r, ok := badRune(tag, "/=!:#&"); ok {
		return fmt.Errorf("LVM tag has the character %q (allowed: letters, digits and + _ . - / = ! : # &): %s", r, quoteShort(tag))
	}
	return nil
}

// badRune returns the first rune of s that is neither a name character nor
// in extra; an invalid UTF-8 byte is returned as utf8.RuneError.
func badRune(s, extra string) (rune, bool) {
	for _, r := range s {
		if r >= utf8.RuneSelf || !nameChar(byte(r)) && !strings.ContainsRune(extra, r) {
			return r, true
		}
	}
	return 0, false
}

// quoteShort quotes s, cut to its first 64 bytes: an error on an object
// should name the bad value, not repeat a kilobyte of it.
func quoteShort(s string) string {
	if len(s) <= 64 {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:64], len(s))
}

func nameChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '+' || c == '_' || c == '.' || c == '-'
}
