package lvmbackend

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	lvmpb "github.com/google/lvmd/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// DefaultPollInterval is how often WatchCapacity asks google/lvmd for its
// volume groups when no interval is given: the daemon has no watch of its own.
const DefaultPollInterval = 10 * time.Second

// ErrUnparsableListing: google/lvmd ran lvs or vgs but its own parser failed
// on the output, so it reports nothing about the volumes. The common causes are
// an inactive LV in the volume group (lvs prints kernel major -1 for it, and
// every thin pool has an inactive hidden [lvol0_pmspare]) and LVM warnings,
// which the daemon reads as if they were report lines. Retrying does not help
// until the volume group or the host changes.
var ErrUnparsableListing = errors.New("google/lvmd cannot parse the LVM report")

// GoogleLVMD speaks to google/lvmd (github.com/google/lvmd) over TCP. For this
// dialect a device class is a volume group name.
//
// The daemon answers every failure with codes.Internal and, in the version
// this module pins, only lvm's exit status ("failed to create lv: exit status
// 5"): it drops the output of the command. When the message carries LVM's text
// (forks such as zdnscloud/lvmd append it as "\nCommandOutput: ...") the text
// is classified; when it does not, the backend asks for the volume groups
// (ListVG) and infers the kind from them: a volume group that vgs does not
// list is an unknown device class; an lvs of "vg/lv" that fails in a listed
// volume group is a missing LV; an lvcreate that fails in a volume group with
// less free space than requested is insufficient capacity.
type GoogleLVMD struct {
	conn *grpc.ClientConn
	lvm  lvmpb.LVMClient
	poll time.Duration
}

var _ Backend = (*GoogleLVMD)(nil)

// NewGoogleLVMD connects lazily to google/lvmd at address ("host:port"): an
// absent daemon is not an error here but ErrUnavailable at call time. A nil
// tlsCfg means plaintext. pollInterval is WatchCapacity's period
// (DefaultPollInterval when 0). opts are added to the dial options (tests use
// them for a short reconnect backoff).
func NewGoogleLVMD(address string, tlsCfg *tls.Config, pollInterval time.Duration, opts ...grpc.DialOption) (*GoogleLVMD, error) {
	if address == "" {
		return nil, errors.New("google/lvmd client: empty address")
	}
	if pollInterval < 0 {
		return nil, fmt.Errorf("google/lvmd client: negative poll interval %v", pollInterval)
	}
	if pollInterval == 0 {
		pollInterval = DefaultPollInterval
	}
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	opts = append(dialDefaults(creds), opts...)
	conn, err := grpc.NewClient(address, opts...)
	if err != nil {
		return nil, fmt.Errorf("google/lvmd client for %s: %w", address, err)
	}
	return &GoogleLVMD{conn: conn, lvm: lvmpb.NewLVMClient(conn), poll: pollInterval}, nil
}

// LoadClientTLS builds a client TLS configuration for google/lvmd's optional
// mutual TLS: certFile and keyFile (both or neither) are the client's
// certificate and key, caFile (optional; the system roots otherwise) verifies
// the server.
func LoadClientTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("client TLS: certificate %q and key %q must be given together", certFile, keyFile)
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client TLS: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("client TLS: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client TLS: no PEM certificate in %s", caFile)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// Close closes the connection.
func (g *GoogleLVMD) Close() error { return g.conn.Close() }

// GetVolume looks the volume up with an lvs of "vg/lv" alone: listing the
// whole volume group fails on any VG that holds a thin pool (see ListVolumes).
func (g *GoogleLVMD) GetVolume(ctx context.Context, deviceClass, name string) (*Volume, error) {
	op := "get " + deviceClass + "/" + name
	if err := checkLVMArgs(deviceClass, name); err != nil {
		return nil, &Error{Op: op, Kind: ErrInvalidArgument, Cause: err}
	}
	resp, err := g.lvm.ListLV(ctx, &lvmpb.ListLVRequest{VolumeGroup: deviceClass + "/" + name})
	if err != nil {
		e, msg := googleError(op, err)
		if e.Kind == nil && bareExit(msg) {
			// lvs exits 5 for a missing LV and for a missing VG alike.
			return nil, g.probe(ctx, e, deviceClass, func(googleVG) error { return ErrNotFound })
		}
		return nil, e
	}
	for _, lv := range resp.GetVolumes() {
		if lv.GetName() == name {
			v := googleVolume(deviceClass, lv)
			return &v, nil
		}
	}
	return nil, &Error{Op: op, Kind: ErrNotFound}
}

// ListVolumes lists the volume group with one lvs. Limitation of google/lvmd:
// that fails with ErrUnparsableListing for any volume group holding an
// inactive LV, which includes every VG with a thin pool (its hidden
// [lvol0_pmspare] is never active); GetVolume still works there. Hidden LVs
// ("[name]") are left out.
func (g *GoogleLVMD) ListVolumes(ctx context.Context, deviceClass string) ([]Volume, error) {
	op := "list " + deviceClass
	if err := checkLVMArgs(deviceClass); err != nil {
		return nil, &Error{Op: op, Kind: ErrInvalidArgument, Cause: err}
	}
	resp, err := g.lvm.ListLV(ctx, &lvmpb.ListLVRequest{VolumeGroup: deviceClass})
	if err != nil {
		e, msg := googleError(op, err)
		switch {
		case errors.Is(e, ErrUnparsableListing) && emptyReport(msg):
			// The daemon parses lvs' empty output as one bad line. The VG is
			// empty if it has no allocated extents; anything else is a real
			// parse failure (a warning line, say).
			var empty bool
			perr := g.probe(ctx, e, deviceClass, func(vg googleVG) error {
				if vg.free == vg.size {
					empty = true
				}
				return ErrUnparsableListing
			})
			if empty {
				return []Volume{}, nil
			}
			return nil, perr
		case e.Kind == nil && bareExit(msg):
			return nil, g.probe(ctx, e, deviceClass, func(googleVG) error { return nil })
		}
		return nil, e
	}
	vols := make([]Volume, 0, len(resp.GetVolumes()))
	for _, lv := range resp.GetVolumes() {
		if strings.HasPrefix(lv.GetName(), "[") {
			continue
		}
		vols = append(vols, googleVolume(deviceClass, lv))
	}
	return vols, nil
}

// CreateVolume runs lvcreate through the daemon, with the ownership tags as
// LVM tags, then reads the volume back: the daemon answers with lvcreate's
// output only, and LVM rounds the size up to whole extents.
func (g *GoogleLVMD) CreateVolume(ctx context.Context, req CreateRequest) (*Volume, error) {
	op := "create " + req.DeviceClass + "/" + req.Name
	if err := checkLVMArgs(req.DeviceClass, req.Name); err != nil {
		return nil, &Error{Op: op, Kind: ErrInvalidArgument, Cause: err}
	}
	if err := checkSize(req.SizeBytes); err != nil {
		return nil, &Error{Op: op, Kind: ErrInvalidArgument, Cause: err}
	}
	if req.OptionClass != "" {
		return nil, &Error{Op: op, Kind: ErrInvalidArgument,
			Cause: fmt.Errorf("google/lvmd has no lvcreate option classes (asked for %q)", req.OptionClass)}
	}
	_, err := g.lvm.CreateLV(ctx, &lvmpb.CreateLVRequest{
		VolumeGroup: req.DeviceClass, Name: req.Name, Size: uint64(req.SizeBytes), Tags: req.Tags,
	})
	if err != nil {
		e, msg := googleError(op, err)
		if e.Kind == nil && bareExit(msg) {
			// lvcreate checks the VG, then the name, then the space. Free
			// space is a whole number of extents, so "free < size" is exactly
			// "the rounded size does not fit" for a linear LV.
			return nil, g.probe(ctx, e, req.DeviceClass, func(vg googleVG) error {
				if vg.free < uint64(req.SizeBytes) {
					return fmt.Errorf("%w: volume group %s has %d bytes free, %d asked", ErrInsufficientCapacity, vg.name, vg.free, req.SizeBytes)
				}
				return nil // most likely the name exists; left untyped
			})
		}
		return nil, e
	}
	v, err := g.GetVolume(ctx, req.DeviceClass, req.Name)
	if err != nil {
		// Created, but not readable back (the caller's context ended, say):
		// report what was asked for rather than fail a create that happened.
		return &Volume{DeviceClass: req.DeviceClass, Name: req.Name, SizeBytes: req.SizeBytes,
			Tags: slices.Clone(req.Tags)}, nil
	}
	return v, nil
}

// RemoveVolume runs the daemon's RemoveLV, which first lists "vg/lv" and
// refuses volumes tagged "protected" (an untyped error here: the agent checks
// that tag itself before removing, so this only shows a race).
func (g *GoogleLVMD) RemoveVolume(ctx context.Context, deviceClass, name string) error {
	op := "remove " + deviceClass + "/" + name
	if err := checkLVMArgs(deviceClass, name); err != nil {
		return &Error{Op: op, Kind: ErrInvalidArgument, Cause: err}
	}
	_, err := g.lvm.RemoveLV(ctx, &lvmpb.RemoveLVRequest{VolumeGroup: deviceClass, Name: name})
	if err != nil {
		e, msg := googleError(op, err)
		// Only the daemon's own lvs step means "absent"; a bare failure of
		// lvremove itself (LV open, say) stays untyped.
		if e.Kind == nil && strings.Contains(msg, "failed to list LVs: ") && bareExit(msg) {
			return g.probe(ctx, e, deviceClass, func(googleVG) error { return ErrNotFound })
		}
		return e
	}
	return nil
}

// Capacity reports every volume group the daemon sees (vgs), by name.
func (g *GoogleLVMD) Capacity(ctx context.Context) ([]Capacity, error) {
	vgs, err := g.volumeGroups(ctx)
	if err != nil {
		return nil, err
	}
	caps := make([]Capacity, 0, len(vgs))
	for _, vg := range vgs {
		caps = append(caps, Capacity{DeviceClass: vg.name, SizeBytes: vg.size, FreeBytes: vg.free})
	}
	return caps, nil
}

// WatchCapacity polls Capacity every poll interval, since google/lvmd has no
// watch, and calls fn at once and then only when something changed. It stops
// at the first failed poll, as a broken watch stream would.
func (g *GoogleLVMD) WatchCapacity(ctx context.Context, fn func([]Capacity)) error {
	last, err := g.Capacity(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	fn(slices.Clone(last))
	t := time.NewTicker(g.poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		caps, err := g.Capacity(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if !slices.Equal(caps, last) {
			last = caps
			fn(slices.Clone(caps))
		}
	}
}

type googleVG struct {
	name       string
	size, free uint64
}

func (g *GoogleLVMD) volumeGroups(ctx context.Context) ([]googleVG, error) {
	resp, err := g.lvm.ListVG(ctx, &lvmpb.ListVGRequest{})
	if err != nil {
		e, _ := googleError("list volume groups", err)
		return nil, e
	}
	vgs := make([]googleVG, 0, len(resp.GetVolumeGroups()))
	for _, vg := range resp.GetVolumeGroups() {
		vgs = append(vgs, googleVG{name: vg.GetName(), size: vg.GetSize(), free: vg.GetFreeSize()})
	}
	slices.SortFunc(vgs, func(a, b googleVG) int { return strings.Compare(a.name, b.name) })
	return vgs, nil
}

// probe settles a bare lvm failure e on volume group vg by listing the volume
// groups: a VG that is not listed is an unknown device class; otherwise kind
// says what the failure means (a sentinel, or an error wrapping one whose
// text then joins the cause). When the probe itself fails, e is returned as
// it is (untyped: transient), or as unavailable when the daemon went away.
func (g *GoogleLVMD) probe(ctx context.Context, e *Error, vg string, kind func(googleVG) error) error {
	vgs, err := g.volumeGroups(ctx)
	if err != nil {
		if errors.Is(err, ErrUnavailable) {
			return &Error{Op: e.Op, Kind: ErrUnavailable, Cause: err}
		}
		return &Error{Op: e.Op, Kind: e.Kind, Cause: fmt.Errorf("%w (and listing the volume groups failed: %v)", e.Cause, err)}
	}
	for _, v := range vgs {
		if v.name == vg {
			k := kind(v)
			if sentinel := errors.Unwrap(k); sentinel != nil {
				return &Error{Op: e.Op, Kind: sentinel, Cause: fmt.Errorf("%w (%v)", e.Cause, k)}
			}
			return &Error{Op: e.Op, Kind: k, Cause: e.Cause}
		}
	}
	return &Error{Op: e.Op, Kind: ErrUnknownDeviceClass, Cause: fmt.Errorf("%w (volume group %q is not listed by vgs)", e.Cause, vg)}
}

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

// checkLVMArgs guards the daemon's command lines: google/lvmd passes names
// to lvs/lvcreate/lvremove as arguments, and "vg/lv" as one of them.
func checkLVMArgs(names ...string) error {
	for _, n := range names {
		if n == "" || n[0] == '-' {
			return fmt.Errorf("invalid LVM name %q", n)
		}
		for i := 0; i < len(n); i++ {
			if !nameChar(n[i]) {
				return fmt.Errorf("invalid LVM name %q: character %q", n, n[i])
			}
		}
	}
	return nil
}

func googleVolume(vg string, lv *lvmpb.LogicalVolume) Volume {
	var tags []string
	for _, t := range lv.GetTags() {
		if t != "" { // the daemon splits an empty lv_tags into [""]
			tags = append(tags, t)
		}
	}
	return Volume{DeviceClass: vg, Name: lv.GetName(), SizeBytes: int64(lv.GetSize()), Tags: tags,
		DevMajor: lv.GetActualDevMajorNumber(), DevMinor: lv.GetActualDevMinorNumber(),
		Attr: googleAttr(lv.GetAttributes()), Path: "/dev/" + vg + "/" + lv.GetName()}
}

// googleAttr rebuilds lvm's lv_attr string from the daemon's decoded
// attributes (the inverse of its parser's tables). The health character is
// always '-': the daemon's parser decodes it with the wrong table.
func googleAttr(a *lvmpb.LogicalVolume_Attributes) string {
	if a == nil {
		return ""
	}
	key := func(keys string, v int32) byte {
		if v <= 0 || int(v) > len(keys) {
			return '-' // MALFORMED_*: also what a plain linear LV's '-' decodes to
		}
		return keys[v-1]
	}
	flag := func(set bool, c byte) byte {
		if set {
			return c
		}
		return '-'
	}
	return string([]byte{
		key("mMoOrRsSpviIlcVtTe", int32(a.GetType())),
		key("wrR", int32(a.GetPermissions())),
		key("acilnACILN", int32(a.GetAllocation())),
		flag(a.GetFixedMinor(), 'm'),
		key("asISmMdi", int32(a.GetState())),
		flag(a.GetOpen(), 'o'),
		key("mrstuv", int32(a.GetTargetType())),
		flag(a.GetZeroing(), 'z'),
		'-',
		flag(a.GetActivationSkipped(), 's'),
	})
}
