package integration

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
)

// The fake lvmd of startNode: "vg1" (1 GiB thick) and "thin" (1 GiB pool,
// overprovisioned x2); topolvm's dialect, which grows volumes.
func wantTopology(vg1Free, thinFree uint64) []kube.StorageCapacity {
	return []kube.StorageCapacity{
		{Type: "lvm", Name: "thin", Capacity: 1 << 30, Free: thinFree, DeviceClass: "thin", Clone: kube.CloneSnapshot, Grow: true},
		{Type: "lvm", Name: "vg1", Capacity: 1 << 30, Free: vg1Free, DeviceClass: "vg1", Grow: true},
	}
}

func createNode(t *testing.T, name string) {
	t.Helper()
	_, err := cp.Client.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cp.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// waitTopology waits until the Node's capacity annotation decodes to want.
func waitTopology(t *testing.T, node string, want []kube.StorageCapacity) string {
	t.Helper()
	var raw string
	var got []kube.StorageCapacity
	ok := assert.Eventually(t, func() bool {
		n, err := cp.Client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return false
		}
		raw = n.Annotations[kube.DefaultCapacityAnnotation]
		got, err = kube.DecodeStorageTopology(raw)
		return err == nil && assert.ObjectsAreEqual(want, got)
	}, 20*time.Second, 50*time.Millisecond)
	if !ok {
		require.FailNowf(t, "capacity annotation", "got %q, want %+v", raw, want)
	}
	return raw
}

func TestNodeCapacityAnnotation(t *testing.T) {
	name := "node-" + sanitize(t.Name())
	createNode(t, name)
	// Every change written (the default leaves out changes under 1% of
	// free: agent/nodecapacity_test.go), for exact figures.
	n := startNode(t, "--node-capacity-min-change=0")
	require.Equal(t, name, n.name)
	waitTopology(t, n.name, wantTopology(1<<30, 2<<30))

	require.NoError(t, n.create(t, "default", "cap-thick", spec("lv-cap-thick", "10Mi")))
	thin := spec("lv-cap-thin", "8Mi")
	thin.VolumeGroup = "thin"
	require.NoError(t, n.create(t, "default", "cap-thin", thin))
	waitTopology(t, n.name, wantTopology(1<<30-12<<20, 2<<30-8<<20))

	pvc, err := cp.Client.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), "cap-thick", metav1.GetOptions{})
	require.NoError(t, err)
	harness.PV(t, cp.Client, "pv-cap-thick", n.name, kube.DefaultDriver, pvc)
	harness.DeleteClaim(t, cp.Client, pvc)
	require.NoError(t, deleteVolume(t, "pv-cap-thick", "vg1", "lv-cap-thick"))
	raw := waitTopology(t, n.name, wantTopology(1<<30, 2<<30-8<<20))
	t.Logf("Node %s: %s=%s", n.name, kube.DefaultCapacityAnnotation, raw)
	// Compatible with the original format: a list of {"type":"lvm","name":VG,"capacity":bytes}.
	assert.Contains(t, raw, `{"type":"lvm","name":"vg1","capacity":1073741824,`)
}

// One write per real change, and none after a restart when nothing changed.
func TestNodeCapacityWrites(t *testing.T) {
	name := "node-" + sanitize(t.Name())
	createNode(t, name)
	addr := harness.FreeAddr(t)
	n := startNode(t, "--metrics-address", addr, "--node-capacity-min-change=0")
	waitTopology(t, n.name, wantTopology(1<<30, 2<<30))
	require.NoError(t, n.create(t, "default", "cap-writes", spec("lv-cap-writes", "4Mi")))
	waitTopology(t, n.name, wantTopology(1<<30-4<<20, 2<<30))
	// The agent counts a write when its answer arrives, which can be after
	// the test has read the Node: wait for the count, then check it.
	m := waitMetricFunc(t, addr, `lvm_agent_api_writes_total{object="node",result="ok"}`, func(v float64) bool { return v >= 2 })
	assert.Equal(t, 2.0, m[`lvm_agent_api_writes_total{object="node",result="ok"}`], "initial report + one change")

	node, err := cp.Client.CoreV1().Nodes().Get(context.Background(), n.name, metav1.GetOptions{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := cp.Client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: node.ResourceVersion,
		FieldSelector: fields.OneTermEqualSelector("metadata.name", n.name).String()})
	require.NoError(t, err)

	n.agent.Kill()
	n.start(t)
	waitMetric(t, addr, `lvm_agent_lvmd_reachable`, 1)
	// Past the debounce (1 s) of the first report: the agent has read the
	// Node and found nothing to write.
	time.Sleep(2500 * time.Millisecond)
	m = scrape(t, addr)
	assert.Zero(t, m[`lvm_agent_api_writes_total{object="node",result="ok"}`])
	assert.Zero(t, m[`lvm_agent_api_writes_total{object="node",result="error"}`])
	cancel()
	for ev := range w.ResultChan() {
		assert.NotEqual(t, watch.Modified, ev.Type, "Node written after a restart without a change")
	}
}

// A Node that appears after the agent started gets the annotation.
func TestNodeCapacityNodeAppearsLater(t *testing.T) {
	n := startNode(t)
	time.Sleep(1500 * time.Millisecond) // the agent has found no Node by now
	createNode(t, n.name)
	waitTopology(t, n.name, wantTopology(1<<30, 2<<30))
}
