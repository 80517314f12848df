package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

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
}

// StartControlPlaneWith starts an etcd + kube-apiserver of the test's own,
// configured like StartDevCluster's but for o, and stops it when the test ends.
func StartControlPlaneWith(t TB, startTimeout time.Duration, o Options) *ControlPlane {
	t.Helper()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	for _, bin := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(assets, bin)); err != nil {
			t.Fatalf("assets directory %q has no %s (run scripts/kube-assets.sh): %v", assets, bin, err)
		}
	}
	dir := t.TempDir()
	deadline := time.Now().Add(startTimeout)
	env := &envtest.Environment{BinaryAssetsDirectory: assets, ControlPlaneStartTimeout: startTimeout, ControlPlaneStopTimeout: time.Minute}
	api := env.ControlPlane.GetAPIServer()
	args := api.Configure()
	args.Set("endpoint-reconciler-type", "none")
	args.Set("advertise-address", "127.0.0.1")
	if o.Authorization != "" {
		args.Set("authorization-mode", o.Authorization)
	}
	if o.Restartable {
		api.CertDir = filepath.Join(dir, "apiserver")
		if err := os.MkdirAll(api.CertDir, 0o700); err != nil {
			t.Fatalf("%v", err)
		}
	}
	if _, err := env.Start(); err != nil && env.Config == nil {
		_ = env.Stop()
		t.Fatalf("start etcd + kube-apiserver: %v", err)
	}
	cp, err := finishDevCluster(env, dir, deadline)
	if err != nil {
		_ = env.Stop()
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	return cp
}

// RestartAPIServer stops kube-apiserver (SIGTERM, as a rolling update
// would), keeps it down for down, and starts it again on the same address,
// with the same certificates and the same etcd (which keeps running), then
// waits until it is ready. The control plane must have been started
// Restartable.
func (cp *ControlPlane) RestartAPIServer(ctx context.Context, down time.Duration) error {
	api := cp.Env.ControlPlane.GetAPIServer()
	if api.CertDir == "" {
		return fmt.Errorf("the control plane was not started Restartable")
	}
	if err := api.Stop(); err != nil {
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
