package lvmbackend

// What google/lvmd's errors mean: its gRPC codes, and the text of lvm's
// messages it passes on (some of which topolvm's lvmd passes on too).

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"google.golang.org/grpc/codes"
)

// ErrUnparsableListing: google/lvmd ran lvs or vgs but its own parser failed
// on the output, so it reports nothing about the volumes. The common causes are
// an inactive LV in the volume group (lvs prints kernel major -1 for it, and
// every thin pool has an inactive hidden [lvol0_pmspare]) and LVM warnings,
// which the daemon reads as if they were report lines. Retrying does not help
// until the volume group or the host changes.
var ErrUnparsableListing = errors.New("google/lvmd cannot parse the LVM report")

// googleError maps a google/lvmd error to an *Error from its gRPC code and,
// for Internal, from its text (see classifyGoogle); it also returns the text.
func googleError(op string, err error) (*Error, string) {
	e, st := rpcError(op, err)
	msg := st.Message()
	if e != nil {
		return e, msg
	}
	switch st.Code() {
	case codes.Internal, codes.Unknown:
		kind := classifyGoogle(msg)
		cause := errors.New(msg)
		if errors.Is(kind, ErrUnparsableListing) {
			cause = fmt.Errorf("%s: %s", msg, unparsableHint(msg))
		}
		return &Error{Op: op, Kind: kind, Cause: cause}, msg
	}
	// Anything else (Unimplemented: not google/lvmd at that address) stays
	// untyped, so that the agent retries and reports it.
	return &Error{Op: op, Cause: fmt.Errorf("%s: %s", st.Code(), msg)}, msg
}

// LVM's messages, as lvm2 prints them (checked against lvm2 2.03.16's
// binary; the older forms are from lvm2 2.02). Only messages whose meaning is
// certain are listed: "Cannot process volume group x" alone is not enough
// for a missing VG, because LVM prints it after any failure to read the VG
// (a lock it cannot take, say).
var (
	// Volume group missing: lib/metadata/metadata.c and tools/toollib.c
	// ("Volume group \"%s\" not found"); lvm2 2.02's lvcreate said "doesn't
	// exist". "not found, is inconsistent or has PVs missing" is a damaged VG,
	// not a missing one.
	reVGMissing = regexp.MustCompile(`Volume group "[^"\s]+" (not found(?:[.\s]|$)|doesn't exist)`)
	// LV missing: tools/toollib.c, process_each_lv_in_vg ("Failed to find
	// logical volume \"%s/%s\""); lvm2 before 2.02.1xx printed "One or more
	// specified logical volume(s) not found.".
	reLVMissing = regexp.MustCompile(`Failed to find logical volume "[^"\s]+/[^"\s]+"|One or more specified logical volume\(s\) not found`)
	// Not enough space: lib/metadata/lv_manip.c (_lv_create_an_lv: "Volume
	// group \"%s\" has insufficient free space (%u extents): %u required.";
	// _sufficient_pes_free: "Insufficient free space: %u extents needed, but
	// only %u available"; _allocate: "Insufficient suitable %sallocatable
	// extents ..."; thin pools: "Cannot create new thin volume, free space in
	// thin pool %s reached threshold.") and lib/metadata/thin_manip.c
	// ("Threshold configured for free data|metadata space in thin pool %s has
	// been reached").
	reNoSpace = regexp.MustCompile(`Volume group "[^"\s]+" has insufficient free space \(\d+ extents\): \d+ required` +
		`|Insufficient free space: \d+ extents needed, but only \d+ available` +
		`|Insufficient suitable (?:[a-z]+ )?allocatable extents` +
		`|Cannot create new thin volume, free space in thin pool \S+ reached threshold` +
		`|Threshold configured for free (?:data|metadata) space in thin pool \S+ has been reached`)
	// google/lvmd's parser (parser/parser.go) failing on lvs/vgs output:
	// strconv errors on sizes and device numbers ("-1" for an inactive LV),
	// "expected %d components, got %d" (empty output, or a warning line),
	// "failed to parse component", "incorrect attrs block size".
	reUnparsable  = regexp.MustCompile(`strconv\.ParseUint: parsing |expected \d+ components, got \d+|failed to parse component '|incorrect attrs block size`)
	reEmptyReport = regexp.MustCompile(`expected \d+ components, got 1$`)
	// Refusals no retry changes, in lvm's words: a reserved name
	// (lib/misc/lvm-string.c, apply_lvname_restrictions: "Names starting|
	// including \"%s\" are reserved."), a name taken in the VG
	// (lib/metadata/lv_manip.c: "Logical Volume \"%s\" already exists in
	// volume group \"%s\""), and topolvm lvmd's unknown lvcreate option class
	// (internal/lvmd/lvservice.go: "unsupported lvcreate-option-class target").
	reReserved    = regexp.MustCompile(`Names (?:starting|including) "[^"]+" are reserved`)
	reExists      = regexp.MustCompile(`Logical [Vv]olume "[^"\s]+" already exists in volume group`)
	reOptionClass = regexp.MustCompile(`unsupported lvcreate-option-class target`)
	// google/lvmd's commands.go reports lvm's failure as Go's exec error.
	reExitStatus = regexp.MustCompile(`exit status \d+`)
)

// classifyGoogle returns the typed error a google/lvmd Internal message
// means, or nil when it means nothing certain (transient for the agent).
func classifyGoogle(msg string) error {
	switch {
	case reVGMissing.MatchString(msg):
		return ErrUnknownDeviceClass
	case reLVMissing.MatchString(msg):
		return ErrNotFound
	case reNoSpace.MatchString(msg):
		return ErrInsufficientCapacity
	case reUnparsable.MatchString(msg):
		return ErrUnparsableListing
	case strings.Contains(msg, "size must be greater than 0"): // commands.CreateLV
		return ErrInvalidArgument
	}
	return lvmRefusal(msg)
}

// lvmRefusal is the typed error of a create that lvm (or lvmd) refuses for
// good, from its message; nil for anything else. Both dialects report these
// as internal errors, which would otherwise be retried for ever.
func lvmRefusal(msg string) error {
	switch {
	case reReserved.MatchString(msg), reOptionClass.MatchString(msg):
		return ErrInvalidArgument
	case reExists.MatchString(msg):
		return ErrExists
	}
	return nil
}

// bareExit reports whether msg is an lvm failure without lvm's own text: the
// pinned google/lvmd never sends it, and forks send "\nCommandOutput: ..."
// after the exit status (empty, or "[]" for lvs).
func bareExit(msg string) bool {
	head, out, _ := strings.Cut(msg, "\nCommandOutput:")
	return reExitStatus.MatchString(head) && strings.Trim(strings.TrimSpace(out), "[]") == ""
}

// emptyReport reports whether a parse failure is the daemon reading lvs'
// empty output (no LV in the VG) as one malformed line.
func emptyReport(msg string) bool {
	head, _, _ := strings.Cut(msg, "\nCommandOutput:")
	return reEmptyReport.MatchString(strings.TrimSpace(head))
}

func unparsableHint(msg string) string {
	if strings.Contains(msg, `parsing "-1"`) {
		return "the volume group holds an inactive LV, whose kernel major lvs reports as -1 " +
			"(every thin pool has the hidden [lvol0_pmspare]); google/lvmd cannot list such a VG, " +
			"look volumes up one at a time"
	}
	return "LVM printed something google/lvmd could not read (no volume, or a warning line)"
}
