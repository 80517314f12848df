// Command csi-sidecars stands in, for make bench-peers only, for the two
// kubernetes-csi sidecars that TopoLVM's chart runs beside its node plugin and
// that the Go module proxy does not serve at any version: node-driver-registrar
// and livenessprobe (docs/bench-peers.md). Everything else the peer runs is
// built from its own module. It does what those two do for TopoLVM on one
// node, and nothing more:
//
//	csi-node-driver-registrar --csi-address=SOCK --kubelet-registration-path=SOCK
//	    [--plugin-registration-path=/registration] [--http-endpoint=:9809]
//	  asks the CSI driver its name (Identity.GetPluginInfo), then serves
//	  kubelet's plugin-registration API (pluginregistration/v1: GetInfo,
//	  NotifyRegistrationStatus) on DIR/NAME-reg.sock: type CSIPlugin, the
//	  driver's name, the endpoint kubelet dials, CSI 1.0.0. A registration
//	  kubelet refuses ends the process (exit 1), as upstream's does, so that
//	  kubelet restarts the container. /healthz: the socket answers GetInfo.
//	livenessprobe --csi-address=SOCK [--http-endpoint=:9808] [--probe-timeout=8s]
//	  /healthz calls the driver's Identity.Probe: 200 when it answers ready.
//
// One binary; the name it is run as picks the role (the image links both
// names to it, the paths TopoLVM's chart runs), or the first argument:
// csi-sidecars registrar|livenessprobe FLAGS...
//
// It lives under scripts/ with the other build tools of the test guest: it
// is part of the benchmark's setup, not of lvm-agent.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
)

func main() {
	role, args, err := roleOf(os.Args[0], os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "csi-sidecars:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	switch role {
	case "registrar":
		err = registrarMain(ctx, args)
	case "livenessprobe":
		err = probeMain(ctx, args)
	}
	if err != nil {
		klog.ErrorS(err, "Exiting", "role", role)
		klog.Flush()
		os.Exit(1)
	}
}

// roleOf: the role the name the binary was run as picks, else the first
// argument's; and the arguments left.
func roleOf(argv0 string, args []string) (string, []string, error) {
	switch filepath.Base(argv0) {
	case "csi-node-driver-registrar":
		return "registrar", args, nil
	case "livenessprobe":
		return "livenessprobe", args, nil
	}
	if len(args) > 0 && (args[0] == "registrar" || args[0] == "livenessprobe") {
		return args[0], args[1:], nil
	}
	return "", nil, errors.New("run as csi-node-driver-registrar or livenessprobe, or with registrar|livenessprobe as the first argument")
}

func registrarMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("csi-node-driver-registrar", flag.ContinueOnError)
	var o registrarOptions
	fs.StringVar(&o.CSIAddress, "csi-address", "/run/csi/socket", "the CSI driver's socket, in this container")
	fs.StringVar(&o.KubeletRegistrationPath, "kubelet-registration-path", "", "the CSI driver's socket on the node, which kubelet dials")
	fs.StringVar(&o.RegistrationDir, "plugin-registration-path", "/registration", "kubelet's plugins_registry directory, in this container")
	httpEndpoint := fs.String("http-endpoint", "", "address of /healthz (empty: none)")
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.KubeletRegistrationPath == "" {
		return errors.New("--kubelet-registration-path is required")
	}
	o.Ready = func(socket, name string) {
		if *httpEndpoint != "" {
			serveHTTP(ctx, *httpEndpoint, registrarHealthz(socket, name))
		}
	}
	return runRegistrar(ctx, o)
}

func probeMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("livenessprobe", flag.ContinueOnError)
	csiAddress := fs.String("csi-address", "/run/csi/socket", "the CSI driver's socket")
	httpEndpoint := fs.String("http-endpoint", ":9808", "address of /healthz")
	// Upstream's default is 1 s: on the emulated test node a Probe of
	// TopoLVM's controller took longer under load, and each 500 restarted
	// it (CrashLoopBackOff in a burst). 8 s, within the 10 s the bench's
	// kubelet probes wait (scripts/peers/topolvm-values.yaml).
	timeout := fs.Duration("probe-timeout", probeTimeout, "how long a Probe call may take")
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	conn, err := dialCSI(*csiAddress)
	if err != nil {
		return err
	}
	defer conn.Close()
	klog.InfoS("Serving the CSI driver's Probe", "csiAddress", *csiAddress, "httpEndpoint", *httpEndpoint)
	serveHTTP(ctx, *httpEndpoint, probeHandler(conn, *timeout))
	<-ctx.Done()
	return nil
}

// dialCSI: a client of a CSI driver's unix socket (a path, or unix://PATH).
// grpc connects on the first call and again after a failure, so a driver
// that starts later or restarts is found.
func dialCSI(address string) (*grpc.ClientConn, error) {
	target := address
	if !strings.HasPrefix(address, "unix:") {
		target = "unix://" + address
		if !filepath.IsAbs(address) {
			target = "unix:" + address
		}
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("CSI driver at %s: %w", address, err)
	}
	return conn, nil
}

// serveHTTP serves h as /healthz on address until ctx ends; a port that
// cannot be had is fatal, as for the upstream sidecars.
func serveHTTP(ctx context.Context, address string, h http.Handler) {
	mux := http.NewServeMux()
	mux.Handle("/healthz", h)
	l, err := net.Listen("tcp", address)
	if err != nil {
		klog.ErrorS(err, "Cannot serve /healthz", "address", address)
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
}
