package agent

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lvm-agent/lvm-agent/kube"
)

// The done line attributes a create's time to its steps, in order: the
// request's wait, lvmd's listing, the checks, the claim read again, lvmd's
// create, the claim read after it, the device.
func TestCreateSteps(t *testing.T) {
	e := start(t, Config{})
	// The spec without "creating": the running agent leaves the claim alone.
	pvc := e.pvc(t, "default", "pvc", node, map[string]string{kube.AnnSpec: `{"volumeGroup":"thick","name":"lv1","size":4096}`})
	spec, target, err := e.agent.createTarget(pvc)
	require.NoError(t, err)
	ctx, st := withSteps(context.Background(), 3*time.Second)
	out := e.agent.create(ctx, pvc, spec, target)
	require.Equal(t, kube.StateCreated, out.state, "%v", out.err)
	var names []string
	for i := 0; i < len(st.kvs()); i += 2 {
		names = append(names, st.kvs()[i].(string))
		require.IsType(t, time.Duration(0), st.kvs()[i+1])
	}
	require.Equal(t, []string{"queued", "lvmdList", "checks", "claimCheck", "lvmdCreate", "claimCheckAfter", "device"}, names)
	require.Equal(t, 3*time.Second, st.kvs()[1])
}
