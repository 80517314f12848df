package lvmbackend

import (
	"context"
	"errors"
	"fmt"

	"github.com/topolvm/topolvm/pkg/lvmd/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Topolvm speaks to topolvm's lvmd over a unix socket.
type Topolvm struct {
	conn *grpc.ClientConn
	lv   proto.LVServiceClient
	vg   proto.VGServiceClient
}

var _ Backend = (*Topolvm)(nil)

// NewTopolvm connects lazily to the lvmd socket at path: a missing socket is
// not an error here, because lvmd may start after the agent; calls fail with
// ErrUnavailable until it is up.
func NewTopolvm(path string, opts ...grpc.DialOption) (*Topolvm, error) {
	opts = append(dialDefaults(insecure.NewCredentials()), opts...)
	conn, err := grpc.NewClient("unix://"+path, opts...)
	if err != nil {
		return nil, fmt.Errorf("lvmd client for %s: %w", path, err)
	}
	return &Topolvm{conn: conn, lv: proto.NewLVServiceClient(conn), vg: proto.NewVGServiceClient(conn)}, nil
}

// Close closes the connection.
func (t *Topolvm) Close() error { return t.conn.Close() }

// GetVolume lists the device class and picks the volume: topolvm's lvmd has no
// single-volume lookup.
func (t *Topolvm) GetVolume(ctx context.Context, deviceClass, name string) (*Volume, error) {
	vols, err := t.ListVolumes(ctx, deviceClass)
	if err != nil {
		return nil, err
	}
	return pick(vols, deviceClass, name)
}

// pick is the named volume of a device class's listing, or ErrNotFound.
func pick(vols []Volume, deviceClass, name string) (*Volume, error) {
	for i := range vols {
		if vols[i].Name == name {
			return &vols[i], nil
		}
	}
	return nil, &Error{Op: "get " + deviceClass + "/" + name, Kind: ErrNotFound}
}

// ListVolumes returns the volumes of a device class.
func (t *Topolvm) ListVolumes(ctx context.Context, deviceClass string) ([]Volume, error) {
	resp, err := t.vg.GetLVList(ctx, &proto.GetLVListRequest{DeviceClass: deviceClass})
	if err != nil {
		// On a listing, NotFound can only mean the device class or its VG.
		return nil, topolvmError("list "+deviceClass, err, ErrUnknownDeviceClass)
	}
	vols := make([]Volume, 0, len(resp.GetVolumes()))
	for _, v := range resp.GetVolumes() {
		vols = append(vols, Volume{
			DeviceClass: deviceClass, Name: v.GetName(), SizeBytes: v.GetSizeBytes(), Tags: v.GetTags(),
			DevMajor: v.GetDevMajor(), DevMinor: v.GetDevMinor(), Attr: v.GetAttr(), Path: v.GetPath(),
		})
	}
	return vols, nil
}

// CreateVolume creates a volume with lvmd's CreateLV.
func (t *Topolvm) CreateVolume(ctx context.Context, req CreateRequest) (*Volume, error) {
	if err := checkSize(req.SizeBytes); err != nil {
		return nil, &Error{Op: "create " + req.DeviceClass + "/" + req.Name, Kind: ErrInvalidArgument, Cause: err}
	}
	resp, err := t.lv.CreateLV(ctx, &proto.CreateLVRequest{
		Name: req.Name, DeviceClass: req.DeviceClass, SizeBytes: req.SizeBytes,
		Tags: req.Tags, LvcreateOptionClass: req.OptionClass,
	})
	if err != nil {
		// On CreateLV, NotFound is the device class.
		return nil, topolvmError("create "+req.DeviceClass+"/"+req.Name, err, ErrUnknownDeviceClass)
	}
	v := resp.GetVolume()
	return &Volume{DeviceClass: req.DeviceClass, Name: v.GetName(), SizeBytes: v.GetSizeBytes(),
		Tags: req.Tags, DevMajor: v.GetDevMajor(), DevMinor: v.GetDevMinor(), Attr: v.GetAttr(), Path: v.GetPath()}, nil
}

// RemoveVolume removes a volume with lvmd's RemoveLV.
func (t *Topolvm) RemoveVolume(ctx context.Context, deviceClass, name string) error {
	_, err := t.lv.RemoveLV(ctx, &proto.RemoveLVRequest{Name: name, DeviceClass: deviceClass})
	if err != nil {
		// lvmd answers NotFound for a missing LV, VG or device class alike;
		// callers list first, so here it means the LV went away meanwhile.
		return topolvmError("remove "+deviceClass+"/"+name, err, ErrNotFound)
	}
	return nil
}

// ResizeVolume grows a volume with lvmd's ResizeLV (thick and thin alike),
// which answers with the size LVM made it (whole extents).
func (t *Topolvm) ResizeVolume(ctx context.Context, deviceClass, name string, sizeBytes int64) (int64, error) {
	op := "resize " + deviceClass + "/" + name
	if err := checkSize(sizeBytes); err != nil {
		return 0, &Error{Op: op, Kind: ErrInvalidArgument, Cause: err}
	}
	resp, err := t.lv.ResizeLV(ctx, &proto.ResizeLVRequest{Name: name, DeviceClass: deviceClass, SizeBytes: sizeBytes})
	if err != nil {
		// lvmd answers NotFound for an unknown device class and for a
		// missing LV alike; the agent reads the LV before it resizes, so
		// here it means the LV went away meanwhile.
		return 0, topolvmError(op, err, ErrNotFound)
	}
	return resp.GetSizeBytes(), nil
}

// SnapshotVolume makes a thin snapshot with lvmd's CreateLVSnapshot,
// activated read-write ("rw": lvchange -k n -a y). lvmd answers NotFound
// for an unknown device class and a missing source alike (the agent lists
// the class first, so here it is the source), Unimplemented for a thick
// class or source, OutOfRange for a size below the source's. Its answer
// has no path and no lv_attr, like CreateLV's.
func (t *Topolvm) SnapshotVolume(ctx context.Context, req SnapshotRequest) (*Volume, error) {
	op := "snapshot " + req.DeviceClass + "/" + req.Source + " as " + req.Name
	if err := checkSize(req.SizeBytes); err != nil {
		return nil, &Error{Op: op, Kind: ErrInvalidArgument, Cause: err}
	}
	resp, err := t.lv.CreateLVSnapshot(ctx, &proto.CreateLVSnapshotRequest{
		Name: req.Name, DeviceClass: req.DeviceClass, SourceVolume: req.Source, SizeBytes: req.SizeBytes,
		Tags: req.Tags, AccessType: "rw",
	})
	if status.Code(err) == codes.Unimplemented {
		return nil, &Error{Op: op, Kind: ErrUnsupported, Cause: errors.New(status.Convert(err).Message())}
	}
	if err != nil {
		return nil, topolvmError(op, err, ErrNotFound)
	}
	v := resp.GetSnapshot()
	return &Volume{DeviceClass: req.DeviceClass, Name: v.GetName(), SizeBytes: v.GetSizeBytes(),
		Tags: req.Tags, DevMajor: v.GetDevMajor(), DevMinor: v.GetDevMinor()}, nil
}

// Capacity takes the first message of lvmd's Watch stream, which carries
// every device class.
func (t *Topolvm) Capacity(ctx context.Context) ([]Capacity, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var caps []Capacity
	err := t.WatchCapacity(ctx, func(c []Capacity) { caps = c; cancel() })
	if caps != nil {
		return caps, nil
	}
	return nil, err
}

// WatchCapacity follows lvmd's Watch stream.
func (t *Topolvm) WatchCapacity(ctx context.Context, fn func([]Capacity)) error {
	stream, err := t.vg.Watch(ctx, &proto.Empty{})
	if err != nil {
		return topolvmError("watch", err, ErrUnknownDeviceClass)
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return topolvmError("watch", err, ErrUnknownDeviceClass)
		}
		caps := make([]Capacity, 0, len(msg.GetItems()))
		for _, it := range msg.GetItems() {
			c := Capacity{DeviceClass: it.GetDeviceClass(), SizeBytes: it.GetSizeBytes(), FreeBytes: it.GetFreeBytes()}
			if tp := it.GetThinPool(); tp != nil {
				// A thin class's capacity is the pool's, with overprovisioning.
				c.SizeBytes, c.FreeBytes = tp.GetSizeBytes(), tp.GetOverprovisionBytes()
				c.ThinPool = &ThinPoolUsage{DataPercent: tp.GetDataPercent(), MetadataPercent: tp.GetMetadataPercent()}
				c.Thin = true
			}
			caps = append(caps, c)
		}
		fn(caps)
	}
}

// topolvmError maps lvmd's gRPC codes to typed errors (lvmd answers a
// missing VG or a failing lvm with Internal, a full device class with
// ResourceExhausted, an unknown one or a missing LV with NotFound); notFound
// says what NotFound means for this call.
func topolvmError(op string, err error, notFound error) error {
	e, st := rpcError(op, err)
	if e != nil {
		return e
	}
	var kind error
	switch st.Code() {
	case codes.NotFound:
		kind = notFound
	case codes.ResourceExhausted:
		kind = ErrInsufficientCapacity
	case codes.InvalidArgument, codes.OutOfRange, codes.Unimplemented:
		kind = ErrInvalidArgument
	case codes.Internal, codes.Unknown:
		kind = lvmRefusal(st.Message())
	}
	// Any other Internal (lvm failed, VG missing) stays untyped: transient.
	return &Error{Op: op, Kind: kind, Cause: errors.New(st.Message())}
}
