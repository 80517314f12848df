package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// fakeDriver is a CSI driver's Identity service on a real unix socket.
type fakeDriver struct {
	csi.UnimplementedIdentityServer
	name     string
	ready    *wrapperspb.BoolValue
	probeErr error
}

func (d *fakeDriver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: d.name, VendorVersion: "test"}, nil
}

func (d *fakeDriver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if d.probeErr != nil {
		return nil, d.probeErr
	}
	return &csi.ProbeResponse{Ready: d.ready}, nil
}

// shortDir: a directory for unix sockets, whose paths may not exceed 107
// bytes (t.TempDir's names are long).
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "csi")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// serveDriver serves d on socket until the test ends.
func serveDriver(t *testing.T, socket string, d *fakeDriver) {
	t.Helper()
	l, err := net.Listen("unix", socket)
	require.NoError(t, err)
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, d)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
}

// kubelet is what kubelet's plugin watcher does with a socket it finds in
// plugins_registry: GetInfo, then NotifyRegistrationStatus.
func kubelet(t *testing.T, socket string) registerapi.RegistrationClient {
	t.Helper()
	conn, err := dialCSI(socket)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return registerapi.NewRegistrationClient(conn)
}

const endpoint = "/var/lib/kubelet/plugins/topolvm.io/node/csi-topolvm.sock"

// startRegistrar runs the registrar against a driver socket and returns the
// registration socket once it serves, and the run's result.
func startRegistrar(t *testing.T, ctx context.Context, driverSocket string) (string, <-chan error) {
	t.Helper()
	return startRegistrarIn(t, ctx, driverSocket, shortDir(t))
}

func startRegistrarIn(t *testing.T, ctx context.Context, driverSocket, regDir string) (string, <-chan error) {
	t.Helper()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- runRegistrar(ctx, registrarOptions{
			CSIAddress: driverSocket, KubeletRegistrationPath: endpoint, RegistrationDir: regDir,
			Ready: func(socket, _ string) { ready <- socket },
		})
	}()
	select {
	case socket := <-ready:
		assert.Equal(t, filepath.Join(regDir, "topolvm.io-reg.sock"), socket, "kubelet's convention: DRIVER-reg.sock")
		return socket, done
	case err := <-done:
		t.Fatalf("the registrar ended before serving: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the registration socket never served")
	}
	return "", nil
}

func healthz(t *testing.T, h http.Handler) int {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	return rec.Code
}

// kubelet's handshake: the answer names the driver, its node socket and a
// CSI version kubelet accepts; a registration kubelet accepts keeps it
// running, healthy; at the end the socket is gone and the health check fails.
func TestRegistrarRegisters(t *testing.T) {
	dir := shortDir(t)
	serveDriver(t, filepath.Join(dir, "csi.sock"), &fakeDriver{name: "topolvm.io"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	socket, done := startRegistrar(t, ctx, filepath.Join(dir, "csi.sock"))

	k := kubelet(t, socket)
	info, err := k.GetInfo(ctx, &registerapi.InfoRequest{})
	require.NoError(t, err)
	assert.Equal(t, "CSIPlugin", info.GetType())
	assert.Equal(t, "topolvm.io", info.GetName())
	assert.Equal(t, endpoint, info.GetEndpoint())
	assert.Equal(t, []string{"1.0.0"}, info.GetSupportedVersions())
	_, err = k.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true})
	require.NoError(t, err)

	h := registrarHealthz(socket, "topolvm.io")
	assert.Equal(t, http.StatusOK, healthz(t, h))
	assert.Equal(t, http.StatusInternalServerError, healthz(t, registrarHealthz(socket, "other.io")), "another driver's name is not ours")
	select {
	case err := <-done:
		t.Fatalf("an accepted registration ended the registrar: %v", err)
	case <-time.After(100 * time.Millisecond):
	}

	cancel()
	require.NoError(t, <-done)
	assert.NoFileExists(t, socket)
	assert.Equal(t, http.StatusInternalServerError, healthz(t, h))
}

// A registration kubelet refuses ends the run with kubelet's reason (the
// process exits 1 and kubelet restarts the container, as upstream's).
func TestRegistrarRefused(t *testing.T) {
	dir := shortDir(t)
	serveDriver(t, filepath.Join(dir, "csi.sock"), &fakeDriver{name: "topolvm.io"})
	socket, done := startRegistrar(t, context.Background(), filepath.Join(dir, "csi.sock"))
	_, err := kubelet(t, socket).NotifyRegistrationStatus(context.Background(),
		&registerapi.RegistrationStatus{PluginRegistered: false, Error: "no supported version"})
	require.NoError(t, err)
	select {
	case err := <-done:
		require.Error(t, err)
		assert.Contains(t, err.Error(), "no supported version")
	case <-time.After(10 * time.Second):
		t.Fatal("a refused registration did not end the registrar")
	}
	assert.NoFileExists(t, socket)
}

// The driver's container may start after the registrar's: it waits for the
// driver's name, and a stale socket of a last run is replaced.
func TestRegistrarWaitsForDriver(t *testing.T) {
	dir := shortDir(t)
	driver := filepath.Join(dir, "csi.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, &fakeDriver{name: "topolvm.io"})
	t.Cleanup(srv.Stop)
	go func() {
		time.Sleep(300 * time.Millisecond)
		if l, err := net.Listen("unix", driver); err == nil {
			_ = srv.Serve(l)
		}
	}()
	regDir := shortDir(t)
	require.NoError(t, os.WriteFile(filepath.Join(regDir, "topolvm.io-reg.sock"), nil, 0o600), "a stale socket")
	socket, done := startRegistrarIn(t, ctx, driver, regDir)
	info, err := kubelet(t, socket).GetInfo(ctx, &registerapi.InfoRequest{})
	require.NoError(t, err)
	assert.Equal(t, "topolvm.io", info.GetName())
	cancel()
	require.NoError(t, <-done)

	// Never answering: the run ends with ctx, an error naming the socket.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	err = runRegistrar(ctx2, registrarOptions{CSIAddress: filepath.Join(dir, "none.sock"), KubeletRegistrationPath: endpoint, RegistrationDir: dir})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "none.sock")
}

// /healthz of the liveness probe is the driver's Probe answer.
func TestLivenessProbe(t *testing.T) {
	for _, tc := range []struct {
		name   string
		driver *fakeDriver // nil: nothing listens
		want   int
	}{
		{"ready", &fakeDriver{ready: wrapperspb.Bool(true)}, http.StatusOK},
		{"no readiness field means ready", &fakeDriver{}, http.StatusOK},
		{"not ready", &fakeDriver{ready: wrapperspb.Bool(false)}, http.StatusInternalServerError},
		{"Probe fails", &fakeDriver{probeErr: status.Error(codes.FailedPrecondition, "lvmd is down")}, http.StatusInternalServerError},
		{"no driver", nil, http.StatusInternalServerError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			socket := filepath.Join(shortDir(t), "csi.sock")
			if tc.driver != nil {
				serveDriver(t, socket, tc.driver)
			}
			conn, err := dialCSI(socket)
			require.NoError(t, err)
			defer conn.Close()
			assert.Equal(t, tc.want, healthz(t, probeHandler(conn, time.Second)))
		})
	}
}

func TestRoleOf(t *testing.T) {
	for _, tc := range []struct {
		argv0, role string
		args, left  []string
	}{
		{"/csi-node-driver-registrar", "registrar", []string{"--csi-address=x"}, []string{"--csi-address=x"}},
		{"/livenessprobe", "livenessprobe", []string{"--csi-address=x"}, []string{"--csi-address=x"}},
		{"./csi-sidecars", "livenessprobe", []string{"livenessprobe", "-v=2"}, []string{"-v=2"}},
	} {
		role, left, err := roleOf(tc.argv0, tc.args)
		require.NoError(t, err)
		assert.Equal(t, tc.role, role)
		assert.Equal(t, tc.left, left)
	}
	_, _, err := roleOf("/csi-sidecars", []string{"--csi-address=x"})
	assert.Error(t, err)
}
