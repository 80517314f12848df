package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The node agent's build (-tags nodeagent, bin/lvm-agent) links neither
// client-go's clientset, informers and listers (their scheme of every API
// group is most of a node's memory for the agent) nor the provisioner; the
// full build links them all, which shows that the list is read.
func TestNodeAgentBuildLinksNoClientset(t *testing.T) {
	node, full := deps(t, "nodeagent"), deps(t, "")
	for _, p := range []string{
		"k8s.io/client-go/kubernetes",
		"k8s.io/client-go/kubernetes/scheme",
		"k8s.io/client-go/informers",
		"k8s.io/client-go/listers/core/v1",
		"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller",
		"github.com/lvm-agent/lvm-agent/provisioner",
	} {
		assert.False(t, node[p], "the node agent's build links %s", p)
		assert.True(t, full[p], "the full build does not link %s", p)
	}
}

// Every build of ./cmd/lvm-agent that ships or is measured uses the tag
// grpcnotrace. Without it grpc links golang.org/x/net/trace, whose
// text/template reaches reflect.Value.Method with a name known only at run
// time, and the linker then keeps every exported method of every type in the
// program: the node agent's code and tables grow from 21 to 27 MB, and
// its RSS at rest by 3.4 MiB (docs/benchmarks.md).
func TestBuildsLeaveGRPCTraceOut(t *testing.T) {
	for _, tags := range []string{"nodeagent", ""} {
		with := strings.Trim(tags+",grpcnotrace", ",")
		linked := deps(t, with)
		for _, p := range []string{"golang.org/x/net/trace", "text/template"} {
			assert.False(t, linked[p], "-tags %q links %s", with, p)
		}
		assert.True(t, deps(t, tags)["golang.org/x/net/trace"], "-tags %q: the tag is what leaves it out", tags)
	}
	// Each place that builds the binaries: each build command of
	// ./cmd/lvm-agent, and the harness's table of tags per binary.
	build := regexp.MustCompile(`(go build|gobuild|build lvm-agent build) .*\./cmd/lvm-agent|"lvm-agent": "`)
	for _, f := range []string{"Makefile", "scripts/integration.sh", "scripts/vm/images.sh",
		"scripts/vm/guest-files.sh", "integration/harness/harness.go"} {
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		require.NoError(t, err)
		n := 0
		for _, line := range strings.Split(string(b), "\n") {
			if build.MatchString(line) {
				n++
				want := max(1, strings.Count(line, `": "`)) // the harness's table: one per binary
				assert.Equal(t, want, strings.Count(line, "grpcnotrace"), "%s: %s", f, strings.TrimSpace(line))
			}
		}
		assert.NotZero(t, n, "%s builds ./cmd/lvm-agent nowhere", f)
	}
}

// deps is the set of packages the build of this command with tags links.
func deps(t *testing.T, tags string) map[string]bool {
	out, err := exec.Command("go", "list", "-deps", "-tags", tags, ".").Output()
	require.NoError(t, err, "go list -deps -tags %q", tags)
	m := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		m[p] = true
	}
	return m
}
