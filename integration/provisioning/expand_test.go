package provisioning

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

const mib = 1 << 20

// growNode is a Node of its own (1 GiB volume group) with a real agent
// and the fake lvmd, for the expansion tests: its Node is deleted when the
// test ends, so that no later test schedules there.
type growNode struct {
	*node
	socket string
	agent  *harness.Process
}

func startGrowNode(t testing.TB, name string) *growNode {
	return startNodeOf(t, name, "2", "4Gi", lvmdfake.Class{Name: "vg1", SizeBytes: 1 << 30})
}

// startNodeOf is a Node of its own with cpu and memory, an agent, and the
// fake lvmd with classes; its Node is deleted when the test ends.
func startNodeOf(t testing.TB, name, cpu, memory string, classes ...lvmdfake.Class) *growNode {
	t.Helper()
	harness.ReadyNode(t, cluster.ControlPlane, name, cpu, memory)
	t.Cleanup(func() { _ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	n := &growNode{node: &node{name: name, lvm: lvmdfake.NewLVM(classes...)}}
	_, n.socket = harness.ServeLVMD(t, n.lvm)
	n.startAgent(t)
	return n
}

func (n *growNode) startAgent(t testing.TB) {
	n.agent = harness.StartAgent(t, agentBin, "--node-name", n.name, "--kubeconfig", cluster.Kubeconfig, "--lvmd-socket", n.socket,
		"--metrics-address", "", "--v", "2")
}

// growClass is a StorageClass that allows expansion.
func growClass(t testing.TB, name string) {
	t.Helper()
	mode, reclaim, yes := storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, true
	_, err := cluster.Client.StorageV1().StorageClasses().Create(context.Background(), &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: kube.DefaultProvisioner, AllowVolumeExpansion: &yes,
		VolumeBindingMode: &mode, ReclaimPolicy: &reclaim, Parameters: harness.HostClass(map[string]string{"volumeGroup": "vg1"}),
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cluster.Client.StorageV1().StorageClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// growingClaim starts a node and a class of its own (both named name), and
// a 64 MiB claim "data" of mode with a Pod on that node; it returns them
// once the claim is bound, with the claim's namespace and PV.
func growingClaim(t *testing.T, name string, mode corev1.PersistentVolumeMode) (*growNode, string, *corev1.PersistentVolume) {
	t.Helper()
	n := startGrowNode(t, name)
	growClass(t, name)
	ns := newNamespace(t)
	claimAndPod(t, ns, "data", name, "64Mi", mode, map[string]string{corev1.LabelHostname: n.name})
	_, pv := waitBound(t, ns, "data")
	return n, ns, pv
}

// askFor sets the claim's request, as a user editing the PVC does.
func askFor(t *testing.T, ns, name, size string) {
	t.Helper()
	patch := []byte(`{"spec":{"resources":{"requests":{"storage":"` + size + `"}}}}`)
	_, err := cluster.Client.CoreV1().PersistentVolumeClaims(ns).Patch(context.Background(), name, "application/merge-patch+json", patch, metav1.PatchOptions{})
	require.NoError(t, err)
}

// waitClaim waits until cond holds for the claim, and returns it.
func waitClaim(t *testing.T, ns, name, what string, cond func(*corev1.PersistentVolumeClaim) bool) *corev1.PersistentVolumeClaim {
	t.Helper()
	var pvc *corev1.PersistentVolumeClaim
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		pvc, err = cluster.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && cond(pvc), nil
	})
	if err != nil {
		dump(t, ns, name)
		t.Logf("claim status: %+v", pvc.Status)
	}
	require.NoError(t, err, "claim %s/%s: %s", ns, name, what)
	return pvc
}

func resizeStatus(pvc *corev1.PersistentVolumeClaim) corev1.ClaimResourceStatus {
	return pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage]
}

func qty(l corev1.ResourceList) string {
	q, ok := l[corev1.ResourceStorage]
	if !ok {
		return ""
	}
	return q.String()
}

func pvCapacity(t *testing.T, name string) string {
	t.Helper()
	pv, err := cluster.Client.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return qty(pv.Spec.Capacity)
}

func lvSize(t *testing.T, n *node, name string) uint64 { return lvOf(t, n, name).SizeBytes }

// waitEvents waits until the claim has had an event of each reason (of its type).
func waitEvents(t *testing.T, ns, name string, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		evs, err := cluster.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == name {
				got[e.Reason] = e.Type
			}
		}
		for r, typ := range want {
			if got[r] != typ {
				return false, nil
			}
		}
		return true, nil
	})
	require.NoError(t, err, "events of %s/%s: want %v, got %v", ns, name, want, got)
}

// waitFreeCapacity waits until the node's CSIStorageCapacity for class says
// what its volume group has free: the space a grow took is not offered
// to the scheduler again.
func waitFreeCapacity(t *testing.T, n *node, class string) {
	t.Helper()
	var have string
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		caps, err := cluster.Client.StorageV1().CSIStorageCapacities(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		free := n.lvm.Usage()[0].Free
		for _, c := range caps.Items {
			if c.StorageClassName == class && c.NodeTopology != nil && c.NodeTopology.MatchLabels[corev1.LabelHostname] == n.name && c.Capacity != nil {
				have = c.Capacity.String()
				if c.Capacity.Value() == int64(free) {
					return true, nil
				}
			}
		}
		return false, nil
	})
	require.NoError(t, err, "CSIStorageCapacity of %s for %s is %s, the VG has %d bytes free", n.name, class, have, n.lvm.Usage()[0].Free)
}

// A Filesystem claim grows 64 MiB → 256 MiB: kube-controller-manager hands
// it over, the resizer asks the node's agent, the LV grows, the PV's
// capacity is the LV's, and the claim waits for kubelet's filesystem grow
// (NodeResizePending), its capacity unchanged until kubelet has done it.
func TestExpandFilesystem(t *testing.T) {
	n, ns, pv := growingClaim(t, "grow-fs", corev1.PersistentVolumeFilesystem)
	require.EqualValues(t, 64*mib, lvSize(t, n.node, pv.Name))

	askFor(t, ns, "data", "256Mi")
	pvc := waitClaim(t, ns, "data", "NodeResizePending", func(p *corev1.PersistentVolumeClaim) bool {
		return resizeStatus(p) == corev1.PersistentVolumeClaimNodeResizePending
	})
	assert.Equal(t, "256Mi", qty(pvc.Status.AllocatedResources))
	assert.Equal(t, "64Mi", qty(pvc.Status.Capacity), "kubelet sets it once the filesystem grew")
	assert.Equal(t, "256Mi", pvCapacity(t, pv.Name))
	assert.EqualValues(t, 256*mib, lvSize(t, n.node, pv.Name))
	pv, err := cluster.Client.CoreV1().PersistentVolumes().Get(context.Background(), pv.Name, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, kube.StateExpanded, pv.Annotations[kube.AnnLifecycle])
	assert.Equal(t, strconv.Itoa(256*mib), pv.Annotations[kube.AnnSize])
	waitEvents(t, ns, "data", map[string]string{"ExternalExpanding": corev1.EventTypeNormal,
		"Resizing": corev1.EventTypeNormal, "FileSystemResizeRequired": corev1.EventTypeNormal})
	waitFreeCapacity(t, n.node, "grow-fs")
}

// After a Filesystem grow the claim's running Pod is nudged (kubelet syncs a
// Pod whose annotations changed, and grows the filesystem then): once,
// after the API server stored NodeResizePending (resourceVersions are
// etcd's revisions), and no other Pod: not one being deleted, not one of
// another claim.
func TestExpandNudgesThePodOnce(t *testing.T) {
	ctx := context.Background()
	n, ns, _ := growingClaim(t, "grow-nudge", corev1.PersistentVolumeFilesystem)
	claimAndPod(t, ns, "other", "grow-nudge", "64Mi", corev1.PersistentVolumeFilesystem, map[string]string{corev1.LabelHostname: n.name})
	waitBound(t, ns, "other")
	leaving := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "leaving", Finalizers: []string{"test.lvm-agent.io/hold"}},
		Spec: corev1.PodSpec{NodeName: n.name, Containers: []corev1.Container{{Name: "app", Image: "busybox"}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}}}}
	_, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, leaving, metav1.CreateOptions{})
	require.NoError(t, err)
	require.NoError(t, cluster.Client.CoreV1().Pods(ns).Delete(ctx, "leaving", metav1.DeleteOptions{}))
	t.Cleanup(func() {
		_, _ = cluster.Client.CoreV1().Pods(ns).Patch(context.Background(), "leaving", "application/merge-patch+json",
			[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	})
	// Nudged are the Pods kubelet runs (a Pod still to be scheduled mounts
	// the grown volume when it starts): both are bound to the node first.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		bound := 0
		for _, name := range []string{"data", "other"} {
			if p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err == nil && p.Spec.NodeName != "" {
				bound++
			}
		}
		return bound == 2, nil
	})
	require.NoError(t, err, "the Pods scheduled")
	before := podVersions(t, ns)

	askFor(t, ns, "data", "256Mi")
	var nudged *corev1.Pod
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "data", metav1.GetOptions{})
		nudged = p
		return err == nil && p.Annotations[kube.AnnResizeNudge] != "", nil
	})
	if err != nil {
		pods, _ := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		for _, p := range pods.Items {
			t.Logf("pod %s: node %q phase %s annotations %v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Annotations)
		}
		t.Logf("provisioner's log:\n%s", prov.Output())
	}
	require.NoError(t, err, "the Pod of the grown claim is nudged")
	assert.Equal(t, "data=256Mi", nudged.Annotations[kube.AnnResizeNudge])
	pvc, err := cluster.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, corev1.PersistentVolumeClaimNodeResizePending, resizeStatus(pvc), "no kubelet here: the claim stays pending")
	assert.Less(t, revision(t, pvc.ResourceVersion), revision(t, nudged.ResourceVersion), "nudged after NodeResizePending was stored")

	time.Sleep(2 * time.Second) // room for a wrong second nudge
	after := podVersions(t, ns)
	assert.Equal(t, nudged.ResourceVersion, after["data"], "nudged once")
	assert.Equal(t, before["other"], after["other"], "another claim's Pod untouched")
	assert.Equal(t, before["leaving"], after["leaving"], "a Pod being deleted untouched")
}

func podVersions(t *testing.T, ns string) map[string]string {
	t.Helper()
	pods, err := cluster.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	out := map[string]string{}
	for _, p := range pods.Items {
		out[p.Name] = p.ResourceVersion
	}
	return out
}

func revision(t *testing.T, rv string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(rv, 10, 64)
	require.NoError(t, err)
	return n
}

// A Block claim is done when the LV has grown: its status capacity is the
// new size, with no status left for kubelet.
func TestExpandBlock(t *testing.T) {
	n, ns, pv := growingClaim(t, "grow-block", corev1.PersistentVolumeBlock)

	askFor(t, ns, "data", "256Mi")
	pvc := waitClaim(t, ns, "data", "capacity 256Mi", func(p *corev1.PersistentVolumeClaim) bool {
		return qty(p.Status.Capacity) == "256Mi"
	})
	assert.Empty(t, pvc.Status.AllocatedResourceStatuses)
	assert.Equal(t, "256Mi", pvCapacity(t, pv.Name))
	assert.EqualValues(t, 256*mib, lvSize(t, n.node, pv.Name))
	waitEvents(t, ns, "data", map[string]string{"ExternalExpanding": corev1.EventTypeNormal,
		"Resizing": corev1.EventTypeNormal, "VolumeResizeSuccessful": corev1.EventTypeNormal})
	waitFreeCapacity(t, n.node, "grow-block")
}

// A size the volume group cannot hold ends ControllerResizeInfeasible with
// a Warning, the LV and the PV as they were; lowering the request to a size
// that fits grows the volume to it.
func TestExpandTooBigThenRecover(t *testing.T) {
	n, ns, pv := growingClaim(t, "grow-big", corev1.PersistentVolumeFilesystem)

	askFor(t, ns, "data", "4Gi")
	pvc := waitClaim(t, ns, "data", "ControllerResizeInfeasible", func(p *corev1.PersistentVolumeClaim) bool {
		return resizeStatus(p) == corev1.PersistentVolumeClaimControllerResizeInfeasible
	})
	assert.Equal(t, "64Mi", qty(pvc.Status.Capacity))
	waitEvents(t, ns, "data", map[string]string{"VolumeResizeFailed": corev1.EventTypeWarning})
	assert.Equal(t, "64Mi", pvCapacity(t, pv.Name))
	assert.EqualValues(t, 64*mib, lvSize(t, n.node, pv.Name), "the LV is left as it was")
	// external-resizer asks once more after an infeasible answer, which
	// reopens the request on the PV for a moment: wait for the answer.
	require.Eventually(t, func() bool {
		got, err := cluster.Client.CoreV1().PersistentVolumes().Get(context.Background(), pv.Name, metav1.GetOptions{})
		return err == nil && got.Annotations[kube.AnnReason] == kube.ReasonInsufficientCapacity
	}, timeout, 50*time.Millisecond, "the PV's reason is %s", kube.ReasonInsufficientCapacity)

	askFor(t, ns, "data", "128Mi")
	pvc = waitClaim(t, ns, "data", "NodeResizePending at 128Mi", func(p *corev1.PersistentVolumeClaim) bool {
		return resizeStatus(p) == corev1.PersistentVolumeClaimNodeResizePending && qty(p.Status.AllocatedResources) == "128Mi"
	})
	assert.Equal(t, "128Mi", pvCapacity(t, pv.Name))
	assert.EqualValues(t, 128*mib, lvSize(t, n.node, pv.Name))
}

// The agent killed while lvmd extends the LV: the request stays open, the
// restarted agent finds the LV already grown (no second resize) and
// answers, and the claim ends as if nothing happened.
func TestExpandAgentRestartedMidGrow(t *testing.T) {
	n, ns, pv := growingClaim(t, "grow-restart", corev1.PersistentVolumeFilesystem)

	resizing := make(chan struct{}, 10)
	var resizes atomic.Int32
	n.lvm.SetHook(func(op, _, _ string) error {
		if op == "resize" {
			resizes.Add(1)
			resizing <- struct{}{}
		}
		return nil
	})
	n.lvm.SetLatency(2 * time.Second)
	askFor(t, ns, "data", "256Mi")
	select {
	case <-resizing:
	case <-time.After(timeout):
		dump(t, ns, "data")
		t.Fatal("no ResizeLV reached lvmd")
	}
	n.agent.Kill()
	got, err := cluster.Client.CoreV1().PersistentVolumes().Get(context.Background(), pv.Name, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, kube.StateExpanding, got.Annotations[kube.AnnLifecycle], "no answer from the killed agent")
	time.Sleep(3 * time.Second) // lvmd finishes the grow without its client, as the real one does
	n.lvm.SetLatency(0)
	n.startAgent(t)

	pvc := waitClaim(t, ns, "data", "NodeResizePending", func(p *corev1.PersistentVolumeClaim) bool {
		return resizeStatus(p) == corev1.PersistentVolumeClaimNodeResizePending
	})
	assert.Equal(t, "256Mi", qty(pvc.Status.AllocatedResources))
	assert.Equal(t, "256Mi", pvCapacity(t, pv.Name))
	assert.EqualValues(t, 256*mib, lvSize(t, n.node, pv.Name))
	assert.EqualValues(t, 1, resizes.Load(), "the restarted agent found the LV grown")
}

// BenchmarkPVCGrow measures the project's own share of an online expansion:
// from a user raising a claim's request to the claim showing the new
// capacity, through the real kube-controller-manager, the provisioner's
// resizer and the agent, with the fake lvmd answering at once. The claim is
// a Block volume, which is done when the LV has grown (a Filesystem claim
// would then wait for kubelet, which this host has not, and the resizer
// starts no second grow before kubelet's). Each iteration grows it by
// 4 MiB. It prints the median and its steps, each from the first watch
// event that shows it:
//
//	handover   request raised -> the PV's grow request (kube-controller-manager, the resizer)
//	agent      grow request -> the agent's answer (the agent, lvmd)
//	status     the answer -> the claim's new capacity (the resizer: PV capacity, claim status)
//
//	make bench-provision   (go test -run '^$' -bench 'PVCBound|PVCGrow' -benchtime 20x ./integration/provisioning)
func BenchmarkPVCGrow(b *testing.B) {
	n := startGrowNode(b, "bench-grow")
	class := "bench-grow"
	growClass(b, class)
	ns := newNamespace(b)
	claimAndPod(b, ns, "data", class, "64Mi", corev1.PersistentVolumeBlock, map[string]string{corev1.LabelHostname: n.name})
	_, pv := waitBound(b, ns, "data")
	type step struct{ handover, agent, status, total time.Duration }
	var steps []step
	size := 64
	for b.Loop() {
		size += 4
		pvw, err := cluster.Client.CoreV1().PersistentVolumes().Watch(context.Background(),
			metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", pv.Name).String()})
		require.NoError(b, err)
		pvcw, err := cluster.Client.CoreV1().PersistentVolumeClaims(ns).Watch(context.Background(),
			metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", "data").String()})
		require.NoError(b, err)
		want := fmt.Sprintf("%dMi", size)
		start := time.Now()
		patch := []byte(`{"spec":{"resources":{"requests":{"storage":"` + want + `"}}}}`)
		_, err = cluster.Client.CoreV1().PersistentVolumeClaims(ns).Patch(context.Background(), "data", "application/merge-patch+json", patch, metav1.PatchOptions{})
		require.NoError(b, err)
		var asked, answered, pending time.Time
		deadline := time.After(timeout)
		for pending.IsZero() {
			select {
			case ev := <-pvw.ResultChan():
				if o, ok := ev.Object.(*corev1.PersistentVolume); ok {
					switch o.Annotations[kube.AnnLifecycle] {
					case kube.StateExpanding:
						if asked.IsZero() {
							asked = time.Now()
						}
					case kube.StateExpanded:
						if !asked.IsZero() && answered.IsZero() {
							answered = time.Now()
						}
					}
				}
			case ev := <-pvcw.ResultChan():
				if o, ok := ev.Object.(*corev1.PersistentVolumeClaim); ok && qty(o.Status.Capacity) == want {
					pending = time.Now()
				}
			case <-deadline:
				b.Fatalf("claim not at %s in %v", want, timeout)
			}
		}
		pvw.Stop()
		pvcw.Stop()
		if asked.IsZero() || answered.IsZero() {
			b.Fatalf("the PV watch missed the grow request or its answer (asked %v, answered %v)", asked, answered)
		}
		steps = append(steps, step{asked.Sub(start), answered.Sub(asked), pending.Sub(answered), pending.Sub(start)})
	}
	slices.SortFunc(steps, func(x, y step) int { return int(x.total - y.total) })
	m := steps[len(steps)/2]
	b.ReportMetric(m.total.Seconds(), "median-s")
	b.ReportMetric(0, "ns/op")
	fmt.Printf("PVC request raised -> new capacity (Block), fake lvmd at once: median %v of %d (handover %v, agent %v, status %v; min %v, max %v)\n",
		m.total.Round(time.Millisecond), len(steps), m.handover.Round(time.Millisecond), m.agent.Round(time.Millisecond),
		m.status.Round(time.Millisecond), steps[0].total.Round(time.Millisecond), steps[len(steps)-1].total.Round(time.Millisecond))
}
