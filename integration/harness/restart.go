package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Options are what a test needs from a control plane of its own, beyond
// what the shared one (StartControlPlane) gives.
type Options struct {
	// Authorization is kube-apiserver's --authorization-mode; "" is
	// envtest's default, RBAC, as in a cluster. (StartDevCluster lets every
	// request through, which a test of the agent's role cannot use.)
	Authorization string
	// Restartable keeps the API server's certificates and keys in a
	// directory of the test's own, so that RestartAPIServer brings it back
	// with the same serving CA, client CA and service account keys: every
	// kubeconfig and token stays valid across the restart. (envtest's default
	// is a fresh temporary directory, removed on stop: new certificates.)
	Restartable bool
	// Args are more kube-apiserver flags, name (without "--") → value.
	Args map[string]string
}

// StartControlPlaneWith starts an etcd + kube-apiserver of the test's own,
// configured like StartDevCluster's but for o, and stops it when the test ends.
func StartControlPlaneWith(t TB, startTimeout time.Duration, o Options) *ControlPlane {
	t.Helper()
	dir := t.TempDir()
	deadline := time.Now().Add(startTimeout)
	env, err := newEnvironment("", startTimeout)
	if err != nil {
		t.Fatalf("%v", err)
	}
	api := env.ControlPlane.GetAPIServer()
	args := api.Configure()
	if o.Authorization != "" {
		args.Set("authorization-mode", o.Authorization)
	}
	for k, v := range o.Args {
		args.Set(k, v)
	}
	if o.Restartable {
		// On SIGTERM, kube-apiserver drains open watches only when this is
		// set; otherwise its HTTP server waits a fixed 60 s for them to end.
		args.Set("shutdown-watch-termination-grace-period", "5s")
		api.CertDir = filepath.Join(dir, "apiserver")
		if err := os.MkdirAll(api.CertDir, 0o700); err != nil {
			t.Fatalf("%v", err)
		}
	}
	cp, err := startEnvironment(env, dir, deadline)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	return cp
}

// RestartAPIServer stops kube-apiserver — with SIGTERM, as a rolling update
// would, or when crash is set with SIGKILL, as the OOM killer would (requests
// it had stored may then go unanswered) — keeps it down for down, and starts
// it again on the same address, with the same certificates and the same etcd
// (which keeps running), then waits until it is ready. The control plane
// must have been started Restartable.
func (cp *ControlPlane) RestartAPIServer(ctx context.Context, down time.Duration, crash bool) error {
	api := cp.Env.ControlPlane.GetAPIServer()
	if api.CertDir == "" {
		return fmt.Errorf("the control plane was not started Restartable")
	}
	if crash {
		pid, err := cp.APIServerPID()
		if err != nil {
			return err
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			return err
		}
	}
	// After a SIGKILL, Stop may race the process's exit being noticed (it
	// then fails to signal it); once noticed, Stop has nothing to do.
	var err error
	for i := 0; i < 50; i++ {
		if err = api.Stop(); err == nil || !crash {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("stop kube-apiserver: %w", err)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(down):
	}
	if err := api.Start(); err != nil {
		return fmt.Errorf("start kube-apiserver again: %w", err)
	}
	return WaitReady(ctx, cp.Client)
}

// APIServerPID is the process id of the control plane's kube-apiserver
// (a new one after each restart): envtest keeps its process to itself, but
// the certificate directory, unique to a Restartable control plane, names it
// on its command line.
func (cp *ControlPlane) APIServerPID() (int, error) {
	certDir := cp.Env.ControlPlane.GetAPIServer().CertDir
	if certDir == "" {
		return 0, fmt.Errorf("the control plane was not started Restartable")
	}
	return findPID("kube-apiserver", "--cert-dir="+certDir, func(a string) bool { return a == "--cert-dir="+certDir })
}

// EtcdPID is the process id of the control plane's etcd, found like
// APIServerPID's by its data directory, which is unique to it.
func (cp *ControlPlane) EtcdPID() (int, error) {
	dir := cp.Env.ControlPlane.Etcd.DataDir
	if dir == "" {
		return 0, fmt.Errorf("the control plane's etcd has no data directory")
	}
	return findPID("etcd", "data directory "+dir, func(a string) bool { return strings.Contains(a, dir) })
}

// findPID is the process id of the process running the binary named name
// with an argument for which arg is true (what describes that argument).
func findPID(name, what string, arg func(string) bool) (int, error) {
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		return 0, err
	}
	for _, p := range procs {
		raw, err := os.ReadFile(p)
		if err != nil {
			continue // gone meanwhile
		}
		args := strings.Split(string(raw), "\x00")
		if filepath.Base(args[0]) != name || !slices.ContainsFunc(args, arg) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err != nil {
			continue
		}
		return pid, nil
	}
	return 0, fmt.Errorf("no %s process with %s", name, what)
}

// StartObserver starts a second kube-apiserver on cp's etcd, without a watch
// cache, that the test never restarts, and returns an admin config for it.
// A watch through it never breaks when cp's API server restarts, and resumes
// from any resourceVersion etcd still holds, so an observer sees every
// change — those made while cp's API server was down or restarting too —
// while the code under test keeps talking to cp's (cached) API server.
func (cp *ControlPlane) StartObserver(t TB) *rest.Config {
	t.Helper()
	main := cp.Env.ControlPlane.GetAPIServer()
	obs := &envtest.APIServer{EtcdURL: cp.Env.ControlPlane.Etcd.URL, Path: main.Path,
		StartTimeout: main.StartTimeout, StopTimeout: main.StopTimeout, CertDir: filepath.Join(t.TempDir(), "observer")}
	if err := os.MkdirAll(obs.CertDir, 0o700); err != nil {
		t.Fatalf("%v", err)
	}
	args := obs.Configure()
	loopbackOnly(args)
	args.Set("watch-cache", "false")
	args.Set("shutdown-watch-termination-grace-period", "5s")
	if err := obs.Start(); err != nil {
		t.Fatalf("start the observer kube-apiserver: %v", err)
	}
	t.Cleanup(func() { _ = obs.Stop() })
	cfg, err := obs.SecureServing.AddUser(envtest.User{Name: "observer", Groups: []string{"system:masters"}}, &rest.Config{})
	if err != nil {
		t.Fatalf("observer user: %v", err)
	}
	cfg.Host = obs.SecureServing.URL("https", "").String()
	cfg.CAData = obs.SecureServing.CA
	cfg.QPS, cfg.Burst = 500, 1000
	return cfg
}
