package kube

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
)

func TestParseWatchMode(t *testing.T) {
	for _, s := range []string{"all", "labelled", "hybrid"} {
		m, err := ParseWatchMode(s)
		require.NoError(t, err)
		assert.Equal(t, WatchMode(s), m)
	}
	for _, s := range []string{"", "Hybrid", "labeled"} {
		_, err := ParseWatchMode(s)
		assert.Error(t, err, s)
	}
}

func TestTransform(t *testing.T) {
	me := Node{Name: "node-a", Drivers: []string{DefaultDriver}}
	full := func(o metav1.ObjectMeta) metav1.ObjectMeta {
		o.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
		o.Finalizers = []string{"kubernetes.io/pvc-protection"}
		o.UID, o.ResourceVersion = "uid-1", "7"
		return o
	}
	mine := &corev1.PersistentVolumeClaim{ObjectMeta: full(metav1.ObjectMeta{Namespace: "ns", Name: "mine",
		Annotations: map[string]string{AnnSelectedNode: "node-a", AnnLifecycle: StateCreating}})}
	// Issue 14, item 11: what the protocol does not name is not cached,
	// however large (an annotation may be 256 KiB).
	bulky := mine.DeepCopy()
	bulky.Annotations["example.com/notes"] = strings.Repeat("x", 200<<10)
	bulky.Labels = map[string]string{"app": "db", LabelNode: "node-a"}
	mine.Spec.VolumeName = "pv-x"
	foreign := &corev1.PersistentVolumeClaim{ObjectMeta: full(metav1.ObjectMeta{Namespace: "ns", Name: "theirs",
		Annotations: map[string]string{AnnSelectedNode: "node-b", AnnLifecycle: StateCreating}, Labels: map[string]string{"app": "x"}})}
	pvMine := sweepPV("pv-mine", "node-a", DefaultDriver, StateDeleting)
	pvMine.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "csi"}}
	pvForeign := sweepPV("pv-theirs", "node-b", DefaultDriver, StateDeleting)

	cfg := informerConfig{owner: &me}
	for _, c := range []struct {
		name string
		in   runtime.Object
		want runtime.Object
	}{
		{"own PVC: trimmed, protocol fields kept", mine, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mine",
			UID: "uid-1", ResourceVersion: "7", Annotations: mine.Annotations}}},
		{"own PVC: only the protocol's annotations and label", bulky, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mine",
			UID: "uid-1", ResourceVersion: "7", Annotations: mine.Annotations, Labels: map[string]string{LabelNode: "node-a"}}}},
		{"foreign PVC: stub", foreign, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "theirs", UID: "uid-1", ResourceVersion: "7"}}},
		{"own PV: trimmed, ownership fields kept", pvMine, func() runtime.Object {
			pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-mine", UID: pvMine.UID, Annotations: pvMine.Annotations}}
			pv.Spec.CSI, pv.Spec.NodeAffinity = pvMine.Spec.CSI, pvMine.Spec.NodeAffinity
			return pv
		}()},
		{"foreign PV: stub", pvForeign, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-theirs", UID: pvForeign.UID}}},
	} {
		got, err := cfg.transform(c.in)
		require.NoError(t, err, c.name)
		assert.Equal(t, c.want, got, c.name)
		again, err := cfg.transform(got)
		require.NoError(t, err, c.name)
		assert.Equal(t, got, again, "%s: idempotent", c.name)
	}

	// Without an owner, nothing is stubbed.
	got, err := informerConfig{}.transform(foreign)
	require.NoError(t, err)
	assert.Equal(t, foreign.Annotations, got.(*corev1.PersistentVolumeClaim).Annotations)
}

// The counter counts each object received once.
func TestCounter(t *testing.T) {
	me := Node{Name: "node-a", Drivers: []string{DefaultDriver}}
	m := NewClientMetrics()
	c := counter{informerConfig{owner: &me, metrics: m}, SourceInformer}
	open := sweepPVC("mine", "node-a", StateCreating, nil)
	c.OnAdd(open, true)
	c.OnUpdate(open, open)
	c.OnAdd(sweepPVC("theirs", "node-b", StateCreating, nil), true)
	c.OnAdd(sweepPV("pv-theirs", "node-b", DefaultDriver, StateDeleting), true)
	c.OnDelete(cache.DeletedFinalStateUnknown{Key: "ns/gone", Obj: open})
	v := gather(t, m)
	assert.Equal(t, 2.0, v[key("lvm_agent_kube_objects_received_total", "resource", "persistentvolumeclaims", "source", SourceInformer, "foreign", Own)])
	assert.Equal(t, 1.0, v[key("lvm_agent_kube_objects_received_total", "resource", "persistentvolumeclaims", "source", SourceInformer, "foreign", Foreign)])
	assert.Equal(t, 1.0, v[key("lvm_agent_kube_objects_received_total", "resource", "persistentvolumes", "source", SourceInformer, "foreign", Foreign)])

	// Without an owner: counted as unknown.
	u := counter{informerConfig{metrics: m}, SourceInformer}
	u.OnAdd(open, true)
	assert.Equal(t, 1.0, gather(t, m)[key("lvm_agent_kube_objects_received_total", "resource", "persistentvolumeclaims", "source", SourceInformer, "foreign", ForeignUnknown)])
}

// The labelled and hybrid modes ask the API server for this node's objects only.
func TestInformerSelectors(t *testing.T) {
	for mode, want := range map[WatchMode]string{
		WatchAll:      "",
		WatchLabelled: LabelNode + "=node-a",
		WatchHybrid:   LabelNode + "=node-a",
	} {
		t.Run(string(mode), func(t *testing.T) {
			c := fake.NewClientset()
			var mu sync.Mutex
			selectors := map[string]string{}
			c.PrependReactor("list", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
				mu.Lock()
				defer mu.Unlock()
				selectors[a.GetResource().Resource] = a.(k8stesting.ListAction).GetListRestrictions().Labels.String()
				return false, nil, nil
			})
			inf := NewInformers(clientset.Wrap(c), "node-a", mode)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			inf.Start(ctx)
			require.True(t, cache.WaitForCacheSync(ctx.Done(), inf.PVC.HasSynced, inf.PV.HasSynced))
			cancel()
			mu.Lock()
			defer mu.Unlock()
			assert.Equal(t, map[string]string{"persistentvolumeclaims": want, "persistentvolumes": want}, selectors)
		})
	}
}
