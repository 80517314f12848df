package integration

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
)

// The unit tests' fake API (kube/kubefake) keeps the version on a merge
// patch that changes nothing, as the real API server does here: such a
// write, conditional or not, is no fence, and a writer that read the same
// version still lands after it (what the agent's mark of an LV it remakes
// must never be).
func TestNoOpPatchKeepsTheVersion(t *testing.T) {
	harness.PVC(t, cp.Client, "default", "no-op-patch", "node-x")
	ctx := context.Background()
	c := clientset.Wrap(cp.Client)
	mark := kube.Set(map[string]string{kube.AnnError: "a mark"})
	first, err := kube.UpdatePvcWithAnnotations(ctx, c, "default", "no-op-patch", "", mark, nil)
	require.NoError(t, err)
	again, err := kube.UpdatePvcWithAnnotations(ctx, c, "default", "no-op-patch", first.ResourceVersion, mark, nil)
	require.NoError(t, err)
	assert.Equal(t, first.ResourceVersion, again.ResourceVersion, "a patch that changes nothing keeps the version")
	_, err = kube.UpdatePvcWithAnnotations(ctx, c, "default", "no-op-patch", first.ResourceVersion,
		kube.Set(map[string]string{kube.AnnLifecycle: kube.StateCreated}), nil)
	assert.NoError(t, err, "a write conditional on the version before the no-op lands")
}
