package main

import (
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runSelf runs this package's main with args and returns its exit code,
// stdout and, when it fails, stderr. Defaults that come from the
// environment or the host are not the documentation's business beyond
// naming their source: the environment leaves them empty.
func runSelf(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1", "NODE_NAME=", "KUBE_NODE_NAME=", "LVM_AGENT_DEVICE_CLASS_MAP=", "KUBECONFIG=")
	out, err := cmd.Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), string(out), string(exit.Stderr)
	}
	require.NoError(t, err)
	return 0, string(out), ""
}

// Every command's --help names its flags as the ecosystem does: --name, and
// -n for a one-letter flag.
func TestHelpPrintsDoubleDash(t *testing.T) {
	flagLine := regexp.MustCompile(`(?m)^  -.*$`)
	ecosystem := regexp.MustCompile(`^  (--[a-z0-9][a-z0-9-]+|-[a-z])(\s|$)`)
	for _, args := range [][]string{nil, {"provisioner"}, {"volume", "create"}, {"volume", "delete"}, {"volume", "status"}} {
		for _, help := range []string{"--help", "-h"} {
			code, out, _ := runSelf(t, append(args, help)...)
			require.Equal(t, 0, code, "%v %s", args, help)
			lines := flagLine.FindAllString(out, -1)
			require.NotEmpty(t, lines, "%v %s prints its flags", args, help)
			for _, l := range lines {
				assert.Regexp(t, ecosystem, l, "%v %s", args, help)
			}
		}
	}
	_, out, _ := runSelf(t, "volume", "status", "--help")
	assert.Contains(t, out, "\n  --output string")
	assert.Contains(t, out, "\n  -o string")
}

// Both spellings of a flag keep working: -name and --name.
func TestFlagsTakeBothSpellings(t *testing.T) {
	for _, dash := range []string{"-", "--"} {
		t.Run(dash, func(t *testing.T) {
			code, out, _ := runSelf(t, dash+"version")
			assert.Equal(t, 0, code)
			assert.Contains(t, out, "commit: ")

			// A name no CSIDriver can carry is refused before anything connects.
			code, _, errOut := runSelf(t, "provisioner", dash+"name=example.com/lvm", dash+"namespace=ns", dash+"kubeconfig=/nonexistent")
			assert.Equal(t, 1, code)
			assert.Contains(t, errOut, "not a DNS-1123 subdomain")

			code, _, errOut = runSelf(t, dash+"log-format=xml", dash+"node-name=n")
			assert.Equal(t, 2, code)
			assert.Contains(t, errOut, "--log-format must be text or json")

			// Known flags parse up to --help; an unknown one is a usage error.
			code, _, _ = runSelf(t, "volume", "status", dash+"output=json", dash+"o", "wide", dash+"stuck-after=1m", dash+"help")
			assert.Equal(t, 0, code)
			code, _, errOut = runSelf(t, "volume", "create", dash+"pvc=p", dash+"n", "ns", dash+"timeout=1s", dash+"help")
			assert.Equal(t, 0, code, errOut)
			code, _, errOut = runSelf(t, "volume", "status", dash+"no-such-flag")
			assert.Equal(t, 2, code)
			assert.True(t, strings.Contains(errOut, "flag provided but not defined"), errOut)
		})
	}
}
