package lvmbackend_test

import (
	"math"
	"regexp"
	"strings"
	"testing"

	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// ValidateName and ValidateTag are the last check before a name or tag
// reaches lvmd, which passes it to lvcreate on a command line. Each target
// compares them with LVM's rules written a second, independent way (a
// regular expression plus the exceptions), so that a slip in either shows up
// as a disagreement. Corpora: testdata/fuzz/<target>.

var (
	nameChars = regexp.MustCompile(`^[A-Za-z0-9+_.][A-Za-z0-9+_.-]{0,126}$`)
	tagChars  = regexp.MustCompile(`^[A-Za-z0-9_+./=!:#&][A-Za-z0-9_+./=!:#&-]*$`)
	// lvm2's lib/misc/lvm-string.c: component suffixes, plus _pmspare and _vorigin.
	reserved = regexp.MustCompile(`_(c(data|meta|orig|pool|vol)|wcorig|i(meta|orig)|m(image|log)|r(image|meta)|t(data|meta)|vdata|pmspare|vorigin)`)
)

func lvmAcceptsName(n string) bool {
	return nameChars.MatchString(n) && n != "." && n != ".." && !reserved.MatchString(n) &&
		!strings.HasPrefix(n, "snapshot") && !strings.HasPrefix(n, "pvmove")
}

func FuzzValidateName(f *testing.F) {
	f.Add("pvc-7f0c")
	f.Add("-rf")
	f.Fuzz(func(t *testing.T, name string) {
		err := lvmbackend.ValidateName(name)
		if want := lvmAcceptsName(name); (err == nil) != want {
			t.Fatalf("ValidateName(%q) = %v, LVM's rules say valid=%v", name, err, want)
		}
		if err != nil && !strings.Contains(err.Error(), "LV name") {
			t.Fatalf("ValidateName(%q): unclear error %q", name, err)
		}
	})
}

func FuzzValidateTag(f *testing.F) {
	f.Add("lvm-agent.pvc.6f1c2a4e-0000-4000-8000-000000000000")
	f.Add("a b")
	f.Fuzz(func(t *testing.T, tag string) {
		err := lvmbackend.ValidateTag(tag)
		if want := len(tag) <= 1024 && tagChars.MatchString(tag); (err == nil) != want {
			t.Fatalf("ValidateTag(%q) = %v, LVM's rules say valid=%v", tag, err, want)
		}
		if err != nil && !strings.Contains(err.Error(), "LVM tag") {
			t.Fatalf("ValidateTag(%q): unclear error %q", tag, err)
		}
	})
}

func FuzzRoundSize(f *testing.F) {
	f.Add(int64(1))
	f.Add(int64(math.MaxInt64))
	f.Fuzz(func(t *testing.T, n int64) {
		got, ok := lvmbackend.RoundSize(n)
		if want := n > 0 && n <= math.MaxInt64-(lvmbackend.SizeUnit-1); ok != want {
			t.Fatalf("RoundSize(%d) ok=%v, want %v", n, ok, want)
		}
		if !ok {
			return
		}
		if got%lvmbackend.SizeUnit != 0 || got < n || got-n >= lvmbackend.SizeUnit {
			t.Fatalf("RoundSize(%d) = %d", n, got)
		}
	})
}
