package kube

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
)

// recorderTarget is a SweepTarget that remembers what it was given.
type recorderTarget struct{ swept, gone []string }

func (r *recorderTarget) Swept(obj runtime.Object) {
	m, _ := metaOf(obj)
	r.swept = append(r.swept, m.GetNamespace()+"/"+m.GetName()+"="+m.GetAnnotations()[AnnLifecycle])
}

func (r *recorderTarget) SweptGone(obj runtime.Object) {
	m, _ := metaOf(obj)
	r.gone = append(r.gone, m.GetNamespace()+"/"+m.GetName())
}

func (r *recorderTarget) reset() { r.swept, r.gone = nil, nil }

func sweepPVC(name, selected, lifecycle string, labels map[string]string) *corev1.PersistentVolumeClaim {
	ann := map[string]string{AnnSelectedNode: selected}
	if lifecycle != "" {
		ann[AnnLifecycle] = lifecycle
	}
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name + "-uid"),
		Annotations: ann, Labels: labels}}
}

func sweepPV(name, node, driver, lifecycle string) *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name + "-uid"),
		Annotations: map[string]string{AnnLifecycle: lifecycle, AnnSpec: "vg/" + name}}}
	pv.Spec.CSI = &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: name}
	pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}}
	return pv
}

func TestSweep(t *testing.T) {
	ctx := context.Background()
	me := Node{Name: "node-a", Drivers: []string{DefaultDriver}}
	c := fake.NewClientset(
		sweepPVC("mine", "node-a", StateCreating, nil),
		sweepPVC("mine-done", "node-a", StateCreated, nil),
		sweepPVC("mine-no-request", "node-a", "", nil),
		sweepPVC("other-node", "node-b", StateCreating, nil),
		// Labelled requests are the informers': the sweep never lists them.
		sweepPVC("labelled", "node-a", StateCreating, map[string]string{LabelNode: "node-a"}),
		sweepPV("pv-mine", "node-a", DefaultDriver, StateDeleting),
		sweepPV("pv-other-driver", "node-a", "other.csi", StateDeleting),
		sweepPV("pv-other-node", "node-b", DefaultDriver, StateDeleting),
	)
	target := &recorderTarget{}
	events := record.NewFakeRecorder(100)
	metrics := NewClientMetrics()
	reg := prometheus.NewRegistry()
	s := NewSweeper(clientset.Wrap(c), target, SweepConfig{Node: me, Interval: time.Minute, PageSize: 2, Recorder: events, Metrics: metrics, Registerer: reg})

	require.NoError(t, s.Sweep(ctx))
	assert.ElementsMatch(t, []string{"ns/mine=creating", "/pv-mine=deleting"}, target.swept)
	assert.Empty(t, target.gone)
	require.Len(t, events.Events, 2, "one warning per unlabelled request")
	assert.Contains(t, <-events.Events, "UnlabelledRequest")
	<-events.Events
	v := gather(t, metrics)
	assert.Equal(t, 3.0, v[key("lvm_agent_kube_objects_received_total", "resource", "persistentvolumeclaims", "source", SourceUnlabelled, "foreign", Own)])
	assert.Equal(t, 1.0, v[key("lvm_agent_kube_objects_received_total", "resource", "persistentvolumeclaims", "source", SourceUnlabelled, "foreign", Foreign)])
	assert.Equal(t, 1.0, v[key("lvm_agent_kube_objects_received_total", "resource", "persistentvolumes", "source", SourceUnlabelled, "foreign", Own)])
	assert.Equal(t, 2.0, v[key("lvm_agent_kube_objects_received_total", "resource", "persistentvolumes", "source", SourceUnlabelled, "foreign", Foreign)])

	// Unchanged: handed over again (the agent ignores what did not change), no second warning.
	target.reset()
	require.NoError(t, s.Sweep(ctx))
	assert.ElementsMatch(t, []string{"ns/mine=creating", "/pv-mine=deleting"}, target.swept)
	assert.Empty(t, events.Events)

	// Answered: handed over once more, so that the agent sees the end, then dropped.
	_, err := UpdatePvcWithAnnotations(ctx, clientset.Wrap(c), "ns", "mine", "", Set(map[string]string{AnnLifecycle: StateCreated}), nil)
	require.NoError(t, err)
	target.reset()
	require.NoError(t, s.Sweep(ctx))
	assert.ElementsMatch(t, []string{"ns/mine=created", "/pv-mine=deleting"}, target.swept)
	target.reset()
	require.NoError(t, s.Sweep(ctx))
	assert.ElementsMatch(t, []string{"/pv-mine=deleting"}, target.swept)

	// Deleted while open: gone.
	require.NoError(t, c.CoreV1().PersistentVolumes().Delete(ctx, "pv-mine", metav1.DeleteOptions{}))
	target.reset()
	require.NoError(t, s.Sweep(ctx))
	assert.Empty(t, target.swept)
	assert.Equal(t, []string{"/pv-mine"}, target.gone)

	// Labelled while open: handed over once as it is now (the informers take
	// it from there), never as gone.
	_, err = c.CoreV1().PersistentVolumeClaims("ns").Create(ctx, sweepPVC("relabel", "node-a", StateCreating, nil), metav1.CreateOptions{})
	require.NoError(t, err)
	target.reset()
	require.NoError(t, s.Sweep(ctx))
	assert.Equal(t, []string{"ns/relabel=creating"}, target.swept)
	_, err = UpdatePvcWithAnnotations(ctx, clientset.Wrap(c), "ns", "relabel", "", nil, Set(map[string]string{LabelNode: "node-a"}))
	require.NoError(t, err)
	target.reset()
	require.NoError(t, s.Sweep(ctx))
	assert.Equal(t, []string{"ns/relabel=creating"}, target.swept)
	assert.Empty(t, target.gone)
	target.reset()
	require.NoError(t, s.Sweep(ctx))
	assert.Empty(t, target.swept, "the informers' now")

	v = gather(t, reg)
	assert.Equal(t, 8.0, v[key("lvm_agent_sweeps_total", "result", "ok")])
	assert.Equal(t, 2.0, v[key("lvm_agent_unlabelled_requests_total", "resource", "persistentvolumeclaims")])
	assert.Equal(t, 1.0, v[key("lvm_agent_unlabelled_requests_total", "resource", "persistentvolumes")])
}

func TestSweepListError(t *testing.T) {
	c := fake.NewClientset()
	c.PrependReactor("list", "persistentvolumeclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("apiserver unavailable")
	})
	reg := prometheus.NewRegistry()
	s := NewSweeper(clientset.Wrap(c), &recorderTarget{}, SweepConfig{Node: Node{Name: "n"}, Registerer: reg})
	require.ErrorContains(t, s.Sweep(context.Background()), "apiserver unavailable")
	assert.Equal(t, 1.0, gather(t, reg)[key("lvm_agent_sweeps_total", "result", "error")])
}

// filterWatches makes the fake clientset's watches honour label selectors
// and resourceVersions, as the API server does.
func filterWatches(c *fake.Clientset) {
	c.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		wa := a.(k8stesting.WatchAction)
		sel := wa.GetWatchRestrictions().Labels
		w, err := c.Tracker().Watch(a.GetResource(), a.GetNamespace(), metav1.ListOptions{ResourceVersion: wa.GetWatchRestrictions().ResourceVersion})
		if err != nil {
			return true, nil, err
		}
		return true, watch.Filter(w, func(ev watch.Event) (watch.Event, bool) {
			m, err := meta.Accessor(ev.Object)
			return ev, err == nil && (sel == nil || sel.Matches(labels.Set(m.GetLabels())))
		}), nil
	})
}

// syncTarget is a recorderTarget safe for the sweeper's goroutines.
type syncTarget struct {
	mu sync.Mutex
	recorderTarget
}

func (s *syncTarget) Swept(obj runtime.Object) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recorderTarget.Swept(obj)
}

func (s *syncTarget) SweptGone(obj runtime.Object) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recorderTarget.SweptGone(obj)
}

func (s *syncTarget) snapshot() ([]string, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.swept...), append([]string(nil), s.gone...)
}

// Run lists at start and every Interval, and never watches: a request
// written between two lists is found by the second, and one labelled while
// held (the labeller's hand-over to the informers) is handed over once more
// as it is now.
func TestSweeperRuns(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := fake.NewClientset(sweepPVC("before", "node-a", StateCreating, nil))
	target := &syncTarget{}
	reg := prometheus.NewRegistry()
	s := NewSweeper(clientset.Wrap(c), target, SweepConfig{Node: Node{Name: "node-a"}, Interval: 20 * time.Millisecond, Registerer: reg})
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	has := func(want string) func() bool {
		return func() bool { got, _ := target.snapshot(); return slices.Contains(got, want) }
	}
	require.Eventually(t, has("ns/before=creating"), 5*time.Second, 5*time.Millisecond, "listed at start")
	_, err := c.CoreV1().PersistentVolumeClaims("ns").Create(ctx, sweepPVC("after", "node-a", StateCreating, nil), metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, has("ns/after=creating"), 5*time.Second, 5*time.Millisecond, "found by a later list")
	_, err = UpdatePvcWithAnnotations(ctx, clientset.Wrap(c), "ns", "after", "", Set(map[string]string{AnnLifecycle: StateCreated}), Set(map[string]string{LabelNode: "node-a"}))
	require.NoError(t, err)
	require.Eventually(t, has("ns/after=created"), 5*time.Second, 5*time.Millisecond, "labelled and answered: read once more")
	require.NoError(t, c.CoreV1().PersistentVolumeClaims("ns").Delete(ctx, "before", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { _, gone := target.snapshot(); return slices.Contains(gone, "ns/before") }, 5*time.Second, 5*time.Millisecond)
	cancel()
	<-done
	for _, a := range c.Actions() {
		assert.NotEqual(t, "watch", a.GetVerb(), "the sweeper lists, never watches")
	}
	assert.Greater(t, gather(t, reg)[key("lvm_agent_sweeps_total", "result", "ok")], 2.0)
}
