package provisioner

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/lvm-agent/lvm-agent/kube"
)

// The controller on a fake API server: node a is tainted out-of-service,
// node b is NotReady. On a, the StatefulSet's claim of the recreate class
// is deleted, the keep class's and the plain claim are kept and marked, an
// unbound claim is sent back to the scheduler, a released PV is marked for
// removal; on b nothing is touched.
func TestNodeLossController(t *testing.T) {
	outOfService := corev1.Taint{Key: corev1.TaintNodeOutOfService, Effect: corev1.TaintEffectNoExecute}
	nodeA := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{outOfService}}}
	nodeB := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Status: corev1.NodeStatus{
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse}}}}
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	classes := []runtime.Object{
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "recreate"}, Provisioner: kube.DefaultProvisioner, VolumeBindingMode: &wffc,
			Parameters: map[string]string{ParamVolumeGroup: "vg1"}},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "keep"}, Provisioner: kube.DefaultProvisioner, VolumeBindingMode: &wffc,
			Parameters: map[string]string{ParamVolumeGroup: "vg1", ParamOnNodeLoss: OnNodeLossKeep}},
	}
	replicas := int32(2)
	set := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db"}, Spec: appsv1.StatefulSetSpec{Replicas: &replicas,
		Selector:             &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
		VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"}}}}}
	claim := func(name, class, node string, bound bool) *corev1.PersistentVolumeClaim {
		c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: k8stypes.UID("uid-" + name),
			Labels: map[string]string{"app": "db"}, Annotations: map[string]string{kube.AnnSelectedNode: node}},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class}}
		if bound {
			c.Spec.VolumeName = "pv-" + name
			c.Annotations[kube.AnnLifecycle] = kube.StateCreated
		} else {
			c.Annotations[kube.AnnLifecycle] = kube.StateCreating
			c.Labels[kube.LabelNode] = node
		}
		return c
	}
	pv := func(name, class, node string, claim *corev1.PersistentVolumeClaim, phase corev1.PersistentVolumePhase) *corev1.PersistentVolume {
		p := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{kube.LabelNode: node},
			Annotations: map[string]string{kube.AnnProvisionedBy: kube.DefaultProvisioner, kube.AnnSpec: "vg1/" + name}},
			Spec: corev1.PersistentVolumeSpec{StorageClassName: class, PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
				PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/dev/vg1/" + name}}},
			Status: corev1.PersistentVolumeStatus{Phase: phase}}
		if claim != nil {
			p.Spec.ClaimRef = &corev1.ObjectReference{Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID}
		}
		return p
	}
	replicaA, replicaB := claim("data-db-0", "recreate", "a", true), claim("data-db-1", "recreate", "b", true)
	keptA, plainA, creatingA := claim("data-db-1x", "keep", "a", true), claim("plain", "recreate", "a", true), claim("late", "recreate", "a", false)
	keptA.Name = "data-db-1" // a StatefulSet's claim name, but of a keep class
	keptA.Namespace = "other"
	objs := append(classes, nodeA, nodeB, set, replicaA, replicaB, keptA, plainA, creatingA,
		pv("pv-data-db-0", "recreate", "a", replicaA, corev1.VolumeBound), pv("pv-data-db-1", "recreate", "b", replicaB, corev1.VolumeBound),
		pv("pv-data-db-1x", "keep", "a", keptA, corev1.VolumeBound), pv("pv-plain", "recreate", "a", plainA, corev1.VolumeBound),
		pv("pv-released", "recreate", "a", nil, corev1.VolumeReleased))
	setOther := set.DeepCopy()
	setOther.Namespace = "other"
	objs = append(objs, setOther)
	client := fake.NewClientset(objs...)
	lost := NewLostNodes()
	p := New(client, Config{LostNodes: lost})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	looks := runNodeLoss(ctx, t, client, p, time.Hour, clock.RealClock{})

	get := func(ns, name string) (*corev1.PersistentVolumeClaim, error) {
		return client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	}
	require.Eventually(t, func() bool { _, err := get("ns", "data-db-0"); return apierrors.IsNotFound(err) }, 10*time.Second, 10*time.Millisecond,
		"the StatefulSet's claim on a is deleted")
	require.Eventually(t, func() bool {
		c, err := get("ns", "late")
		return err == nil && c.Annotations[kube.AnnSelectedNode] == ""
	}, 10*time.Second, 10*time.Millisecond, "the claim creating on a is sent back to the scheduler")
	late, _ := get("ns", "late")
	assert.NotContains(t, late.Labels, kube.LabelNode, "a's agent no longer sees it")
	assert.Equal(t, kube.StateCreating, late.Annotations[kube.AnnLifecycle], "the request stays for the next node")
	want := kube.NodeLostValue("a", LostOutOfService)
	for _, k := range [][2]string{{"other", "data-db-1"}, {"ns", "plain"}} {
		require.Eventually(t, func() bool {
			c, err := get(k[0], k[1])
			return err == nil && c.Annotations[kube.AnnNodeLost] == want
		}, 10*time.Second, 10*time.Millisecond, "%s kept and marked", k)
	}
	require.Eventually(t, func() bool {
		v, err := client.CoreV1().PersistentVolumes().Get(ctx, "pv-released", metav1.GetOptions{})
		return err == nil && v.Annotations[kube.AnnNodeLost] == want
	}, 10*time.Second, 10*time.Millisecond, "the released PV is marked, for Delete to finish it without the agent")
	// b looked at, and decided not lost with nothing to look at again for.
	looks.wait(t, 0, "b looked at", func(l look) bool { return l.node == "b" && l.present && !l.lost && l.recheck == 0 })
	b, err := get("ns", "data-db-1")
	require.NoError(t, err)
	assert.Empty(t, b.Annotations[kube.AnnNodeLost], "NotReady b: untouched")
	assert.Equal(t, "uid-data-db-1", string(b.UID), "NotReady b: its claim kept")
	reason, isLost := lost.Lost("a")
	assert.True(t, isLost)
	assert.Equal(t, LostOutOfService, reason)
	_, isLost = lost.Lost("b")
	assert.False(t, isLost)

	// a back: the kept claims are no longer marked.
	_, err = client.CoreV1().Nodes().Update(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		c, err := get("ns", "plain")
		return err == nil && c.Annotations[kube.AnnNodeLost] == ""
	}, 10*time.Second, 10*time.Millisecond, "plain no longer marked")

	// Delete finishes a marked PV without a word to the agent.
	marked, err := client.CoreV1().PersistentVolumes().Get(ctx, "pv-released", metav1.GetOptions{})
	require.NoError(t, err)
	require.NoError(t, p.Delete(ctx, marked))
	assert.Empty(t, marked.Annotations[kube.AnnLifecycle])
}

// looks are the node-loss controller's decisions, as they are carried out.
type looks struct {
	mu  sync.Mutex
	all []look
	ch  chan struct{} // closed and replaced at each look
}

func (ls *looks) add(l look) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.all = append(ls.all, l)
	close(ls.ch)
	ls.ch = make(chan struct{})
}

// n is the number of looks so far.
func (ls *looks) n() int { ls.mu.Lock(); defer ls.mu.Unlock(); return len(ls.all) }

// wait waits for a look that match says is the one, among those after the
// first from.
func (ls *looks) wait(t *testing.T, from int, what string, match func(look) bool) look {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		ls.mu.Lock()
		for _, l := range ls.all[min(from, len(ls.all)):] {
			if match(l) {
				ls.mu.Unlock()
				return l
			}
		}
		next := ls.ch
		ls.mu.Unlock()
		select {
		case <-next:
		case <-deadline:
			t.Fatalf("%s: no such look in 10 s; looks: %+v", what, ls.all)
		}
	}
}

// runNodeLoss runs the node-loss controller on the leader's informers over
// client, its grace on clk, until ctx ends.
func runNodeLoss(ctx context.Context, t *testing.T, client kubernetes.Interface, p *Provisioner, grace time.Duration, clk clock.WithTicker) *looks {
	t.Helper()
	factory := NewInformers(client, kube.DefaultCapacityAnnotation)
	c := newNodeLoss(factory, p, grace, nil, clk)
	ls := &looks{ch: make(chan struct{})}
	c.onLook = ls.add
	factory.Start(ctx.Done())
	go c.Run(ctx)
	return ls
}

// A deleted Node: inside its grace nothing is released; registered again
// within it, the node is looked at again once the grace has passed (on the
// controller's clock) and is not lost; not back, it is lost then.
func TestNodeLossGrace(t *testing.T) {
	const grace = 5 * time.Minute
	for _, back := range []bool{true, false} {
		t.Run(map[bool]string{true: "registered again", false: "not back"}[back], func(t *testing.T) {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a"}}
			claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "plain", UID: "uid-plain",
				Annotations: map[string]string{kube.AnnSelectedNode: "a"}}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-plain"}}
			pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-plain", Labels: map[string]string{kube.LabelNode: "a"},
				Annotations: map[string]string{kube.AnnProvisionedBy: kube.DefaultProvisioner, kube.AnnSpec: "vg1/pv-plain"}},
				Spec: corev1.PersistentVolumeSpec{PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
					PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/dev/vg1/pv-plain"}},
					ClaimRef:               &corev1.ObjectReference{Namespace: "ns", Name: "plain", UID: "uid-plain"}},
				Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound}}
			client := fake.NewClientset(node, claim, pv)
			clk := testingclock.NewFakeClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
			start := clk.Now()
			lost := NewLostNodes()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			looks := runNodeLoss(ctx, t, client, New(client, Config{LostNodes: lost}), grace, clk)
			looks.wait(t, 0, "a looked at", func(l look) bool { return l.node == "a" && l.present })

			from := looks.n()
			require.NoError(t, client.CoreV1().Nodes().Delete(ctx, "a", metav1.DeleteOptions{}))
			looks.wait(t, from, "a looked at, missing, inside its grace", func(l look) bool {
				return l.node == "a" && !l.present && !l.lost && l.recheck == grace
			})
			if back {
				from := looks.n()
				_, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
				require.NoError(t, err)
				looks.wait(t, from, "a looked at, back", func(l look) bool { return l.node == "a" && l.present && l.at.Equal(start) })
			}
			got, err := client.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "plain", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Empty(t, got.Annotations[kube.AnnNodeLost], "inside the grace: kept unmarked")

			clk.Step(grace)
			l := looks.wait(t, 0, "a looked at once the grace passed", func(l look) bool { return l.node == "a" && !l.at.Before(start.Add(grace)) })
			assert.Equal(t, !back, l.lost, "lost once its grace passed, unless it is back")
			_, isLost := lost.Lost("a")
			assert.Equal(t, !back, isLost)
			if back {
				got, err := client.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "plain", metav1.GetOptions{})
				require.NoError(t, err)
				assert.Empty(t, got.Annotations[kube.AnnNodeLost], "back within the grace: kept unmarked")
				return
			}
			require.Eventually(t, func() bool {
				got, err := client.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "plain", metav1.GetOptions{})
				return err == nil && got.Annotations[kube.AnnNodeLost] == kube.NodeLostValue("a", LostDeleted)
			}, 10*time.Second, 10*time.Millisecond, "not back: the claim kept and marked")
		})
	}
}
