package integration

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/lvm-agent/lvm-agent/agent"
	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
)

func TestCreate(t *testing.T) {
	n := startNode(t)
	require.NoError(t, n.create(t, "default", "create", spec("lv-create", "10Mi")))
	lvs := n.lvs(t, "vg1")
	require.Len(t, lvs, 1)
	assert.Equal(t, uint64(12<<20), lvs[0].SizeBytes, "rounded up to 4 MiB extents")
	pvc, err := cp.Client.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), "create", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Contains(t, lvs[0].Tags, agent.OwnerTag(pvc.UID))
	assert.Equal(t, kube.NodeLabelValue(n.name), pvc.Labels[kube.LabelNode])
}

func TestCreateRerequest(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	require.NoError(t, n.create(t, "default", "again", spec("lv-again", "4Mi")))
	answered, err := cp.Client.CoreV1().PersistentVolumeClaims("default").Get(ctx, "again", metav1.GetOptions{})
	require.NoError(t, err)
	// The helper called again (say, after the provisioner's restart) returns
	// the answer on the claim and writes nothing.
	require.NoError(t, n.request(t, "default", "again", spec("lv-again", "4Mi")))
	pvc, err := cp.Client.CoreV1().PersistentVolumeClaims("default").Get(ctx, "again", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, answered.ResourceVersion, pvc.ResourceVersion, "nothing written")
	// A provisioner that writes the request again anyway: same answer, no second LV.
	_, err = kube.UpdatePvcWithAnnotations(ctx, clientset.Wrap(cp.Client), "default", "again", "", kube.Set(map[string]string{kube.AnnLifecycle: kube.StateCreating}), nil)
	require.NoError(t, err)
	harness.WaitFor(t, 30*time.Second, func(ctx context.Context) (metav1.Object, error) {
		return cp.Client.CoreV1().PersistentVolumeClaims("default").Get(ctx, "again", metav1.GetOptions{})
	}, func(a map[string]string) bool { return a[kube.AnnLifecycle] == kube.StateCreated })
	assert.Len(t, n.lvs(t, "vg1"), 1)
}

func TestIgnoredRequests(t *testing.T) {
	n := startNode(t)
	rawRequest(t, cp.Client, "default", "other-node", "node-elsewhere", `{"volumeGroup":"vg1","name":"x1","size":4096}`, false)
	harness.PVC(t, cp.Client, "default", "no-lifecycle", n.name)
	_, err := kube.UpdatePvcWithAnnotations(context.Background(), clientset.Wrap(cp.Client), "default", "no-lifecycle", "",
		kube.Set(map[string]string{kube.AnnSpec: `{"volumeGroup":"vg1","name":"x2","size":4096}`}), nil)
	require.NoError(t, err)
	// A request of ours written afterwards is answered: the agent saw the others by then.
	require.NoError(t, n.create(t, "default", "ignored-mine", spec("x3", "4Mi")))
	for _, name := range []string{"other-node", "no-lifecycle"} {
		ann := pvcAnnotations(t, "default", name)
		assert.NotEqual(t, kube.StateCreated, ann[kube.AnnLifecycle], name)
		assert.NotContains(t, ann, kube.AnnError, name)
	}
	lvs := n.lvs(t, "vg1")
	require.Len(t, lvs, 1)
	assert.Equal(t, "x3", lvs[0].Name)
}

func TestSameNameTwoNamespaces(t *testing.T) {
	n := startNode(t)
	require.NoError(t, n.create(t, "ns-a", "data", spec("a-data", "4Mi")))
	require.NoError(t, n.create(t, "ns-b", "data", spec("b-data", "4Mi")))
	assert.Len(t, n.lvs(t, "vg1"), 2)
}

func TestDelete(t *testing.T) {
	n := startNode(t)
	require.NoError(t, n.create(t, "default", "to-delete", spec("lv-delete", "4Mi")))
	pvc, err := cp.Client.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), "to-delete", metav1.GetOptions{})
	require.NoError(t, err)
	harness.PV(t, cp.Client, "pv-delete", n.name, kube.DefaultDriver, pvc)
	// Issue 14, item 2: while the claim exists, its LV stays.
	require.ErrorIs(t, deleteVolume(t, "pv-delete", "vg1", "lv-delete"), kube.ErrClaimInUse)
	assert.Len(t, n.lvs(t, "vg1"), 1)
	// The order a cluster follows: the claim is deleted, then the delete asked.
	harness.DeleteClaim(t, cp.Client, pvc)
	require.NoError(t, deleteVolume(t, "pv-delete", "vg1", "lv-delete"))
	assert.Empty(t, n.lvs(t, "vg1"))
	// Asked again: still deleted, no error.
	require.NoError(t, deleteVolume(t, "pv-delete", "vg1", "lv-delete"))
}

// Issue 14, item 6: a PVC being deleted (the API server's pvc-protection
// finalizer holds it) gets no LV, and its provisioner a reason to stop.
func TestTerminatingClaim(t *testing.T) {
	n := startNode(t)
	pvc := harness.PVC(t, cp.Client, "default", "terminating", n.name)
	require.Contains(t, pvc.Finalizers, "kubernetes.io/pvc-protection")
	require.NoError(t, cp.Client.CoreV1().PersistentVolumeClaims("default").Delete(context.Background(), "terminating", metav1.DeleteOptions{}))
	require.ErrorIs(t, n.request(t, "default", "terminating", spec("lv-terminating", "4Mi")), kube.ErrClaimTerminating)
	assert.Empty(t, n.lvs(t, "vg1"))
	harness.DeleteClaim(t, cp.Client, pvc)
}

func TestDeleteAbsent(t *testing.T) {
	n := startNode(t)
	harness.PV(t, cp.Client, "pv-absent", n.name, kube.DefaultDriver, nil)
	require.NoError(t, deleteVolume(t, "pv-absent", "vg1", "never-existed"))
}

func TestInvalidSpec(t *testing.T) {
	n := startNode(t)
	for name, s := range map[string]kube.CreateSpec{
		"bad-name":  {VolumeGroup: "vg1", Name: "-rf", Size: 4096},
		"bad-size":  {VolumeGroup: "vg1", Name: "ok", Size: -1},
		"bad-vg":    {VolumeGroup: "../etc", Name: "ok", Size: 4096},
		"reserved":  {VolumeGroup: "vg1", Name: "x_tmeta", Size: 4096},
		"bad-tag":   {VolumeGroup: "vg1", Name: "ok", Size: 4096, Tags: []string{"a b"}},
		"snapshot1": {VolumeGroup: "vg1", Name: "snapshot1", Size: 4096},
	} {
		err := n.create(t, "default", name, s)
		require.ErrorIs(t, err, kube.ErrInvalidSpec, name)
		ann := pvcAnnotations(t, "default", name)
		assert.NotEmpty(t, ann[kube.AnnError], name)
	}
	assert.Empty(t, n.lvs(t, "vg1"))
}

func TestInsufficientCapacity(t *testing.T) {
	n := startNode(t)
	err := n.create(t, "default", "too-big", spec("lv-big", "2Gi"))
	require.ErrorIs(t, err, kube.ErrInsufficientCapacity)
	assert.Empty(t, n.lvs(t, "vg1"))
}

func TestNameConflict(t *testing.T) {
	n := startNode(t)
	_, err := n.lvm.Create("vg1", "taken", 8<<20, []string{"made-by-hand"})
	require.NoError(t, err)
	err = n.create(t, "default", "conflict", spec("taken", "4Mi"))
	require.ErrorIs(t, err, kube.ErrNameConflict)
	lvs := n.lvs(t, "vg1")
	require.Len(t, lvs, 1)
	assert.Equal(t, []string{"made-by-hand"}, lvs[0].Tags, "foreign LV untouched")
}

func TestProtected(t *testing.T) {
	n := startNode(t)
	require.NoError(t, n.create(t, "default", "keep", spec("lv-keep", "4Mi")))
	pvc, err := cp.Client.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), "keep", metav1.GetOptions{})
	require.NoError(t, err)
	// An LV marked protected (here, one made by hand with our tag and "protected").
	_, err = n.lvm.Create("vg1", "lv-protected", 4096, []string{agent.OwnerTag(pvc.UID), agent.ProtectedTag})
	require.NoError(t, err)
	harness.PV(t, cp.Client, "pv-protected", n.name, kube.DefaultDriver, pvc)
	harness.DeleteClaim(t, cp.Client, pvc)
	require.ErrorIs(t, deleteVolume(t, "pv-protected", "vg1", "lv-protected"), kube.ErrProtected)
	assert.Len(t, n.lvs(t, "vg1"), 2)
}

func TestLvmdUnavailableThenBack(t *testing.T) {
	n := startNode(t)
	n.lvmd.Stop()
	done := make(chan error, 1)
	harness.PVC(t, cp.Client, "default", "waits", n.name)
	go func() { done <- n.request(t, "default", "waits", spec("lv-waits", "4Mi")) }()
	// The agent records why it is waiting, then succeeds once lvmd is back.
	harness.WaitFor(t, 20*time.Second, func(ctx context.Context) (metav1.Object, error) {
		return cp.Client.CoreV1().PersistentVolumeClaims("default").Get(ctx, "waits", metav1.GetOptions{})
	}, func(a map[string]string) bool {
		return a[kube.AnnError] != "" && a[kube.AnnLifecycle] == kube.StateCreating
	})
	require.NoError(t, n.lvmd.Serve(n.socket))
	require.NoError(t, <-done)
	ann := pvcAnnotations(t, "default", "waits")
	assert.NotContains(t, ann, kube.AnnError, "error removed on success")
	assert.Len(t, n.lvs(t, "vg1"), 1)
}

func TestKilledDuringCreate(t *testing.T) {
	n := startNode(t)
	var creates atomic.Int32
	inFlight := make(chan struct{}, 1)
	n.lvm.SetLatency(2 * time.Second)
	n.lvm.SetHook(func(op, _, _ string) error {
		if op == "create" {
			creates.Add(1)
			select {
			case inFlight <- struct{}{}:
			default:
			}
		}
		return nil
	})
	harness.PVC(t, cp.Client, "default", "killed", n.name)
	done := make(chan error, 1)
	go func() { done <- n.request(t, "default", "killed", spec("lv-killed", "4Mi")) }()
	<-inFlight
	n.agent.Kill() // SIGKILL while lvmd's CreateLV runs; lvmd finishes it
	time.Sleep(2500 * time.Millisecond)
	n.lvm.SetLatency(0)
	n.start(t)
	require.NoError(t, <-done)
	lvs := n.lvs(t, "vg1")
	require.Len(t, lvs, 1, "exactly one LV")
	pvc, err := cp.Client.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), "killed", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Contains(t, lvs[0].Tags, agent.OwnerTag(pvc.UID))
	assert.GreaterOrEqual(t, creates.Load(), int32(1))
}

// After its final state an object is never written again, even across an
// agent restart (which re-lists everything).
func TestNoWriteAfterFinalState(t *testing.T) {
	n := startNode(t)
	require.NoError(t, n.create(t, "default", "final-ok", spec("lv-final", "4Mi")))
	require.ErrorIs(t, n.create(t, "default", "final-failed", spec("lv-final2", "4Gi")), kube.ErrInsufficientCapacity)
	list, err := cp.Client.CoreV1().PersistentVolumeClaims("default").List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := cp.Client.CoreV1().PersistentVolumeClaims("default").Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	require.NoError(t, err)
	// The watch is read from the start to the end of the quiet period, every
	// event of it (issue 14, item 13: it was read only after its cancel).
	var mu sync.Mutex
	var modified []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if m, ok := ev.Object.(metav1.Object); ok && ev.Type == watch.Modified {
				mu.Lock()
				modified = append(modified, m.GetName())
				mu.Unlock()
			}
		}
	}()
	n.agent.Kill()
	n.start(t)
	// A request after the restart proves the new agent has synced and worked.
	require.NoError(t, n.create(t, "default", "final-after", spec("lv-after", "4Mi")))
	time.Sleep(time.Second) // the quiet period: room for a wrong write
	w.Stop()
	<-done
	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, modified, "final-after", "the watch saw the writes of the period")
	assert.NotContains(t, modified, "final-ok", "written after its final state")
	assert.NotContains(t, modified, "final-failed", "written after its final state")
}

func TestSIGTERM(t *testing.T) {
	n := startNode(t)
	require.NoError(t, n.create(t, "default", "before-term", spec("lv-term", "4Mi")))
	code, err := n.agent.Signal(syscall.SIGTERM, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
}

func deleteVolume(t *testing.T, pv, vg, lv string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := kube.DeleteVolumeWithAnnotations(ctx, clientset.Wrap(cp.Client), pv, vg, lv, nil)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("no answer for PV %s", pv)
	}
	return err
}
