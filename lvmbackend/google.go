package lvmbackend

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	lvmpb "github.com/google/lvmd/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// DefaultPollInterval is how often WatchCapacity asks google/lvmd for its
// volume groups when no interval is given: the daemon has no watch of its own.
const DefaultPollInterval = 10 * time.Second

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

// ResizeVolume always fails: google/lvmd has no call that resizes an LV
// (its service is ListLV, CreateLV, RemoveLV, CloneLV, the tag calls and
// the VG calls), and the agent runs no lvm command of its own.
func (g *GoogleLVMD) ResizeVolume(_ context.Context, deviceClass, name string, _ int64) (int64, error) {
	return 0, &Error{Op: "resize " + deviceClass + "/" + name, Kind: ErrUnsupported,
		Cause: errors.New("google/lvmd has no resize call: a volume served by google/lvmd cannot grow (use topolvm's lvmd)")}
}

// SnapshotVolume: google/lvmd has no snapshot call.
func (g *GoogleLVMD) SnapshotVolume(_ context.Context, req SnapshotRequest) (*Volume, error) {
	return nil, &Error{Op: "snapshot " + req.DeviceClass + "/" + req.Source + " as " + req.Name, Kind: ErrUnsupported,
		Cause: errors.New("google/lvmd has no snapshot call: thin clones need topolvm's lvmd")}
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
