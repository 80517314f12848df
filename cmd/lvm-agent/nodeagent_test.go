package main

import (
	"os/exec"
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
	deps := func(tags string) map[string]bool {
		out, err := exec.Command("go", "list", "-deps", "-tags", tags, ".").Output()
		require.NoError(t, err, "go list -deps -tags %q", tags)
		m := map[string]bool{}
		for _, p := range strings.Fields(string(out)) {
			m[p] = true
		}
		return m
	}
	node, full := deps("nodeagent"), deps("")
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
