package lvmdfake

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"

	"github.com/topolvm/topolvm/pkg/lvmd/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Topolvm serves the model with topolvm lvmd's services and error codes:
// unknown device class → NotFound, not enough space → ResourceExhausted,
// existing name or any lvm failure → Internal, missing LV on remove or
// resize → NotFound.
type Topolvm struct {
	*LVM
	mu   sync.Mutex
	srv  *grpc.Server
	path string
}

// NewTopolvm wraps a model.
func NewTopolvm(m *LVM) *Topolvm { return &Topolvm{LVM: m} }

// Serve listens on a unix socket at path and serves in the background until Stop.
func (t *Topolvm) Serve(path string) error {
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	proto.RegisterLVServiceServer(srv, lvService{m: t.LVM})
	proto.RegisterVGServiceServer(srv, vgService{m: t.LVM})
	t.mu.Lock()
	t.srv, t.path = srv, path
	t.mu.Unlock()
	go func() { _ = srv.Serve(l) }()
	return nil
}

// Stop closes the socket and every connection at once, as a killed lvmd would.
func (t *Topolvm) Stop() {
	t.mu.Lock()
	srv, path := t.srv, t.path
	t.srv = nil
	t.mu.Unlock()
	if srv != nil {
		srv.Stop()
		_ = os.Remove(path)
	}
}

type lvService struct {
	m *LVM
	proto.UnimplementedLVServiceServer
}

type vgService struct {
	m *LVM
	proto.UnimplementedVGServiceServer
}

func (s lvService) CreateLV(_ context.Context, req *proto.CreateLVRequest) (*proto.CreateLVResponse, error) {
	if req.GetSizeBytes() < 0 {
		return nil, status.Error(codes.Internal, "invalid size")
	}
	if oc := req.GetLvcreateOptionClass(); oc != "" && !s.m.optionClass(oc) {
		return nil, status.Error(codes.Internal, "unsupported lvcreate-option-class target: "+oc)
	}
	// Like lvmd, finish the lvm command even when the client goes away.
	lv, err := s.m.Create(req.GetDeviceClass(), req.GetName(), uint64(req.GetSizeBytes()), req.GetTags())
	if err != nil {
		return nil, topolvmStatus(err)
	}
	return &proto.CreateLVResponse{Volume: &proto.LogicalVolume{Name: lv.Name, SizeBytes: int64(lv.SizeBytes),
		DevMajor: lv.Major, DevMinor: lv.Minor}}, nil
}

func (s lvService) RemoveLV(_ context.Context, req *proto.RemoveLVRequest) (*proto.Empty, error) {
	if err := s.m.Remove(req.GetDeviceClass(), req.GetName()); err != nil {
		return nil, topolvmStatus(err)
	}
	return &proto.Empty{}, nil
}

// ResizeLV grows an LV like lvmd: NotFound for an unknown class or LV,
// ResourceExhausted when the class cannot hold the growth, the LV's size
// (unchanged) when it is already at least the asked size.
func (s lvService) ResizeLV(_ context.Context, req *proto.ResizeLVRequest) (*proto.ResizeLVResponse, error) {
	if req.GetSizeBytes() < 0 {
		return nil, status.Error(codes.Internal, "invalid size")
	}
	lv, err := s.m.Resize(req.GetDeviceClass(), req.GetName(), uint64(req.GetSizeBytes()))
	if err != nil {
		return nil, topolvmStatus(err)
	}
	return &proto.ResizeLVResponse{SizeBytes: int64(lv.SizeBytes)}, nil
}

// CreateLVSnapshot is lvmd's thin snapshot (LVM.Snapshot), answered as
// lvmd answers: the snapshot's name, size and device numbers, no path.
func (s lvService) CreateLVSnapshot(_ context.Context, req *proto.CreateLVSnapshotRequest) (*proto.CreateLVSnapshotResponse, error) {
	lv, err := s.m.Snapshot(req.GetDeviceClass(), req.GetName(), req.GetSourceVolume(), uint64(req.GetSizeBytes()), req.GetTags(), req.GetAccessType())
	if err != nil {
		return nil, topolvmStatus(err)
	}
	return &proto.CreateLVSnapshotResponse{Snapshot: &proto.LogicalVolume{Name: lv.Name, SizeBytes: int64(lv.SizeBytes),
		DevMajor: lv.Major, DevMinor: lv.Minor}}, nil
}

func (s vgService) GetLVList(_ context.Context, req *proto.GetLVListRequest) (*proto.GetLVListResponse, error) {
	lvs, err := s.m.List(req.GetDeviceClass())
	if err != nil {
		return nil, topolvmStatus(err)
	}
	resp := &proto.GetLVListResponse{}
	// lvmd reports lv_path, which LVM makes of the VG, not the device class.
	vg := s.m.vg(req.GetDeviceClass())
	for _, lv := range lvs {
		resp.Volumes = append(resp.Volumes, &proto.LogicalVolume{Name: lv.Name, SizeBytes: int64(lv.SizeBytes),
			Tags: lv.Tags, DevMajor: lv.Major, DevMinor: lv.Minor, Attr: lv.Attr, Path: "/dev/" + vg + "/" + lv.Name})
	}
	return resp, nil
}

func (s vgService) GetFreeBytes(_ context.Context, req *proto.GetFreeBytesRequest) (*proto.GetFreeBytesResponse, error) {
	if u, ok := s.m.usage(req.GetDeviceClass()); ok {
		return &proto.GetFreeBytesResponse{FreeBytes: u.Free}, nil
	}
	return nil, status.Errorf(codes.NotFound, "%v: %s", errNoClass, req.GetDeviceClass())
}

// Watch sends the usage at once and after every change, like lvmd.
func (s vgService) Watch(_ *proto.Empty, stream grpc.ServerStreamingServer[proto.WatchResponse]) error {
	ch, cancel := s.m.Subscribe()
	defer cancel()
	for {
		resp := &proto.WatchResponse{}
		for _, u := range s.m.Usage() {
			item := &proto.WatchItem{DeviceClass: u.Class, SizeBytes: u.Size, FreeBytes: u.Free}
			if u.Thin {
				item.ThinPool = &proto.ThinPoolItem{SizeBytes: u.Size, OverprovisionBytes: u.Free,
					DataPercent: 100 * float64(u.Written) / float64(max(u.Size, 1)), MetadataPercent: u.MetadataPercent}
			}
			resp.Items = append(resp.Items, item)
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
		select {
		case <-ch:
		case <-stream.Context().Done():
			return nil
		}
	}
}

func topolvmStatus(err error) error {
	switch {
	case errors.Is(err, errNoClass), errors.Is(err, errNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, errNoSpace):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, errUnimplemented):
		return status.Error(codes.Unimplemented, err.Error())
	case errors.Is(err, errTooSmall):
		return status.Error(codes.OutOfRange, err.Error())
	default:
		return status.Error(codes.Internal, err.Error())
	}
}
