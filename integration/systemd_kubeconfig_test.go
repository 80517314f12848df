package integration

import (
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/lvm-agent/lvm-agent/integration/harness"
)

// docs/install.md's recipe for the systemd agent's kubeconfig, with real
// kubectl against a real API server that authorizes with RBAC (the token
// variant: a Secret-held token needs kube-controller-manager, which this
// control plane lacks).
func TestSystemdKubeconfigRecipe(t *testing.T) {
	rcp := harness.StartControlPlaneWith(t, 2*time.Minute, harness.Options{Authorization: "RBAC"})
	kubectl := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
	dir := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(kubectl, args...).CombinedOutput()
		require.NoError(t, err, "kubectl %s: %s", strings.Join(args, " "), out)
		return strings.TrimSpace(string(out))
	}
	// The admin's kubeconfig names its CA by file, as many do (the test
	// node's does): the recipe must read it either way.
	cfg, err := clientcmd.LoadFromFile(rcp.Kubeconfig)
	require.NoError(t, err)
	cluster := cfg.Clusters[cfg.Contexts[cfg.CurrentContext].Cluster]
	cluster.CertificateAuthority = filepath.Join(dir, "admin-ca.crt")
	require.NoError(t, os.WriteFile(cluster.CertificateAuthority, cluster.CertificateAuthorityData, 0o600))
	cluster.CertificateAuthorityData = nil
	require.NoError(t, clientcmd.WriteToFile(*cfg, filepath.Join(dir, "admin.kubeconfig")))
	admin := "--kubeconfig=" + filepath.Join(dir, "admin.kubeconfig")

	run(admin, "apply", "-f", "../deploy/base/namespace.yaml", "-f", "../deploy/base/rbac.yaml")
	token := run(admin, "-n", "lvm-agent", "create", "token", "lvm-agent", "--duration=8760h")
	server := run(admin, "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}")
	caData := run(admin, "config", "view", "--minify", "--flatten", "-o", "jsonpath={.clusters[0].cluster.certificate-authority-data}")
	pem, err := base64.StdEncoding.DecodeString(caData)
	require.NoError(t, err)
	require.NotEmpty(t, pem, "the admin's CA")
	ca := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(ca, pem, 0o600))

	k := "--kubeconfig=" + filepath.Join(dir, "lvm-agent.kubeconfig")
	run("config", k, "set-cluster", "cluster", "--server="+server, "--certificate-authority="+ca, "--embed-certs=true")
	run("config", k, "set-credentials", "lvm-agent", "--token="+token)
	run("config", k, "set-context", "lvm-agent", "--cluster=cluster", "--user=lvm-agent")
	run("config", k, "use-context", "lvm-agent")
	require.NoError(t, os.Remove(ca), "the CA is embedded")

	assert.Equal(t, "yes", run(k, "auth", "can-i", "patch", "persistentvolumeclaims"))
	out, _ := exec.Command(kubectl, k, "auth", "can-i", "delete", "persistentvolumeclaims").CombinedOutput()
	assert.Equal(t, "no", strings.TrimSpace(string(out)))
	// The agent's own client reads it (the CLI, as the agent, with its identity).
	code, stdout, _ := runBin(t, nil, "volume", "status", "--backend", "none", "--node", "node-systemd", k)
	assert.Equal(t, 0, code)
	assert.Contains(t, stdout, "node node-systemd: 0 rows")
}
