package chaos

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lvm-agent/lvm-agent/agent"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

// The invariants must be able to fail: each broken world below breaks the
// one it names, and a sound world breaks none. (No cluster needed.)
func TestInvariantsCatchViolations(t *testing.T) {
	pvc := func(ns, name, uid, state, reason, rv string, ann map[string]string) *corev1.PersistentVolumeClaim {
		a := map[string]string{kube.AnnLifecycle: state, kube.AnnReason: reason}
		for k, v := range ann {
			a[k] = v
		}
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid), ResourceVersion: rv, Annotations: a}}
	}
	keep := &volume{kind: kindKeep, ns: "ns", pvc: "keep", pv: "pv-keep", class: "vg1", lv: "lv-keep", size: 1 << 20, uid: "uid-keep"}
	full := &volume{kind: kindFull, ns: "ns", pvc: "full", pv: "pv-full", class: "vg1", lv: "lv-full", size: 1 << 20, uid: "uid-full", released: time.Now()}
	foreign := &seededLV{class: "vg1", name: "foreign", size: 4 << 20, tags: []string{"made-by-hand"}}
	goodLV := lvmdfake.LV{Class: "vg1", Name: "lv-keep", SizeBytes: 4 << 20, Tags: []string{agent.OwnerTag("uid-keep")}}
	foreignLV := lvmdfake.LV{Class: "vg1", Name: "foreign", SizeBytes: 4 << 20, Tags: []string{"made-by-hand"}}

	sound := func() (*world, *tracker) {
		tr := newTracker()
		tr.observe(pvc("ns", "keep", "uid-keep", "", "", "1", nil), false)
		tr.observe(pvc("ns", "keep", "uid-keep", kube.StateCreated, "", "2", nil), false)
		tr.observe(pvc("ns", "full", "uid-full", kube.StateCreated, "", "3", nil), false)
		deleting := pvc("ns", "full", "uid-full", kube.StateCreated, "", "4", nil)
		deleting.DeletionTimestamp, deleting.Finalizers = &metav1.Time{}, []string{"kubernetes.io/pvc-protection"}
		tr.observe(deleting, false)
		tr.observe(deleting, true)
		tr.observe(&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-full", UID: "pv-uid", ResourceVersion: "5",
			Annotations: map[string]string{kube.AnnLifecycle: kube.StateDeleted}}, Spec: corev1.PersistentVolumeSpec{
			ClaimRef: &corev1.ObjectReference{UID: "uid-full"}}}, false)
		w := &world{vols: []*volume{keep, full}, records: tr.all(), before: []*seededLV{foreign},
			removes: map[string][]time.Time{"lv-full": {full.released.Add(time.Second)}},
			lvs:     []lvmdfake.LV{goodLV, foreignLV}, pvcUIDs: map[types.UID]bool{"uid-keep": true}, claimUIDs: map[types.UID]bool{"uid-full": true},
			listed: map[objKey]listedObj{{"pvc", "ns", "keep"}: {kube.StateCreated, "2", ""}, {"pv", "", "pv-full"}: {kube.StateDeleted, "5", ""}}}
		return w, tr
	}
	violated := func(w *world) []string {
		var out []string
		for _, c := range w.checks() {
			if len(c.violations) > 0 {
				out = append(out, c.name)
			}
		}
		return out
	}
	w, _ := sound()
	require.Empty(t, violated(w), "a sound world")
	assert.Empty(t, w.lagging())

	cases := []struct {
		name  string
		spoil func(w *world, tr *tracker)
		want  string
	}{
		{"answer written twice", func(w *world, tr *tracker) {
			tr.observe(pvc("ns", "keep", "uid-keep", kube.StateCreated, "", "9", map[string]string{kube.AnnError: "late"}), false)
			w.records = tr.all()
		}, "no object written after its final state"},
		{"request written again, never answered", func(w *world, tr *tracker) {
			tr.observe(pvc("ns", "keep", "uid-keep", kube.StateCreating, "", "9", nil), false)
			w.records = tr.all()
		}, "every request reached its expected final state"},
		{"request open without an error", func(w *world, _ *tracker) {
			w.listed[objKey{"pvc", "ns", "stuck"}] = listedObj{kube.StateCreating, "8", ""}
		}, "no request left open without an error"},
		{"wrong answer", func(w *world, tr *tracker) {
			tr.observe(pvc("ns", "other", "uid-other", kube.StateFailed, kube.ReasonNameConflict, "7", nil), false)
			w.records = tr.all()
			w.vols = append(w.vols, &volume{kind: kindKeep, ns: "ns", pvc: "other", uid: "uid-other", class: "vg1", lv: "x"})
		}, "every request reached its expected final state"},
		{"no answer", func(w *world, _ *tracker) {
			w.vols = append(w.vols, &volume{kind: kindKeep, ns: "ns", pvc: "unanswered", uid: "u", class: "vg1", lv: "x"})
		}, "every request reached its expected final state"},
		{"provisioner gave up", func(w *world, _ *tracker) {
			w.vols = append(w.vols, &volume{kind: kindFull, ns: "ns", pvc: "x", err: errors.New("deadline")})
		}, "every request reached its expected final state"},
		{"written after the tracker saw it", func(w *world, _ *tracker) {
			w.listed[objKey{"pvc", "ns", "keep"}] = listedObj{kube.StateCreated, "8", ""}
		}, "final state unchanged in a fresh list (same resourceVersion)"},
		{"second LV for a claim", func(w *world, _ *tracker) {
			w.lvs = append(w.lvs, lvmdfake.LV{Class: "thin", Name: "lv-keep2", SizeBytes: 4 << 20, Tags: []string{agent.OwnerTag("uid-keep")}})
		}, "created volume: exactly one LV, right size, ownership tag"},
		{"two LVs for a claim", func(w *world, _ *tracker) {
			w.lvs = append(w.lvs, lvmdfake.LV{Class: "thin", Name: "lv-keep2", SizeBytes: 4 << 20, Tags: []string{agent.OwnerTag("uid-keep")}})
		}, "no claim with two LVs"},
		{"kept LV removed after a refused delete", func(w *world, _ *tracker) {
			s := &volume{kind: kindStealer, ns: "ns", pvc: "keep", pv: "pv-steal", class: "vg1", lv: "lv-keep", size: 1 << 20, uid: "uid-keep", released: time.Now().Add(-time.Hour)}
			w.vols = append(w.vols, s)
			w.removes = map[string][]time.Time{"lv-keep": {time.Now()}}
		}, "no LV removed unless its claim let go of it"},
		{"live LV removed by a PV that no claim owns", func(w *world, _ *tracker) {
			w.vols = append(w.vols, &volume{kind: kindPointer, pv: "pv-pointer", class: "vg1", lv: "lv-keep", victim: keep})
			w.removes = map[string][]time.Time{"lv-keep": {time.Now()}}
			w.lvs = w.lvs[1:]
		}, "no LV removed unless its claim let go of it"},
		{"LV of the wrong size", func(w *world, _ *tracker) {
			w.lvs[0].SizeBytes = 8 << 20
		}, "created volume: exactly one LV, right size, ownership tag"},
		{"LV left after delete", func(w *world, _ *tracker) {
			w.lvs = append(w.lvs, lvmdfake.LV{Class: "vg1", Name: "lv-full", SizeBytes: 4 << 20, Tags: []string{agent.OwnerTag("uid-full")}})
		}, "deleted volume: no LV left"},
		{"orphan", func(w *world, _ *tracker) {
			w.lvs = append(w.lvs, lvmdfake.LV{Class: "vg1", Name: "orphan", SizeBytes: 4 << 20, Tags: []string{agent.OwnerTag("gone")}})
		}, "no LV of ours without an owner (PVC or bound PV)"},
		{"foreign LV removed", func(w *world, _ *tracker) { w.lvs = w.lvs[:1] }, "foreign and protected LVs untouched"},
		{"remove asked of a foreign LV", func(w *world, _ *tracker) {
			w.removes = map[string][]time.Time{"foreign": {time.Now()}}
		}, "foreign and protected LVs untouched"},
		{"LV in use removed", func(w *world, _ *tracker) {
			w.removes = map[string][]time.Time{"lv-keep": {time.Now()}}
		}, "no LV removed unless its claim let go of it"},
		{"LV removed before its deletion was asked", func(w *world, _ *tracker) {
			// after the created answer (before it, the agent may make the
			// claim's LV again), before the release
			answered := w.records[objKey{"pvc", "ns", "full"}].answered
			full.released = answered.Add(time.Second)
			w.removes = map[string][]time.Time{"lv-full": {answered.Add(time.Millisecond)}}
		}, "no LV removed unless its claim let go of it"},
		{"foreign LV retagged", func(w *world, _ *tracker) {
			w.lvs[1].Tags = []string{"made-by-hand", agent.OwnerTag("uid-keep")}
		}, "foreign and protected LVs untouched"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, tr := sound()
			tc.spoil(w, tr)
			assert.Contains(t, violated(w), tc.want)
		})
	}
}

// Deleting a claim changes it; that is not a write to its request.
func TestChangedBeyondDeletion(t *testing.T) {
	before := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", ResourceVersion: "1",
		Annotations: map[string]string{kube.AnnLifecycle: kube.StateCreated}, Finalizers: []string{"kubernetes.io/pvc-protection"}}}
	deleting := before.DeepCopy()
	deleting.ResourceVersion, deleting.DeletionTimestamp, deleting.Finalizers = "2", &metav1.Time{}, nil
	assert.Empty(t, changedBeyondDeletion(before, deleting))
	written := before.DeepCopy()
	written.Annotations[kube.AnnError] = "x"
	assert.True(t, strings.Contains(changedBeyondDeletion(before, written), kube.AnnError))
	relabelled := before.DeepCopy()
	relabelled.Labels = map[string]string{"a": "b"}
	assert.Contains(t, changedBeyondDeletion(before, relabelled), "labels")
}

// A claim's own LV may be removed and made again before the claim's
// answer, never after it while it keeps it: kindRecreate's first LV before
// its first claim's answer (make chaos, seed 2), the live LV a
// kindPointer PV names before its owner's answer (seed 314437), an
// abandoned claim's LV before any answer.
func TestLVMadeAgainBeforeItsAnswer(t *testing.T) {
	answered := time.Now()
	victim := &volume{kind: kindKeep, ns: "ns", pvc: "victim", class: "vg1", lv: "lv-victim", uid: "uid-v"}
	for _, c := range []struct {
		v       *volume
		removed time.Time
		want    int
	}{
		{&volume{kind: kindRecreate, ns: "ns", pvc: "re", class: "vg1", lv: "lv-new", oldLV: "lv-old", uid: "uid-2",
			firstAnswered: answered, first: answered.Add(time.Second)}, answered.Add(-time.Millisecond), 0},
		{&volume{kind: kindRecreate, ns: "ns", pvc: "re", class: "vg1", lv: "lv-new", oldLV: "lv-old", uid: "uid-2",
			firstAnswered: answered, first: answered.Add(time.Second)}, answered.Add(time.Millisecond), 1},
		{&volume{kind: kindPointer, pv: "pv-pointer", class: "vg1", lv: "lv-victim", victim: victim}, answered.Add(-time.Millisecond), 0},
		{&volume{kind: kindPointer, pv: "pv-pointer", class: "vg1", lv: "lv-victim", victim: victim}, answered.Add(time.Millisecond), 1},
		// A claim deleted before any answer (seed 791041), and one
		// answered, then deleted.
		{&volume{kind: kindAbandon, ns: "ns", pvc: "never", class: "vg1", lv: "lv-ab", released: answered.Add(time.Second)}, answered, 0},
		{&volume{kind: kindAbandon, ns: "ns", pvc: "victim", class: "vg1", lv: "lv-ab", released: answered.Add(time.Second)}, answered.Add(time.Millisecond), 1},
	} {
		lv := c.v.lv
		if c.v.oldLV != "" {
			lv = c.v.oldLV
		}
		w := &world{vols: []*volume{c.v}, removes: map[string][]time.Time{lv: {c.removed}},
			records: map[objKey]record{{"pvc", "ns", "victim"}: {answered: answered}, {"pvc", "ns", "never"}: {}}}
		for _, ch := range w.checks() {
			if ch.name == "no LV removed unless its claim let go of it" {
				assert.Len(t, ch.violations, c.want, "%s: removed %s after the answer", c.v.kind, c.removed.Sub(answered))
			}
		}
	}
}
