package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// supportedVersions: the CSI versions kubelet is told; upstream's registrar
// tells the same.
var supportedVersions = []string{"1.0.0"}

type registrarOptions struct {
	CSIAddress              string // the driver's socket, as this process sees it
	KubeletRegistrationPath string // the same socket, as kubelet on the node sees it
	RegistrationDir         string // kubelet's plugins_registry, as this process sees it
	// Ready, when set, is called once the registration socket serves.
	Ready func(socket, driverName string)
}

// runRegistrar asks the driver its name, serves kubelet's registration API
// on RegistrationDir/NAME-reg.sock until ctx ends (nil) or kubelet says the
// registration failed (an error), and removes the socket.
func runRegistrar(ctx context.Context, o registrarOptions) error {
	name, err := driverName(ctx, o.CSIAddress)
	if err != nil {
		return err
	}
	socket := filepath.Join(o.RegistrationDir, name+"-reg.sock")
	// A socket left by the container's last run: kubelet would find a dead one.
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	l, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("registration socket: %w", err)
	}
	defer os.Remove(socket)
	r := &registration{name: name, endpoint: o.KubeletRegistrationPath, refused: make(chan string, 1)}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, r)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	// Graceful: the answer to kubelet's NotifyRegistrationStatus that ends
	// the run is still sent; a call that hangs is cut after a while.
	defer func() {
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(5 * time.Second):
			srv.Stop()
		}
	}()
	klog.InfoS("Serving kubelet's plugin registration", "socket", socket, "driver", name, "endpoint", o.KubeletRegistrationPath)
	if o.Ready != nil {
		o.Ready(socket, name)
	}
	select {
	case <-ctx.Done():
		return nil
	case msg := <-r.refused:
		return fmt.Errorf("kubelet refused the registration of %s: %s", name, msg)
	case err := <-served:
		return fmt.Errorf("registration socket: %w", err)
	}
}

// driverName: the driver's GetPluginInfo name, asked until it answers or
// ctx ends (the driver's container may start after this one).
func driverName(ctx context.Context, csiAddress string) (string, error) {
	conn, err := dialCSI(csiAddress)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	client := csi.NewIdentityClient(conn)
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := client.GetPluginInfo(callCtx, &csi.GetPluginInfoRequest{})
		cancel()
		switch {
		case err == nil && info.GetName() != "":
			return info.GetName(), nil
		case err == nil:
			err = errors.New("the driver's GetPluginInfo has no name")
		}
		klog.InfoS("Waiting for the CSI driver", "csiAddress", csiAddress, "err", err)
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("the CSI driver at %s never said its name: %w", csiAddress, err)
		case <-time.After(wait):
		}
	}
}

// registration is kubelet's side of the handshake: kubelet finds the socket
// in plugins_registry, calls GetInfo, validates, and reports back.
type registration struct {
	registerapi.UnimplementedRegistrationServer
	name, endpoint string
	refused        chan string
}

func (r *registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.name,
		Endpoint:          r.endpoint,
		SupportedVersions: supportedVersions,
	}, nil
}

func (r *registration) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if s.GetPluginRegistered() {
		klog.InfoS("Registered with kubelet", "driver", r.name)
	} else {
		select {
		case r.refused <- s.GetError():
		default: // one reason is enough to exit
		}
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// probeTimeout: how long a /healthz waits for the socket's answer.
const probeTimeout = 8 * time.Second

// registrarHealthz: 200 when the registration socket answers GetInfo with
// the driver's name, as kubelet would call it; 500 otherwise.
func registrarHealthz(socket, name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		conn, err := dialCSI(socket)
		if err == nil {
			defer conn.Close()
			ctx, cancel := context.WithTimeout(req.Context(), probeTimeout)
			defer cancel()
			var info *registerapi.PluginInfo
			info, err = registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
			if err == nil && info.GetName() != name {
				err = fmt.Errorf("the socket says %q", info.GetName())
			}
		}
		if err != nil {
			http.Error(w, fmt.Sprintf("registration socket %s: %v", socket, err), http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "ok")
	})
}
