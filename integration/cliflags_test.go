package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/lvm-agent/lvm-agent/integration/harness"
)

// runBin runs the lvm-agent binary with args and exactly the environment
// env (plus PATH), and returns its exit code, stdout and stderr.
func runBin(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentBin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		require.NoError(t, err)
	}
	t.Logf("lvm-agent %s: exit %d\n%s%s", strings.Join(args, " "), cmd.ProcessState.ExitCode(), stdout.String(), stderr.String())
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

func TestCLIHelpVersionAndUsageExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string // in stdout
		err  string // in stderr
	}{
		{args: []string{"--help"}, code: 0, out: "-metrics-address"},
		{args: []string{"-h"}, code: 0, out: "-log-format"},
		{args: []string{"--no-such-flag"}, code: 2, err: "flag provided but not defined"},
		{args: []string{"--log-format=xml", "--node-name=n"}, code: 2, err: "--log-format must be text or json"},
		{args: []string{"--version"}, code: 0, out: "commit: "},
		{args: []string{"volume", "--help"}, code: 0, out: "lvm-agent volume status"},
		{args: []string{"volume", "help"}, code: 0, out: "lvm-agent volume create"},
		{args: []string{"volume"}, code: 2, err: "Usage:"},
		{args: []string{"volume", "frobnicate"}, code: 2, err: "Usage:"},
		{args: []string{"volume", "create", "--help"}, code: 0, out: "-namespace"},
		{args: []string{"volume", "delete", "-h"}, code: 0, out: "-context"},
		{args: []string{"volume", "status", "--help"}, code: 0, out: "-output"},
		{args: []string{"volume", "status", "--no-such-flag"}, code: 2, err: "flag provided but not defined"},
		// A name no CSIDriver can carry is refused before anything connects.
		{args: []string{"provisioner", "--name=example.com/lvm", "--namespace=ns", "--kubeconfig=/nonexistent"}, code: 1, err: "not a DNS-1123 subdomain"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errOut := runBin(t, nil, tc.args...)
			assert.Equal(t, tc.code, code)
			assert.Contains(t, out, tc.out)
			assert.Contains(t, errOut, tc.err)
		})
	}
	// The binary is built as `make build` builds it (harness.AgentBinary,
	// scripts/version.sh): a release name and a commit hash, never the
	// "(devel)" / "unknown" of a build without the linker flags.
	_, out, _ := runBin(t, nil, "--version")
	assert.Regexp(t, `(?m)\Alvm-agent v\d+\.\d+\.\d+\S*\ncommit: [0-9a-f]{40}( \(modified\))?.*\ngo: go1\.\d+`, out)
	assert.NotContains(t, out, "unknown")
	assert.NotContains(t, out, "(devel)")

	// The agent's start-up line names the same version.
	version, _, _ := strings.Cut(strings.TrimPrefix(out, "lvm-agent "), "\n")
	n := startNode(t)
	require.Eventually(t, func() bool { return strings.Contains(n.agent.Output(), `"Starting lvm-agent"`) }, 30*time.Second, 50*time.Millisecond)
	assert.Contains(t, n.agent.Output(), `"Starting lvm-agent" version="`+version+`"`)
}

// The CLI finds its API server as kubectl does: --kubeconfig, $KUBECONFIG,
// then ~/.kube/config; --context picks a context, whose namespace is the
// default of -n.
func TestCLIKubeconfigLoadingRules(t *testing.T) {
	admin, err := clientcmd.LoadFromFile(cp.Kubeconfig)
	require.NoError(t, err)
	good := admin.Contexts[admin.CurrentContext]
	require.NotNil(t, good)
	cfg := clientcmdapi.NewConfig()
	for name, c := range admin.Clusters {
		cfg.Clusters[name] = c
	}
	for name, a := range admin.AuthInfos {
		cfg.AuthInfos[name] = a
	}
	cfg.Clusters["nowhere"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	cfg.Contexts["good"] = &clientcmdapi.Context{Cluster: good.Cluster, AuthInfo: good.AuthInfo, Namespace: "cli-ctx-ns"}
	cfg.Contexts["bad"] = &clientcmdapi.Context{Cluster: "nowhere", AuthInfo: good.AuthInfo}
	cfg.CurrentContext = "bad"
	home := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(home, ".kube"), 0o700))
	require.NoError(t, clientcmd.WriteToFile(*cfg, filepath.Join(home, ".kube", "config")))
	homeEnv := []string{"HOME=" + home}
	status := []string{"volume", "status", "--backend", "none", "--node", "cli-no-such-node"}

	code, _, _ := runBin(t, homeEnv, status...)
	assert.Equal(t, 1, code, "~/.kube/config is read: its current context points nowhere")
	code, out, _ := runBin(t, homeEnv, append(status, "--context", "good")...)
	assert.Equal(t, 0, code, "--context picks the good one")
	assert.Contains(t, out, "node cli-no-such-node: 0 rows")
	code, _, _ = runBin(t, append(homeEnv, "KUBECONFIG="+cp.Kubeconfig), status...)
	assert.Equal(t, 0, code, "$KUBECONFIG comes before ~/.kube/config")
	code, _, _ = runBin(t, homeEnv, append(status, "--kubeconfig", cp.Kubeconfig)...)
	assert.Equal(t, 0, code, "--kubeconfig comes first")

	// create reads the PVC in the context's namespace unless -n says
	// otherwise. No agent serves the node: a found PVC times out (5), a
	// PVC that is not there is an error (1).
	harness.PVC(t, cp.Client, "cli-ctx-ns", "cli-in-ctx-ns", "node-without-agent")
	create := []string{"volume", "create", "--context", "good", "--vg", "vg1", "--size", "8Mi", "--timeout", "2s"}
	code, _, _ = runBin(t, homeEnv, append(create, "--pvc", "cli-in-ctx-ns")...)
	assert.Equal(t, 5, code, "found in the context's namespace, no answer")
	code, _, errOut := runBin(t, homeEnv, append(create, "--pvc", "cli-in-ctx-ns", "-n", "default")...)
	assert.Equal(t, 1, code, "-n default: not there")
	assert.Contains(t, errOut, "not found")
	code, _, _ = runBin(t, homeEnv, append(create, "--pvc", "cli-in-ctx-ns", "--namespace", "cli-ctx-ns")...)
	assert.Equal(t, 5, code)
}

// statusJSON is the part of "volume status -o json" the test reads.
type statusJSON struct {
	Node    string `json:"node"`
	Volumes []struct {
		Object, LV, Check string
	} `json:"volumes"`
	Summary struct {
		Rows       int  `json:"rows"`
		LVsChecked bool `json:"lvsChecked"`
		MissingLVs int  `json:"missingLVs"`
		OrphanLVs  int  `json:"orphanLVs"`
	} `json:"summary"`
}

func TestCLIStatusOutputFormats(t *testing.T) {
	n := startNode(t)
	require.NoError(t, n.create(t, "default", "out-ok", spec("lv-out-ok", "4Mi")))
	require.NoError(t, n.create(t, "default", "out-missing", spec("lv-out-missing", "4Mi")))
	require.NoError(t, n.lvm.Remove("vg1", "lv-out-missing"))
	status := func(format string) (int, string) {
		code, out, _ := runCLI(t, "status", "--node", n.name, "--lvmd-socket", n.socket, "-o", format)
		return code, out
	}
	check := func(r statusJSON) {
		t.Helper()
		assert.Equal(t, n.name, r.Node)
		assert.Equal(t, 2, r.Summary.Rows)
		assert.True(t, r.Summary.LVsChecked)
		assert.Equal(t, 1, r.Summary.MissingLVs)
		checks := map[string]string{}
		for _, v := range r.Volumes {
			checks[v.Object] = v.Check
		}
		assert.Equal(t, map[string]string{"pvc/default/out-ok": "ok", "pvc/default/out-missing": "MISSING-LV"}, checks)
	}

	code, out := status("json")
	assert.Equal(t, 6, code, "the exit code does not depend on the format")
	var r statusJSON
	require.NoError(t, json.Unmarshal([]byte(out), &r), "stdout is one JSON document")
	check(r)

	code, out = status("yaml")
	assert.Equal(t, 6, code)
	r = statusJSON{}
	require.NoError(t, yaml.Unmarshal([]byte(out), &r))
	check(r)

	code, out = status("wide")
	assert.Equal(t, 6, code)
	assert.Contains(t, out, "LV-OWNER")
	assert.Contains(t, statusLines(out)["pvc/default/out-missing"], "MISSING-LV")
	_, out, _ = runCLI(t, "status", "--node", n.name, "--lvmd-socket", n.socket)
	assert.NotContains(t, out, "LV-OWNER", "the default table is the narrow one")
	assert.Contains(t, statusLines(out)["pvc/default/out-ok"], " ok")

	code, _ = status("xml")
	assert.Equal(t, 2, code)
}

// --log-format=json: every line the agent logs is one JSON object, with
// klog's verbosity still deciding what is logged.
func TestAgentLogFormatJSON(t *testing.T) {
	n := startNode(t, "--log-format=json")
	require.NoError(t, n.create(t, "default", "log-json", spec("lv-log-json", "4Mi")))
	var lines []map[string]any
	require.Eventually(t, func() bool {
		lines = lines[:0]
		for _, l := range strings.Split(strings.TrimSpace(n.agent.Output()), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("not a JSON line: %q (%v)", l, err)
			}
			lines = append(lines, m)
		}
		return len(lines) > 1
	}, 10*time.Second, 100*time.Millisecond)
	var msgs []string
	for _, m := range lines {
		assert.Contains(t, m, "time")
		assert.Contains(t, m, "level")
		msgs = append(msgs, m["msg"].(string))
	}
	assert.Contains(t, msgs, "Starting lvm-agent")
}
