package agent

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
	"github.com/lvm-agent/lvm-agent/kube/kubefake"
)

// startHybrid runs an agent in the hybrid watch mode; the test sweeps.
func startHybrid(t *testing.T) (*env, *kube.Sweeper) {
	t.Helper()
	f, backend := serveLVMD(t, thickAndThin[0])
	e := &env{client: fake.NewClientset(), fakeLVMD: f}
	kubefake.Versioned(e.client, nil, "persistentvolumeclaims", "persistentvolumes")
	filterWatches(e.client)
	e.client.PrependReactor("*", "*", e.react)
	n := kube.Node{Name: node, Drivers: []string{kube.DefaultDriver}}
	cfg := Config{Node: n, BackoffBase: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Workers: 4}
	inf := kube.NewInformers(clientset.Wrap(e.client), node, kube.WatchHybrid, kube.WithOwner(n))
	var err error
	e.agent, err = New(cfg, clientset.Wrap(e.client), backend, record.NewFakeRecorder(1000), inf, nil)
	require.NoError(t, err)
	run(t, e.agent)
	require.Eventually(t, e.agent.Synced, 10*time.Second, 5*time.Millisecond)
	return e, kube.NewSweeper(clientset.Wrap(e.client), e.agent, kube.SweepConfig{Node: n, Interval: time.Hour})
}

// filterWatches makes the fake clientset's watches honour label selectors,
// as the API server does (its lists do already).
func filterWatches(c *fake.Clientset) {
	c.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		sel := a.(k8stesting.WatchAction).GetWatchRestrictions().Labels
		w, err := c.Tracker().Watch(a.GetResource(), a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		return true, watch.Filter(w, func(ev watch.Event) (watch.Event, bool) {
			m, err := meta.Accessor(ev.Object)
			return ev, err == nil && (sel == nil || sel.Matches(labels.Set(m.GetLabels())))
		}), nil
	})
}

func (e *env) lifecycle(t *testing.T, name string) string {
	t.Helper()
	pvc, err := e.client.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return pvc.Annotations[kube.AnnLifecycle]
}

func TestHybridUnlabelledRequest(t *testing.T) {
	e, s := startHybrid(t)
	ctx := context.Background()
	e.pvc(t, "default", "pvc", node, spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`))
	// A later claim the watch does deliver (labelled, answered long ago: the
	// agent has nothing to do for it): once the informer holds it, the
	// watch has gone past the unlabelled one.
	_, err := e.client.CoreV1().PersistentVolumeClaims("default").Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{
		Namespace: "default", Name: "probe", UID: "probe-uid", Labels: map[string]string{kube.LabelNode: kube.NodeLabelValue(node)},
		Annotations: map[string]string{kube.AnnSelectedNode: node, kube.AnnLifecycle: kube.StateCreated}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, ok, err := e.agent.inf.PVC.GetStore().GetByKey("default/probe")
		return ok && err == nil
	}, 5*time.Second, 5*time.Millisecond, "the watch delivers the labelled claim")
	_, held, err := e.agent.inf.PVC.GetStore().GetByKey("default/pvc")
	require.NoError(t, err)
	assert.False(t, held, "not labelled: the watch does not see it")
	assert.Equal(t, kube.StateCreating, e.lifecycle(t, "pvc"))
	assert.Zero(t, e.patches())

	require.NoError(t, s.Sweep(ctx))
	assert.Equal(t, kube.StateCreated, e.waitPVC(t, "default", "pvc")[kube.AnnLifecycle])
	// Sweeps after the answer: the agent sees the end, and writes nothing more.
	for i := 0; i < 3; i++ {
		require.NoError(t, s.Sweep(ctx))
	}
	require.Eventually(t, func() bool { return e.settled(Key{Kind: KindPVC, Namespace: "default", Name: "pvc"}) }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1, e.patches(), "one write per transition")
	assert.Zero(t, e.agent.DSW.Len(), "the answered request is forgotten")
	lvs, err := e.lvm.List("thick")
	require.NoError(t, err)
	assert.Len(t, lvs, 1)
}

// A sweep sees snapshots. The queue takes a swept object when it is a new
// request: first seen, changed, or asked again after an answer (failed, then
// creating again with the same spec between two sweeps reads the same), and
// not when only the agent's own error annotation moved its resourceVersion.
func TestSweptQueues(t *testing.T) {
	n := kube.Node{Name: node, Drivers: []string{kube.DefaultDriver}}
	c := fake.NewClientset()
	a, err := New(Config{Node: n}, clientset.Wrap(c), nil, record.NewFakeRecorder(10), kube.NewInformers(clientset.Wrap(c), node, kube.WatchHybrid), nil)
	require.NoError(t, err)
	t.Cleanup(a.queue.ShutDown)
	pvc := func(rv string, ann map[string]string) *corev1.PersistentVolumeClaim {
		a := map[string]string{kube.AnnSelectedNode: node}
		for k, v := range ann {
			a[k] = v
		}
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pvc", UID: "uid-1", ResourceVersion: rv, Annotations: a}}
	}
	request := spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`)
	k := Key{Kind: KindPVC, Namespace: "ns", Name: "pvc"}
	take := func() int {
		n := a.queue.Len()
		for i := 0; i < n; i++ {
			got, _ := a.queue.Get()
			assert.Equal(t, k, got)
			a.queue.Done(got)
		}
		return n
	}

	a.Swept(pvc("1", request))
	assert.Equal(t, 1, take(), "first seen")
	a.Swept(pvc("1", request))
	assert.Equal(t, 0, take(), "seen again")
	withError := pvc("2", request)
	withError.Annotations[kube.AnnError] = "lvmd unavailable"
	a.Swept(withError)
	assert.Equal(t, 0, take(), "only the agent's error annotation changed: retries come from the backoff")
	a.ASW.Answered(k, "2")
	a.Swept(pvc("5", request))
	assert.Equal(t, 1, take(), "answered, then asked again")
	assert.Equal(t, 1, a.DSW.Len())
	a.Swept(pvc("6", map[string]string{kube.AnnLifecycle: kube.StateCreated}))
	assert.Equal(t, 0, take())
	assert.Zero(t, a.DSW.Len(), "ended")
	assert.False(t, a.ASW.IsAnswered(k, "2"))

	// Gone: forgotten, unless the name now holds another object.
	a.Swept(pvc("7", request))
	take()
	other := pvc("8", request)
	other.UID = "uid-2"
	a.SweptGone(other)
	assert.Equal(t, 1, a.DSW.Len(), "another object's end")
	a.SweptGone(pvc("7", request))
	assert.Zero(t, a.DSW.Len())
}

func TestHybridDeletedWhileOpen(t *testing.T) {
	e, s := startHybrid(t)
	ctx := context.Background()
	e.lvm.SetHook(func(string, string, string) error { return errors.New("lvm is busy") }) // keeps it open
	e.pvc(t, "default", "pvc", node, spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`))
	require.NoError(t, s.Sweep(ctx))
	require.Eventually(t, func() bool { return e.agent.DSW.Len() == 1 }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, e.client.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "pvc", metav1.DeleteOptions{}))
	require.NoError(t, s.Sweep(ctx))
	assert.Zero(t, e.agent.DSW.Len(), "a deleted request is forgotten, not retried forever")
}

// A labelled request never waits for a sweep.
func TestHybridLabelledRequest(t *testing.T) {
	e, _ := startHybrid(t)
	ann := spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`)
	pvc := e.pvc(t, "default", "pvc", node, nil)
	_, err := kube.UpdatePvcWithAnnotations(context.Background(), clientset.Wrap(e.client), "default", pvc.Name, "", kube.Set(ann),
		kube.Set(map[string]string{kube.LabelNode: kube.NodeLabelValue(node)}))
	require.NoError(t, err)
	assert.Equal(t, kube.StateCreated, e.waitPVC(t, "default", "pvc")[kube.AnnLifecycle])
}

// Issue 14, item 10: a stale object handed over by a sweep (its answer gets
// a 409 Conflict) is read again, not retried with the same version for ever.
// Its LV is there from an earlier attempt: one still to be made is checked
// against the claim before lvcreate (TestNoVolumeForAnsweredRequest), so
// the stale version would not reach the answer.
func TestStaleSweptObjectReadAgain(t *testing.T) {
	e, _ := startHybrid(t)
	pvc := e.pvc(t, "default", "pvc", node, spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`))
	_, err := e.lvm.Create("thick", "lv1", 4096, []string{OwnerTag(pvc.UID)})
	require.NoError(t, err)
	conflicts := 0
	e.prependReactor("patch", "persistentvolumeclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		var p struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		}
		_ = json.Unmarshal(a.(k8stesting.PatchAction).GetPatch(), &p)
		if p.Metadata.ResourceVersion == "stale" {
			conflicts++
			return true, nil, apierrors.NewConflict(corev1.Resource("persistentvolumeclaims"), "pvc", errors.New("the object has been modified"))
		}
		return false, nil, nil
	})
	stale := pvc.DeepCopy()
	stale.ResourceVersion = "stale"
	e.agent.Swept(stale)
	assert.Equal(t, kube.StateCreated, e.waitPVC(t, "default", "pvc")[kube.AnnLifecycle])
	assert.Equal(t, 1, conflicts, "one conflict, then the fresh object")
}

// The hand-over between the sources: a request found by a sweep and still
// open when the labeller labels it is the informers' from then on; it is
// answered once, and the next sweep (which reads it once more, as it left
// the unlabelled objects) writes nothing and leaves nothing held.
func TestHybridSweptThenLabelled(t *testing.T) {
	e, s := startHybrid(t)
	ctx := context.Background()
	busy := make(chan struct{})
	e.lvm.SetHook(func(string, string, string) error {
		select {
		case <-busy:
			return nil
		default:
			return errors.New("lvm is busy") // keeps it open
		}
	})
	pvc := e.pvc(t, "default", "pvc", node, spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`))
	require.NoError(t, s.Sweep(ctx))
	require.Eventually(t, func() bool { return e.agent.DSW.Len() == 1 }, 5*time.Second, 5*time.Millisecond)
	fresh, err := e.client.CoreV1().PersistentVolumeClaims("default").Get(ctx, pvc.Name, metav1.GetOptions{})
	require.NoError(t, err)
	require.NoError(t, kube.LabelRequest(ctx, clientset.Wrap(e.client), fresh, kube.NodeLabelValue(node)))
	close(busy)
	assert.Equal(t, kube.StateCreated, e.waitPVC(t, "default", "pvc")[kube.AnnLifecycle])
	require.NoError(t, s.Sweep(ctx))
	require.NoError(t, s.Sweep(ctx))
	require.Eventually(t, func() bool { return e.settled(Key{Kind: KindPVC, Namespace: "default", Name: "pvc"}) }, 10*time.Second, 5*time.Millisecond)
	answers := 0
	for _, a := range e.client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && strings.Contains(string(p.GetPatch()), `"`+kube.AnnLifecycle+`":"`+kube.StateCreated+`"`) {
			answers++
		}
	}
	assert.Equal(t, 1, answers, "one answer")
	assert.Zero(t, e.agent.DSW.Len(), "nothing held")
	lvs, err := e.lvm.List("thick")
	require.NoError(t, err)
	assert.Len(t, lvs, 1)
}
