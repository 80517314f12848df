package agent

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

type gcEnv struct {
	client *fake.Clientset
	fakeLVMD
	agent *Agent
	gc    *OrphanGC
	reg   *prometheus.Registry
}

// newGCEnv is an agent that is not running (its informer caches stay empty
// unless withCache), with a collector, over a fake clientset holding objs and
// a fake lvmd with the classes "thick" and "thin".
func newGCEnv(t *testing.T, cfg GCConfig, withCache bool, objs ...runtime.Object) *gcEnv {
	t.Helper()
	f, backend := serveLVMD(t, thickAndThin...)
	e := &gcEnv{client: fake.NewClientset(objs...), fakeLVMD: f, reg: prometheus.NewRegistry()}
	inf := kube.NewInformers(clientset.Wrap(e.client), node, kube.WatchAll)
	var err error
	e.agent, err = New(Config{Node: kube.Node{Name: node, Drivers: []string{kube.DefaultDriver}}, OpTimeout: 5 * time.Second},
		clientset.Wrap(e.client), backend, record.NewFakeRecorder(100), inf, nil)
	require.NoError(t, err)
	if withCache {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		inf.Start(ctx)
		require.True(t, cache.WaitForCacheSync(ctx.Done(), inf.PVC.HasSynced, inf.PV.HasSynced))
	}
	e.gc = NewOrphanGC(e.agent, cfg, e.reg)
	return e
}

func (e *gcEnv) lv(t *testing.T, class, name string, tags ...string) {
	t.Helper()
	_, err := e.lvm.Create(class, name, 4096, tags)
	require.NoError(t, err)
}

func (e *gcEnv) names(t *testing.T, class string) []string {
	t.Helper()
	lvs, err := e.lvm.List(class)
	require.NoError(t, err)
	out := []string{}
	for _, lv := range lvs {
		out = append(out, lv.Name)
	}
	return out
}

func (e *gcEnv) pass(t *testing.T) GCResult {
	t.Helper()
	res, err := e.gc.Pass(context.Background())
	require.NoError(t, err)
	return res
}

func gcPVC(uid types.UID, spec string) *corev1.PersistentVolumeClaim {
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pvc-" + string(uid), UID: uid,
		Annotations: map[string]string{kube.AnnSelectedNode: node}}}
	if spec != "" {
		pvc.Annotations[kube.AnnSpec] = spec
	}
	return pvc
}

func gcPV(name string, claim types.UID, spec, handle string) *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{
			CSI: &corev1.CSIPersistentVolumeSource{Driver: kube.DefaultDriver, VolumeHandle: handle}}}}
	if claim != "" {
		pv.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "default", Name: "gone", UID: claim}
	}
	if spec != "" {
		pv.Annotations[kube.AnnSpec] = spec
	}
	return pv
}

// An LV of ours is removed on the second pass that finds it orphaned, and
// only when nothing in the API server refers to it.
func TestOrphanGC(t *testing.T) {
	deleting := gcPVC("live", "")
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	deleting.Finalizers = []string{"kubernetes.io/pvc-protection"}
	cases := []struct {
		name     string
		class    string
		tags     []string
		objs     []runtime.Object
		shape    lvmdfake.LV   // lv1 beyond its name, class and tags (a pool, a snapshot)
		others   []lvmdfake.LV // more LVs in lv1's class, untagged (added first)
		wantKept bool
	}{
		{name: "orphan", tags: []string{OwnerTag("gone")}},
		// lvremove -f would take the snapshot, or the thin LVs, along: such an
		// LV is kept, as a delete refuses it (NotPlainVolume).
		{name: "origin with a snapshot", tags: []string{OwnerTag("gone")}, others: []lvmdfake.LV{{Name: "snap", Origin: "lv1"}}, wantKept: true},
		{name: "thin pool with a thin LV", tags: []string{OwnerTag("gone")}, shape: lvmdfake.LV{IsPool: true},
			others: []lvmdfake.LV{{Name: "thin1", Pool: "lv1"}}, wantKept: true},
		{name: "snapshot", tags: []string{OwnerTag("gone")}, shape: lvmdfake.LV{Origin: "base"}, others: []lvmdfake.LV{{Name: "base"}}, wantKept: true},
		{name: "thin orphan", class: "thin", tags: []string{OwnerTag("gone"), "app"}},
		{name: "protected", tags: []string{OwnerTag("gone"), ProtectedTag}, wantKept: true},
		// Issue 14, item 9: a Retain class's LV outlives its PV.
		{name: "retained", tags: []string{OwnerTag("gone"), kube.RetainedTag}, wantKept: true},
		{name: "untagged", tags: nil, wantKept: true},
		{name: "foreign tags", tags: []string{"made-by-hand", "lvm-agent.pvcx"}, wantKept: true},
		{name: "prefix without a UID", tags: []string{OwnerTagPrefix}, wantKept: true},
		{name: "PVC exists", tags: []string{OwnerTag("live")}, objs: []runtime.Object{gcPVC("live", "")}, wantKept: true},
		{name: "PVC being deleted", tags: []string{OwnerTag("live")}, objs: []runtime.Object{deleting}, wantKept: true},
		{name: "PV bound to the claim", tags: []string{OwnerTag("gone")}, objs: []runtime.Object{gcPV("pv", "gone", "", "h")}, wantKept: true},
		{name: "PV spec names it", tags: []string{OwnerTag("gone")}, objs: []runtime.Object{gcPV("pv", "", "vg9/lv1", "h")}, wantKept: true},
		{name: "PV JSON spec names it", tags: []string{OwnerTag("gone")}, objs: []runtime.Object{gcPV("pv", "", `{"volumeGroup":"vg9","name":"lv1"}`, "h")}, wantKept: true},
		{name: "PV volume handle", tags: []string{OwnerTag("gone")}, objs: []runtime.Object{gcPV("pv", "", "", "lv1")}, wantKept: true},
		{name: "another PVC's spec names it", tags: []string{OwnerTag("gone")},
			objs: []runtime.Object{gcPVC("other", `{"volumeGroup":"thick","name":"lv1","size":4096}`)}, wantKept: true},
		{name: "unrelated objects", tags: []string{OwnerTag("gone")},
			objs: []runtime.Object{gcPVC("other", `{"volumeGroup":"thick","name":"lv2","size":4096}`), gcPV("pv", "other", "thick/lv2", "lv2")}},
	}
	for _, tc := range cases {
		for _, withCache := range []bool{false, true} {
			name := tc.name + map[bool]string{false: "/live list", true: "/cache"}[withCache]
			t.Run(name, func(t *testing.T) {
				class := tc.class
				if class == "" {
					class = "thick"
				}
				e := newGCEnv(t, GCConfig{}, withCache, tc.objs...)
				all := []string{"lv1"}
				for _, o := range tc.others {
					o.Class, o.SizeBytes = class, 4<<20
					require.NoError(t, e.lvm.Add(o))
					all = append(all, o.Name)
				}
				slices.Sort(all)
				lv := tc.shape
				lv.Name, lv.Class, lv.SizeBytes, lv.Tags = "lv1", class, 4<<20, tc.tags
				require.NoError(t, e.lvm.Add(lv))
				first := e.pass(t)
				assert.Empty(t, first.Removed, "never on the first pass")
				assert.Equal(t, all, e.names(t, class))
				second := e.pass(t)
				if tc.wantKept {
					assert.Empty(t, first.Marked)
					assert.Empty(t, second.Removed)
					assert.Equal(t, all, e.names(t, class))
					return
				}
				require.Len(t, first.Marked, 1)
				assert.Equal(t, Orphan{DeviceClass: class, Name: "lv1", OwnerUID: "gone", SizeBytes: 4 << 20, Since: first.Marked[0].Since}, first.Marked[0])
				require.Len(t, second.Removed, 1)
				assert.Equal(t, first.Marked[0].Since, second.Removed[0].Since)
				assert.Empty(t, e.names(t, class))
				assert.Equal(t, 1.0, value(t, e.gc.removals.WithLabelValues("removed")))
			})
		}
	}
}

// The decision to remove is taken on what the API server says, not on the
// informers' caches: here the PVC exists, but the cache (not started, as in
// watch mode "labelled" for an unlabelled PVC) does not hold it.
func TestOrphanGCAsksTheAPIServer(t *testing.T) {
	e := newGCEnv(t, GCConfig{}, false, gcPVC("live", ""))
	e.lv(t, "thick", "lv1", OwnerTag("live"))
	e.lv(t, "thick", "lv2", OwnerTag("gone"))
	before := countActions(e.client, "list")
	e.pass(t)
	res := e.pass(t)
	assert.Greater(t, countActions(e.client, "list"), before, "listed from the API server")
	require.Len(t, res.Removed, 1)
	assert.Equal(t, "lv2", res.Removed[0].Name)
	assert.Equal(t, []string{"lv1"}, e.names(t, "thick"))

	// When the caches explain every LV, no list is needed.
	e = newGCEnv(t, GCConfig{}, true, gcPVC("live", ""))
	e.lv(t, "thick", "lv1", OwnerTag("live"))
	before = countActions(e.client, "list")
	e.pass(t)
	e.pass(t)
	assert.Equal(t, before, countActions(e.client, "list"))
	assert.Equal(t, []string{"lv1"}, e.names(t, "thick"))
}

// Issue 14, item 9: the whole-cluster list is bounded. An LV that the live
// list explained is not listed for again before RecheckAfter; a dry run's
// reported orphan is reported again without a list.
func TestOrphanGCBoundedLists(t *testing.T) {
	// The PVC exists, but the cache does not hold it (watch mode "labelled").
	e := newGCEnv(t, GCConfig{RecheckAfter: time.Hour}, false, gcPVC("live", ""))
	e.lv(t, "thick", "lv1", OwnerTag("live"))
	before := countActions(e.client, "list")
	for i := 0; i < 4; i++ {
		assert.Empty(t, e.pass(t).Marked)
	}
	assert.Equal(t, 2, countActions(e.client, "list")-before, "one live list (PVCs, PVs) in four passes")
	assert.Equal(t, []string{"lv1"}, e.names(t, "thick"))

	e = newGCEnv(t, GCConfig{DryRun: true, RecheckAfter: time.Hour}, false)
	e.lv(t, "thick", "lv1", OwnerTag("gone"))
	before = countActions(e.client, "list")
	require.Len(t, e.pass(t).Marked, 1)
	for i := 0; i < 3; i++ {
		require.Len(t, e.pass(t).WouldRemove, 1)
	}
	assert.Equal(t, 4, countActions(e.client, "list")-before, "lists to mark and to report, none after")
}

func countActions(c *fake.Clientset, verb string) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetVerb() == verb {
			n++
		}
	}
	return n
}

func TestOrphanGCDryRun(t *testing.T) {
	e := newGCEnv(t, GCConfig{DryRun: true}, false)
	e.lv(t, "thick", "lv1", OwnerTag("gone"))
	first := e.pass(t)
	require.Len(t, first.Marked, 1)
	assert.Equal(t, 1.0, value(t, e.gc.orphans.WithLabelValues("marked")))
	for i := 0; i < 2; i++ {
		res := e.pass(t)
		assert.Empty(t, res.Removed)
		require.Len(t, res.WouldRemove, 1)
		assert.Equal(t, "lv1", res.WouldRemove[0].Name)
		assert.Equal(t, first.Marked[0].Since, res.WouldRemove[0].Since)
	}
	assert.Equal(t, []string{"lv1"}, e.names(t, "thick"))
	assert.Equal(t, 1.0, value(t, e.gc.orphans.WithLabelValues("would_remove")))
	assert.Equal(t, 0.0, value(t, e.gc.orphans.WithLabelValues("marked")))
	assert.Equal(t, 0.0, value(t, e.gc.removals.WithLabelValues("removed")))
	assert.Equal(t, 3.0, value(t, e.gc.passes.WithLabelValues("ok")))
}

// A mark is kept only while the LV stays orphaned: a reference in between
// makes the two passes start again.
func TestOrphanGCReferencedBetweenPasses(t *testing.T) {
	e := newGCEnv(t, GCConfig{}, false)
	e.lv(t, "thick", "lv1", OwnerTag("gone"))
	require.Len(t, e.pass(t).Marked, 1)
	_, err := e.client.CoreV1().PersistentVolumes().Create(context.Background(), gcPV("pv", "gone", "", "h"), metav1.CreateOptions{})
	require.NoError(t, err)
	res := e.pass(t)
	assert.Empty(t, res.Removed)
	assert.Empty(t, res.Marked)
	require.NoError(t, e.client.CoreV1().PersistentVolumes().Delete(context.Background(), "pv", metav1.DeleteOptions{}))
	res = e.pass(t)
	assert.Empty(t, res.Removed, "marked afresh, not removed")
	assert.Len(t, res.Marked, 1)
	assert.Len(t, e.pass(t).Removed, 1)
}

// An LV removed and made again under the same name for another claim between
// two passes is not the LV that was marked.
func TestOrphanGCReplacedLV(t *testing.T) {
	e := newGCEnv(t, GCConfig{}, false)
	e.lv(t, "thick", "lv1", OwnerTag("gone"))
	require.Len(t, e.pass(t).Marked, 1)
	require.NoError(t, e.lvm.Remove("thick", "lv1"))
	e.lv(t, "thick", "lv1", OwnerTag("gone-too"))
	res := e.pass(t)
	assert.Empty(t, res.Removed)
	require.Len(t, res.Marked, 1)
	assert.Equal(t, "gone-too", res.Marked[0].OwnerUID)
}

// The collector takes the agent's per-LV lock: it never removes an LV that a
// create or delete is working on.
func TestOrphanGCBusy(t *testing.T) {
	e := newGCEnv(t, GCConfig{}, false)
	e.lv(t, "thick", "lv1", OwnerTag("gone"))
	e.pass(t)
	require.True(t, e.agent.acquire(target{"thick", "lv1"}))
	res := e.pass(t)
	assert.Empty(t, res.Removed)
	assert.Len(t, res.WouldRemove, 1)
	assert.Equal(t, []string{"lv1"}, e.names(t, "thick"))
	e.agent.release(target{"thick", "lv1"})
	assert.Len(t, e.pass(t).Removed, 1)
}

// A failed pass removes nothing and keeps the marks; a new collector (an
// agent restart) starts with none.
func TestOrphanGCFailures(t *testing.T) {
	e := newGCEnv(t, GCConfig{}, false)
	e.lv(t, "thick", "lv1", OwnerTag("gone"))
	e.pass(t)

	e.lvmd.Stop()
	_, err := e.gc.Pass(context.Background())
	require.ErrorIs(t, err, lvmbackend.ErrUnavailable)
	require.NoError(t, e.lvmd.Serve(e.socket))
	// The client reconnects with backoff: wait until lvmd answers again.
	require.Eventually(t, func() bool {
		_, err := e.agent.backend.Capacity(context.Background())
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)

	e.client.PrependReactor("list", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("API server gone")
	})
	_, err = e.gc.Pass(context.Background())
	require.ErrorContains(t, err, "API server gone")
	assert.Equal(t, []string{"lv1"}, e.names(t, "thick"))
	assert.Equal(t, 2.0, value(t, e.gc.passes.WithLabelValues("error")))
	e.client.ReactionChain = e.client.ReactionChain[1:]

	restarted := NewOrphanGC(e.agent, GCConfig{}, nil)
	res, err := restarted.Pass(context.Background())
	require.NoError(t, err)
	assert.Empty(t, res.Removed, "a restart forgets the marks")
	assert.Len(t, res.Marked, 1)

	res = e.pass(t)
	assert.Len(t, res.Removed, 1, "the mark survived the failed passes")
}

func TestOrphanGCRun(t *testing.T) {
	e := newGCEnv(t, GCConfig{Interval: 20 * time.Millisecond}, false)
	e.lv(t, "thick", "lv1", OwnerTag("gone"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.gc.Run(ctx); close(done) }()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		lvs, err := e.lvm.List("thick")
		return len(lvs) == 0, err
	})
	cancel()
	<-done
	require.NoError(t, err)
	assert.GreaterOrEqual(t, value(t, e.gc.passes.WithLabelValues("ok")), 2.0)
}

// The first pass comes soon after the start, not an interval later, and so
// does the next after a failed pass: a crash's orphans are found when the
// agent is back, though lvmd may not answer yet then.
func TestOrphanGCFirstPassSoon(t *testing.T) {
	defer func(d time.Duration) { firstPassAfter = d }(firstPassAfter)
	firstPassAfter = 10 * time.Millisecond
	e := newGCEnv(t, GCConfig{Interval: time.Hour}, false)
	e.lvmd.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.gc.Run(ctx); close(done) }()
	assert.Eventually(t, func() bool { return value(t, e.gc.passes.WithLabelValues("error")) >= 1 }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, e.lvmd.Serve(e.socket))
	assert.Eventually(t, func() bool { return value(t, e.gc.passes.WithLabelValues("ok")) == 1 }, 10*time.Second, 5*time.Millisecond)
	cancel()
	<-done
}

// A pass with more orphans due than Max removes none of them and keeps
// their marks; with fewer due it removes them all.
func TestOrphanGCHeldAboveMax(t *testing.T) {
	e := newGCEnv(t, GCConfig{Max: 2}, false)
	for _, n := range []string{"lv1", "lv2", "lv3"} {
		e.lv(t, "thick", n, OwnerTag(types.UID("gone-"+n)))
	}
	require.Len(t, e.pass(t).Marked, 3)
	res := e.pass(t)
	assert.Empty(t, res.Removed)
	assert.Len(t, res.Held, 3)
	assert.Equal(t, 3.0, value(t, e.gc.orphans.WithLabelValues("held")))
	assert.Equal(t, []string{"lv1", "lv2", "lv3"}, e.names(t, "thick"))

	require.NoError(t, e.lvm.Remove("thick", "lv3"))
	res = e.pass(t)
	assert.Empty(t, res.Held)
	assert.Len(t, res.Removed, 2, "two due, within Max: both removed, on their marks")
	assert.Empty(t, e.names(t, "thick"))
	assert.Equal(t, 0.0, value(t, e.gc.orphans.WithLabelValues("held")))
}

// value reads a counter or gauge (prometheus' testutil would need a module
// this repository does not require).
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var out dto.Metric
	require.NoError(t, m.Write(&out))
	if out.Counter != nil {
		return out.Counter.GetValue()
	}
	return out.Gauge.GetValue()
}
