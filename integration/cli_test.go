package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lvm-agent/lvm-agent/agent"
	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
)

// runCLI runs "lvm-agent volume args..." against the test API server and
// returns its exit code and output.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return runBin(t, nil, append([]string{"volume"}, append(args, "--kubeconfig", cp.Kubeconfig)...)...)
}

func TestCLICreateDeleteExitCodes(t *testing.T) {
	n := startNode(t)
	harness.PVC(t, cp.Client, "default", "cli-ok", n.name)
	code, out, _ := runCLI(t, "create", "--namespace", "default", "--pvc", "cli-ok", "--vg", "vg1", "--size", "8Mi", "--timeout", "30s")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "creating")
	assert.Contains(t, out, "created")
	pvc, err := cp.Client.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), "cli-ok", metav1.GetOptions{})
	require.NoError(t, err)
	lvName := "pvc-" + string(pvc.UID)
	lvs := n.lvs(t, "vg1")
	require.Len(t, lvs, 1)
	assert.Equal(t, lvName, lvs[0].Name, "the LV is named after the PVC's UID by default")

	harness.PVC(t, cp.Client, "default", "cli-unknown-vg", n.name)
	code, out, stderr := runCLI(t, "create", "--pvc", "cli-unknown-vg", "--vg", "no-such-vg", "--size", "8Mi", "--timeout", "30s")
	assert.Equal(t, 3, code, "failed")
	assert.Contains(t, out, "failed")
	assert.Contains(t, stderr, kube.ReasonUnknownVolumeGroup)

	harness.PVC(t, cp.Client, "default", "cli-too-big", n.name)
	code, _, stderr = runCLI(t, "create", "--pvc", "cli-too-big", "--vg", "vg1", "--size", "2Gi", "--timeout", "30s")
	assert.Equal(t, 4, code, "failed with InsufficientCapacity")
	assert.Contains(t, stderr, kube.ReasonInsufficientCapacity)

	// No agent runs for this node: no answer before the timeout.
	harness.PVC(t, cp.Client, "default", "cli-nobody", "node-without-agent")
	code, _, _ = runCLI(t, "create", "--pvc", "cli-nobody", "--vg", "vg1", "--size", "8Mi", "--timeout", "2s")
	assert.Equal(t, 5, code, "timeout")

	code, _, _ = runCLI(t, "create", "--pvc", "cli-ok")
	assert.Equal(t, 2, code, "usage: no --vg, no --size")

	// Delete, with vg/lv from the PV's spec annotation.
	pv := harness.NewPV("pv-cli-ok", n.name, kube.DefaultDriver, pvc, "vg1/"+lvName)
	_, err = cp.Client.CoreV1().PersistentVolumes().Create(context.Background(), pv, metav1.CreateOptions{})
	require.NoError(t, err)
	// While the claim exists, the delete is refused (issue 14, item 2).
	code, _, stderr = runCLI(t, "delete", "--pv", "pv-cli-ok", "--timeout", "30s")
	assert.Equal(t, 3, code, "failed")
	assert.Contains(t, stderr, kube.ReasonClaimInUse)
	assert.Len(t, n.lvs(t, "vg1"), 1)
	harness.DeleteClaim(t, cp.Client, pvc)
	code, out, _ = runCLI(t, "delete", "--pv", "pv-cli-ok", "--timeout", "30s")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "deleted")
	assert.Empty(t, n.lvs(t, "vg1"))

	// A protected LV is never removed: failed.
	_, err = n.lvm.Create("vg1", "lv-cli-protected", 4096, []string{agent.ProtectedTag})
	require.NoError(t, err)
	harness.PV(t, cp.Client, "pv-cli-protected", n.name, kube.DefaultDriver, nil)
	code, _, stderr = runCLI(t, "delete", "--pv", "pv-cli-protected", "--vg", "vg1", "--lv", "lv-cli-protected", "--timeout", "30s")
	assert.Equal(t, 3, code)
	assert.Contains(t, stderr, kube.ReasonProtected)
}

// "volume status" puts the API side next to lvmd's LVs and flags mismatches.
func TestCLIStatus(t *testing.T) {
	n := startNode(t)
	status := func(extra ...string) (int, string) {
		code, out, _ := runCLI(t, append([]string{"status", "--node", n.name, "--lvmd-socket", n.socket}, extra...)...)
		return code, out
	}
	code, out := status("--device-mapper-control", "/nonexistent/control")
	require.Equal(t, 0, code, "nothing on the node yet; device-mapper unreadable is no error")
	assert.Contains(t, out, "0 missing LVs, 0 orphan LVs, 0 stuck requests")
	assert.Contains(t, out, "device state: not read: ")

	// ok: a created volume with its LV.
	require.NoError(t, n.create(t, "default", "st-ok", spec("lv-st-ok", "4Mi")))
	// missing: a created volume whose LV went away behind the agent's back.
	require.NoError(t, n.create(t, "default", "st-missing", spec("lv-st-missing", "4Mi")))
	require.NoError(t, n.lvm.Remove("vg1", "lv-st-missing"))
	// orphan: an LV with our tag for a PVC that does not exist.
	_, err := n.lvm.Create("vg1", "lv-st-orphan", 4096, []string{agent.OwnerTagPrefix + "00000000-dead-beef-0000-000000000000"})
	require.NoError(t, err)
	// untagged: someone else's LV, not a problem.
	_, err = n.lvm.Create("vg1", "lv-st-foreign", 4096, nil)
	require.NoError(t, err)
	// stuck: lvm fails this create every time, so the agent keeps retrying.
	n.lvm.SetHook(func(op, _, name string) error {
		if op == "create" && name == "lv-st-stuck" {
			return errors.New("injected lvm failure")
		}
		return nil
	})
	rawRequest(t, cp.Client, "default", "st-stuck", n.name, `{"volumeGroup":"vg1","name":"lv-st-stuck","size":4096}`, true)
	harness.WaitFor(t, 20*time.Second, func(ctx context.Context) (metav1.Object, error) {
		return cp.Client.CoreV1().PersistentVolumeClaims("default").Get(ctx, "st-stuck", metav1.GetOptions{})
	}, func(a map[string]string) bool { return a[kube.AnnError] != "" })

	code, out = status()
	assert.Equal(t, 6, code, "problems found")
	lines := statusLines(out)
	assert.Contains(t, lines["pvc/default/st-ok"], " ok")
	assert.Contains(t, lines["pvc/default/st-missing"], "MISSING-LV")
	assert.Contains(t, lines["pvc/default/st-stuck"], "STUCK")
	assert.Contains(t, lines["pvc/default/st-stuck"], "injected lvm failure")
	assert.Contains(t, lines["vg1/lv-st-orphan"], "ORPHAN-LV")
	assert.Contains(t, lines["vg1/lv-st-foreign"], "untagged")
	assert.Contains(t, out, "1 missing LVs, 1 orphan LVs, 1 stuck requests")

	// Without lvmd, the API side alone: the stuck request is still seen.
	code, out = status("--backend", "none")
	assert.Equal(t, 6, code)
	assert.Contains(t, out, "LVs not checked, 1 stuck requests")

	// Repaired: the create goes through, the LV is back, the orphan is gone.
	n.lvm.SetHook(nil)
	require.NoError(t, n.request(t, "default", "st-stuck", spec("lv-st-stuck", "4Mi")))
	pvc, err := cp.Client.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), "st-missing", metav1.GetOptions{})
	require.NoError(t, err)
	_, err = n.lvm.Create("vg1", "lv-st-missing", 4<<20, []string{agent.OwnerTag(pvc.UID)})
	require.NoError(t, err)
	require.NoError(t, n.lvm.Remove("vg1", "lv-st-orphan"))
	code, out = status()
	assert.Equal(t, 0, code, "all repaired")
	assert.Contains(t, out, "0 missing LVs, 0 orphan LVs, 0 stuck requests")

	// lvmd unreachable: an error, not a clean bill of health.
	n.lvmd.Stop()
	code, _ = status()
	assert.Equal(t, 1, code)
}

// A request without an error is stuck once it is older than --stuck-after.
func TestCLIStatusStuckAfter(t *testing.T) {
	node := "node-" + sanitize(t.Name()) // no agent runs for it
	rawRequest(t, cp.Client, "default", "st-waits", node, `{"volumeGroup":"vg1","name":"lv-st-waits","size":4096}`, false)
	code, out, _ := runCLI(t, "status", "--node", node, "--backend", "none", "--stuck-after", "1h")
	assert.Equal(t, 0, code)
	assert.Contains(t, statusLines(out)["pvc/default/st-waits"], "pending")
	time.Sleep(1100 * time.Millisecond) // managedFields times have a 1 s resolution
	code, out, _ = runCLI(t, "status", "--node", node, "--backend", "none", "--stuck-after", "1s")
	assert.Equal(t, 6, code)
	assert.Contains(t, statusLines(out)["pvc/default/st-waits"], "STUCK")
}

// statusLines indexes the status table by its first column, and by the LV
// column for rows without an object.
func statusLines(out string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 4 {
			continue
		}
		if f[0] == "-" {
			m[f[3]] = l
		} else {
			m[f[0]] = l
		}
	}
	return m
}
