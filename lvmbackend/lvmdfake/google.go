package lvmdfake

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path"
	"strings"
	"sync"

	"github.com/google/lvmd/parser"
	lvmpb "github.com/google/lvmd/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// Google serves the model with google/lvmd's service (/lvm.LVM/*) over TCP,
// failing the way the real daemon at the pinned version does. Each device
// class of the model is a volume group of the same name.
//
// The real daemon runs lvs/vgs/lvcreate/lvremove and answers every failure
// with codes.Internal: "failed to list LVs: exit status 5", "failed to
// create lv: exit status 5", "failed to remove lv: failed to list LVs: exit
// status 5", ... without LVM's output. Its reports go through its own parser
// (this fake renders LVM's report lines and runs them through that very
// parser), so an empty volume group fails to list ("expected 9 components, got
// 1") and so does a thin one, whose hidden [lvol0_pmspare] has kernel major -1.
type Google struct {
	*LVM
	// CommandOutput appends LVM's output to lvcreate and lvremove failures,
	// as forks of google/lvmd do (zdnscloud/lvmd: "failed to create lv: exit
	// status 5\nCommandOutput: <lvm's text>"); set it before Serve.
	CommandOutput bool
	// TLS, when set before Serve, is the server's TLS configuration (set
	// ClientAuth to require client certificates, as lvmd's mTLS does).
	TLS *tls.Config

	mu    sync.Mutex
	srv   *grpc.Server
	calls map[string]int // by RPC method name
}

// Calls is how many calls of method (the RPC's name, "ListVG") the daemon
// has taken: a test's proof that its client asked.
func (g *Google) Calls(method string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls[method]
}

// count is a unary interceptor that counts each call by its method's name.
func (g *Google) count(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	g.mu.Lock()
	if g.calls == nil {
		g.calls = map[string]int{}
	}
	g.calls[path.Base(info.FullMethod)]++
	g.mu.Unlock()
	return handler(ctx, req)
}

// NewGoogle wraps a model.
func NewGoogle(m *LVM) *Google { return &Google{LVM: m} }

// Serve listens on addr ("127.0.0.1:0" picks a port) and serves in the
// background until Stop; it returns the bound address, which a later Serve
// may reuse to "restart" the daemon.
func (g *Google) Serve(addr string) (string, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	opts := []grpc.ServerOption{grpc.UnaryInterceptor(g.count)}
	if g.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(g.TLS)))
	}
	srv := grpc.NewServer(opts...)
	lvmpb.RegisterLVMServer(srv, &googleService{g: g})
	g.mu.Lock()
	old := g.srv
	g.srv = srv
	g.mu.Unlock()
	if old != nil {
		old.Stop()
	}
	go func() { _ = srv.Serve(l) }()
	return l.Addr().String(), nil
}

// Stop closes the listener and every connection at once, as a killed lvmd would.
func (g *Google) Stop() {
	g.mu.Lock()
	srv := g.srv
	g.srv = nil
	g.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

type googleService struct {
	lvmpb.UnimplementedLVMServer
	g *Google
}

// exit5 is how Go's os/exec renders lvm's ECMD_FAILED, which is all the
// pinned daemon reports of a failed command.
const exit5 = "exit status 5"

func internal(format string, args ...any) error {
	return status.Errorf(codes.Internal, format, args...)
}

// failed is the daemon's message for a failed lvm command run for op
// ("create lv", "remove lv"), with LVM's output when the fork style is on.
func (g *Google) failed(op, lvmOutput string) error {
	if g.CommandOutput {
		return internal("failed to %s: %s\nCommandOutput: %s", op, exit5, strings.TrimSpace(lvmOutput))
	}
	return internal("failed to %s: %s", op, exit5)
}

// listLVs is the daemon's commands.ListLV: lvs on spec ("vg" or "vg/lv"),
// then its parser on the report. The error is the one server.ListLV wraps.
func (g *Google) listLVs(spec string) ([]*parser.LV, error) {
	vg, name, one := strings.Cut(spec, "/")
	lvs, err := g.List(vg)
	if err != nil {
		if errors.Is(err, errNoClass) {
			return nil, errors.New(exit5) // Volume group "vg" not found
		}
		return nil, err // the test hook's error
	}
	var lines []string
	if one {
		for _, lv := range lvs {
			if lv.Name == name {
				lines = append(lines, lvsLine(vg, lv))
			}
		}
		if lines == nil {
			return nil, errors.New(exit5) // Failed to find logical volume "vg/lv"
		}
	} else {
		for _, lv := range lvs {
			lines = append(lines, lvsLine(vg, lv))
		}
		if u, ok := g.usage(vg); ok && u.Thin {
			// Every thin pool comes with an inactive spare for its metadata.
			lines = append(lines, lvsReportLine("[lvol0_pmspare]", vg, 4<<20, "ewi-------", "-1", "-1", nil))
		}
	}
	return parseReport(strings.Join(lines, "\n"), parser.ParseLV)
}

func (s *googleService) ListLV(_ context.Context, req *lvmpb.ListLVRequest) (*lvmpb.ListLVReply, error) {
	lvs, err := s.g.listLVs(req.GetVolumeGroup())
	if err != nil {
		return nil, internal("failed to list LVs: %v", err)
	}
	reply := &lvmpb.ListLVReply{}
	for _, lv := range lvs {
		reply.Volumes = append(reply.Volumes, lv.ToProto())
	}
	return reply, nil
}

func (s *googleService) CreateLV(_ context.Context, req *lvmpb.CreateLVRequest) (*lvmpb.CreateLVReply, error) {
	vg, name, size := req.GetVolumeGroup(), req.GetName(), req.GetSize()
	if size == 0 {
		return nil, internal("failed to create lv: size must be greater than 0")
	}
	// lvcreate -L <size>b takes any byte count; the model wants 4 KiB units
	// and rounds to extents itself, which gives LVM's result.
	lv, err := s.g.Create(vg, name, (size+4095)/4096*4096, req.GetTags())
	switch {
	case err == nil:
		return &lvmpb.CreateLVReply{CommandOutput: fmt.Sprintf("  Logical volume %q created.\n", lv.Name)}, nil
	case errors.Is(err, errNoClass):
		return nil, s.g.failed("create lv", fmt.Sprintf("  Volume group %q not found\n  Cannot process volume group %s\n", vg, vg))
	case errors.Is(err, errExists):
		return nil, s.g.failed("create lv", fmt.Sprintf("  Logical Volume %q already exists in volume group %q\n", name, vg))
	case errors.Is(err, errNoSpace):
		u, _ := s.g.usage(vg)
		need := (size + ExtentSize - 1) / ExtentSize
		if u.Thin {
			return nil, s.g.failed("create lv", fmt.Sprintf("  Cannot create new thin volume, free space in thin pool %s/pool reached threshold.\n", vg))
		}
		return nil, s.g.failed("create lv", fmt.Sprintf("  Volume group %q has insufficient free space (%d extents): %d required.\n", vg, u.Free/ExtentSize, need))
	}
	return nil, internal("failed to create lv: %v", err) // the test hook's error
}

func (s *googleService) RemoveLV(_ context.Context, req *lvmpb.RemoveLVRequest) (*lvmpb.RemoveLVReply, error) {
	vg, name := req.GetVolumeGroup(), req.GetName()
	// Like commands.RemoveLV: list "vg/lv" first, refuse "protected".
	lvs, err := s.g.listLVs(vg + "/" + name)
	if err != nil {
		return nil, internal("failed to remove lv: failed to list LVs: %v", err)
	}
	if len(lvs) != 1 {
		return nil, internal("failed to remove lv: expected 1 LV, got %d", len(lvs))
	}
	for _, t := range lvs[0].Tags {
		if t == "protected" {
			return nil, internal("failed to remove lv: volume is protected")
		}
	}
	switch err := s.g.Remove(vg, name); {
	case err == nil:
		return &lvmpb.RemoveLVReply{CommandOutput: fmt.Sprintf("  Logical volume %q successfully removed.\n", name)}, nil
	case errors.Is(err, errNoClass):
		return nil, s.g.failed("remove lv", fmt.Sprintf("  Volume group %q not found\n  Cannot process volume group %s\n", vg, vg))
	case errors.Is(err, errNotFound):
		return nil, s.g.failed("remove lv", fmt.Sprintf("  Failed to find logical volume \"%s/%s\"\n", vg, name))
	default:
		return nil, internal("failed to remove lv: %v", err) // the test hook's error
	}
}

func (s *googleService) ListVG(context.Context, *lvmpb.ListVGRequest) (*lvmpb.ListVGReply, error) {
	var lines []string
	for _, u := range s.g.Usage() {
		lines = append(lines, strings.Join([]string{
			field("VG_NAME", u.Class), field("VG_SIZE", fmt.Sprint(u.Size)), field("VG_FREE", fmt.Sprint(u.Free)),
			field("VG_UUID", fakeUUID("vg/"+u.Class)), field("VG_TAGS", ""),
		}, "<:SEP:>"))
	}
	vgs, err := parseReport(strings.Join(lines, "\n"), parser.ParseVG)
	if err != nil {
		return nil, internal("failed to list LVs: %v", err) // sic: the daemon says LVs
	}
	reply := &lvmpb.ListVGReply{}
	for _, vg := range vgs {
		reply.VolumeGroups = append(reply.VolumeGroups, vg.ToProto())
	}
	return reply, nil
}

// parseReport is what the daemon's commands package does with lvs/vgs
// output: one parser call per line of the trimmed text, so that an empty
// report is one empty, malformed line.
func parseReport[T any](out string, parse func(string) (*T, error)) ([]*T, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	items := make([]*T, len(lines))
	for i, line := range lines {
		item, err := parse(strings.TrimSpace(line))
		if err != nil {
			return nil, err
		}
		items[i] = item
	}
	return items, nil
}

// lvsLine renders an LV as lvs --nameprefixes --units=b --nosuffix does for
// the daemon's columns.
func lvsLine(vg string, lv LV) string {
	return lvsReportLine(lv.Name, vg, lv.SizeBytes, lv.Attr, fmt.Sprint(lv.Major), fmt.Sprint(lv.Minor), lv.Tags)
}

func lvsReportLine(name, vg string, size uint64, attr, major, minor string, tags []string) string {
	return strings.Join([]string{
		field("LV_NAME", name), field("LV_SIZE", fmt.Sprint(size)), field("LV_UUID", fakeUUID(vg+"/"+name)),
		field("LV_ATTR", attr), field("COPY_PERCENT", ""), field("LV_KERNEL_MAJOR", major),
		field("LV_KERNEL_MINOR", minor), field("LV_TAGS", strings.Join(tags, ",")), field("VG_NAME", vg),
	}, "<:SEP:>")
}

func field(key, value string) string { return "LVM2_" + key + "='" + value + "'" }

// fakeUUID makes a stable LVM-looking UUID (6-4-4-4-4-4-6 characters).
func fakeUUID(seed string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	sum := sha256.Sum256([]byte(seed))
	var b strings.Builder
	for i, n := range []int{6, 4, 4, 4, 4, 4, 6} {
		if i > 0 {
			b.WriteByte('-')
		}
		for j := 0; j < n; j++ {
			b.WriteByte(alphabet[int(sum[b.Len()%len(sum)])%len(alphabet)])
		}
	}
	return b.String()
}
