package agent

import (
	"cmp"
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
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
	"k8s.io/client-go/tools/record"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
	"github.com/lvm-agent/lvm-agent/kube/kubefake"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

const node = "node-a"

type env struct {
	client *fake.Clientset
	fakeLVMD
	agent   *Agent
	events  *record.FakeRecorder
	metrics *Metrics

	mu       sync.Mutex
	reactors []k8stesting.Reactor // prependReactor's, in front of the clientset's own
}

// prependReactor puts a reaction in front of the clientset's, also once
// the agent runs: the fake clientset's own chain may not change while its
// informers read it.
func (e *env) prependReactor(verb, resource string, fn k8stesting.ReactionFunc) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reactors = append([]k8stesting.Reactor{&k8stesting.SimpleReactor{Verb: verb, Resource: resource, Reaction: fn}}, e.reactors...)
}

// react runs the reactions prependReactor added; the clientset's first.
func (e *env) react(a k8stesting.Action) (bool, runtime.Object, error) {
	e.mu.Lock()
	reactors := slices.Clone(e.reactors)
	e.mu.Unlock()
	for _, r := range reactors {
		if !r.Handles(a) {
			continue
		}
		if handled, obj, err := r.React(a); handled {
			return true, obj, err
		}
	}
	return false, nil, nil
}

// fakeLVMD is a fake LVM behind a fake lvmd speaking topolvm's wire
// protocol on a unix socket.
type fakeLVMD struct {
	lvm    *lvmdfake.LVM
	lvmd   *lvmdfake.Topolvm
	socket string
}

// thickAndThin are the device classes of most tests.
var thickAndThin = []lvmdfake.Class{
	{Name: "thick", VG: "vg0", SizeBytes: 1 << 30},
	{Name: "thin", VG: "vg0", SizeBytes: 1 << 30, Thin: true, Overprovision: 5},
}

// serveLVMD starts a fake lvmd with classes and connects a backend to it,
// both stopped when the test ends.
func serveLVMD(t testing.TB, classes ...lvmdfake.Class) (fakeLVMD, lvmbackend.Backend) {
	t.Helper()
	f := fakeLVMD{lvm: lvmdfake.NewLVM(classes...), socket: filepath.Join(t.TempDir(), "lvmd.sock")}
	f.lvmd = lvmdfake.NewTopolvm(f.lvm)
	require.NoError(t, f.lvmd.Serve(f.socket))
	t.Cleanup(f.lvmd.Stop)
	backend, err := lvmbackend.NewTopolvm(f.socket)
	require.NoError(t, err)
	t.Cleanup(func() { _ = backend.Close() })
	return f, backend
}

// run runs a until the test ends.
func run(t testing.TB, a *Agent) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Run(ctx, time.Second); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// start runs an agent against a fake clientset and a fake lvmd.
func start(t testing.TB, cfg Config) *env {
	t.Helper()
	f, backend := serveLVMD(t, thickAndThin...)
	return startOn(t, cfg, f, backend)
}

// startOn runs an agent against a fake clientset and the given backend.
func startOn(t testing.TB, cfg Config, f fakeLVMD, backend lvmbackend.Backend) *env {
	t.Helper()
	e := &env{client: fake.NewClientset(), fakeLVMD: f}
	// Every answer is conditional on the request's resourceVersion: kept
	// and checked as the API server does (the fake clientset does neither).
	kubefake.Versioned(e.client, nil, "persistentvolumeclaims", "persistentvolumes")
	e.client.PrependReactor("*", "*", e.react)
	cfg.Node = kube.Node{Name: node, Drivers: []string{kube.DefaultDriver}, Provisioners: []string{kube.DefaultProvisioner}}
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase, cfg.BackoffMax = 10*time.Millisecond, 100*time.Millisecond
	}
	cfg.Workers = cmp.Or(cfg.Workers, 4)
	// As lvm-agent runs in front of topolvm's lvmd (the fake here); a
	// negative ReadMaxAge: every read asks lvmd.
	if cfg.ReadMaxAge >= 0 {
		cfg.ShareReads, cfg.ReadMaxAge = true, cmp.Or(cfg.ReadMaxAge, DefaultReadMaxAge)
	}
	inf := kube.NewInformers(clientset.Wrap(e.client), node, kube.WatchAll, kube.WithOwner(cfg.Node))
	e.events, e.metrics = record.NewFakeRecorder(1000), NewMetrics(nil)
	var err error
	e.agent, err = New(cfg, clientset.Wrap(e.client), backend, e.events, inf, e.metrics)
	require.NoError(t, err)
	run(t, e.agent)
	return e
}

func (e *env) pvc(t testing.TB, ns, name, selected string, ann map[string]string) *corev1.PersistentVolumeClaim {
	t.Helper()
	a := map[string]string{kube.AnnSelectedNode: selected}
	for k, v := range ann {
		a[k] = v
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "-" + name + "-uid"), Annotations: a}}
	out, err := e.client.CoreV1().PersistentVolumeClaims(ns).Create(context.Background(), pvc, metav1.CreateOptions{})
	require.NoError(t, err)
	return out
}

func (e *env) pv(t testing.TB, name, selected string, claimUID types.UID, ann map[string]string) {
	t.Helper()
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: kube.DefaultDriver, VolumeHandle: name}},
			NodeAffinity:           affinity(selected),
		}}
	if claimUID != "" {
		pv.Spec.ClaimRef = &corev1.ObjectReference{UID: claimUID}
	}
	_, err := e.client.CoreV1().PersistentVolumes().Create(context.Background(), pv, metav1.CreateOptions{})
	require.NoError(t, err)
}

func affinity(node string) *corev1.VolumeNodeAffinity {
	return &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}}
}

// waitPVC waits until the PVC's lifecycle leaves "creating" and returns its annotations.
func (e *env) waitPVC(t testing.TB, ns, name string) map[string]string {
	return e.wait(t, func(ctx context.Context) (metav1.Object, error) {
		return e.client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	}, kube.StateCreating)
}

func (e *env) waitPV(t testing.TB, name string) map[string]string {
	return e.wait(t, func(ctx context.Context) (metav1.Object, error) {
		return e.client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	}, kube.StateDeleting)
}

func (e *env) wait(t testing.TB, get func(context.Context) (metav1.Object, error), pending string) map[string]string {
	t.Helper()
	var ann map[string]string
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		o, err := get(ctx)
		if err != nil {
			return false, err
		}
		ann = o.GetAnnotations()
		return ann[kube.AnnLifecycle] != pending, nil
	})
	require.NoError(t, err, "annotations: %v", ann)
	return ann
}

// patches counts the patches the agent sent.
func (e *env) patches() int { return countActions(e.client, "patch") }

func spec(s string) map[string]string {
	return map[string]string{kube.AnnLifecycle: kube.StateCreating, kube.AnnSpec: s}
}

func TestCreate(t *testing.T) {
	cases := []struct {
		name       string
		spec       string
		existing   *lvmdfake.LV // an LV made before the request (in existing.Class, or the spec's)
		lvmSays    string       // lvmd's internal error for every lvcreate
		wantState  string
		wantReason string
		wantSize   uint64 // of the LV afterwards (0: no LV)
		remade     bool   // a thick LV of the claim found made: removed and made again (the error noted first)
	}{
		{name: "thick", spec: `{"volumeGroup":"thick","name":"lv1","size":10485760}`, wantState: kube.StateCreated, wantSize: 12 << 20},
		{name: "rounded to extents", spec: `{"volumeGroup":"thick","name":"lv1","size":1}`, wantState: kube.StateCreated, wantSize: 4 << 20},
		{name: "thin", spec: `{"volumeGroup":"thin","name":"lv1","size":4194304,"tags":["app"],"striping":false}`, wantState: kube.StateCreated, wantSize: 4 << 20},
		{name: "bad json", spec: `{"volumeGroup":`, wantState: kube.StateFailed, wantReason: kube.ReasonInvalidSpec},
		{name: "zero size", spec: `{"volumeGroup":"thick","name":"lv1","size":0}`, wantState: kube.StateFailed, wantReason: kube.ReasonInvalidSpec},
		{name: "option-like name", spec: `{"volumeGroup":"thick","name":"-rf","size":4096}`, wantState: kube.StateFailed, wantReason: kube.ReasonInvalidSpec},
		{name: "path name", spec: `{"volumeGroup":"thick","name":"../vg1/x","size":4096}`, wantState: kube.StateFailed, wantReason: kube.ReasonInvalidSpec},
		{name: "spoofed owner tag", spec: `{"volumeGroup":"thick","name":"lv1","size":4096,"tags":["lvm-agent.pvc.other"]}`, wantState: kube.StateFailed, wantReason: kube.ReasonInvalidSpec},
		{name: "striping unconfigured", spec: `{"volumeGroup":"thick","name":"lv1","size":4096,"striping":true}`, wantState: kube.StateFailed, wantReason: kube.ReasonInvalidSpec},
		{name: "unknown vg", spec: `{"volumeGroup":"nope","name":"lv1","size":4096}`, wantState: kube.StateFailed, wantReason: kube.ReasonUnknownVolumeGroup},
		{name: "vg full", spec: `{"volumeGroup":"thick","name":"lv1","size":2147483648}`, wantState: kube.StateFailed, wantReason: kube.ReasonInsufficientCapacity},
		{name: "name held by a foreign LV", spec: `{"volumeGroup":"thick","name":"lv1","size":4096}`,
			existing:  &lvmdfake.LV{Name: "lv1", SizeBytes: 8 << 20, Tags: []string{"someone-else"}},
			wantState: kube.StateFailed, wantReason: kube.ReasonNameConflict, wantSize: 8 << 20},
		{name: "our LV from an earlier attempt", spec: `{"volumeGroup":"thick","name":"lv1","size":4096}`,
			existing:  &lvmdfake.LV{Name: "lv1", SizeBytes: 4096, Tags: []string{OwnerTag("default-pvc-uid")}},
			wantState: kube.StateCreated, wantSize: 4 << 20, remade: true},
		{name: "our LV fills the VG", spec: `{"volumeGroup":"thick","name":"lv1","size":1073741824}`,
			existing:  &lvmdfake.LV{Name: "lv1", SizeBytes: 1 << 30, Tags: []string{OwnerTag("default-pvc-uid")}},
			wantState: kube.StateCreated, wantSize: 1 << 30, remade: true},
		{name: "our thin LV from an earlier attempt", spec: `{"volumeGroup":"thin","name":"lv1","size":4096}`,
			existing:  &lvmdfake.LV{Class: "thin", Name: "lv1", SizeBytes: 4096, Tags: []string{OwnerTag("default-pvc-uid")}},
			wantState: kube.StateCreated, wantSize: 4 << 20},
		// Issue 14, item 5: what lvm refuses for good ends failed.
		{name: "reserved name part", spec: `{"volumeGroup":"thick","name":"data_cvol","size":4096}`, wantState: kube.StateFailed, wantReason: kube.ReasonInvalidSpec},
		{name: "name lvm reserves", spec: `{"volumeGroup":"thick","name":"lv1","size":4096}`,
			lvmSays:   `Names including "_new" are reserved. Please choose a different LV name.`,
			wantState: kube.StateFailed, wantReason: kube.ReasonInvalidSpec},
		{name: "thick name held by a thin LV", spec: `{"volumeGroup":"thick","name":"lv1","size":4096}`,
			existing:  &lvmdfake.LV{Class: "thin", Name: "lv1", SizeBytes: 4 << 20, Tags: []string{OwnerTag("other")}},
			wantState: kube.StateFailed, wantReason: kube.ReasonNameConflict, wantSize: 4 << 20},
		// Item 3: an LV of ours answers only if it is at least the asked size,
		// and a claim owns at most one LV.
		{name: "our LV is smaller than asked", spec: `{"volumeGroup":"thick","name":"lv1","size":8388608}`,
			existing:  &lvmdfake.LV{Name: "lv1", SizeBytes: 4096, Tags: []string{OwnerTag("default-pvc-uid")}},
			wantState: kube.StateFailed, wantReason: kube.ReasonVolumeMismatch, wantSize: 4 << 20},
		{name: "renamed re-request", spec: `{"volumeGroup":"thick","name":"lv1","size":4096}`,
			existing:  &lvmdfake.LV{Name: "lv0", SizeBytes: 4096, Tags: []string{OwnerTag("default-pvc-uid")}},
			wantState: kube.StateFailed, wantReason: kube.ReasonVolumeMismatch, wantSize: 4 << 20},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := start(t, Config{})
			class := "thick"
			if tc.name == "thin" {
				class = "thin"
			}
			if tc.existing != nil {
				in := class
				if tc.existing.Class != "" {
					in = tc.existing.Class
				}
				_, err := e.lvm.Create(in, tc.existing.Name, tc.existing.SizeBytes, tc.existing.Tags)
				require.NoError(t, err)
				if in != class {
					lvs, err := e.lvm.List(in)
					require.NoError(t, err)
					require.Len(t, lvs, 1)
					class = in // the LV checked below
				}
			}
			if tc.lvmSays != "" {
				e.lvm.SetHook(func(op, _, _ string) error {
					if op == "create" {
						return errors.New(tc.lvmSays)
					}
					return nil
				})
			}
			e.pvc(t, "default", "pvc", node, spec(tc.spec))
			ann := e.waitPVC(t, "default", "pvc")
			assert.Equal(t, tc.wantState, ann[kube.AnnLifecycle])
			assert.Equal(t, tc.wantReason, ann[kube.AnnReason])
			if tc.wantState == kube.StateCreated {
				// lvmd's listing reports the LV's path, /dev/<vg>/<lv> (both
				// classes are in vg0); topolvm's CreateLV reports no path, so
				// this also proves the look-up.
				assert.Equal(t, "/dev/vg0/lv1", ann[kube.AnnDevice], "created carries the device path")
			} else {
				assert.NotContains(t, ann, kube.AnnDevice)
			}
			// The agent has seen its answer (it holds the request until the
			// informer shows it) and is done: a second write would be in.
			require.Eventually(t, func() bool { return e.settled(Key{Kind: KindPVC, Namespace: "default", Name: "pvc"}) }, 10*time.Second, 5*time.Millisecond)
			writes := 1
			if tc.remade {
				writes = 2
			}
			assert.Equal(t, writes, e.patches(), "one write per transition")
			if tc.wantState == kube.StateFailed {
				assert.NotEmpty(t, ann[kube.AnnError])
			} else {
				assert.NotContains(t, ann, kube.AnnError)
			}
			lvs, err := e.lvm.List(class)
			require.NoError(t, err)
			if tc.wantSize == 0 {
				assert.Empty(t, lvs)
				return
			}
			require.Len(t, lvs, 1)
			assert.Equal(t, tc.wantSize, lvs[0].SizeBytes)
			if tc.wantState == kube.StateCreated {
				assert.Contains(t, lvs[0].Tags, OwnerTag("default-pvc-uid"))
			}
		})
	}
}

func TestDelete(t *testing.T) {
	const claim = types.UID("claim-uid")
	cases := []struct {
		name          string
		pvSpec        string
		claimUID      types.UID
		tags          []string // of the LV before the request (nil: no LV)
		allowUntagged bool
		wantState     string
		wantReason    string
		wantLVLeft    bool
	}{
		{name: "ours", pvSpec: "thick/lv1", claimUID: claim, tags: []string{OwnerTag(claim)}, wantState: kube.StateDeleted},
		{name: "json spec", pvSpec: `{"volumeGroup":"thick","name":"lv1"}`, tags: []string{OwnerTag(claim)}, wantState: kube.StateDeleted},
		{name: "absent", pvSpec: "thick/lv1", wantState: kube.StateDeleted},
		{name: "protected", pvSpec: "thick/lv1", tags: []string{OwnerTag(claim), ProtectedTag}, wantState: kube.StateFailed, wantReason: kube.ReasonProtected, wantLVLeft: true},
		{name: "untagged", pvSpec: "thick/lv1", tags: []string{}, wantState: kube.StateFailed, wantReason: kube.ReasonNameConflict, wantLVLeft: true},
		{name: "untagged allowed", pvSpec: "thick/lv1", tags: []string{}, allowUntagged: true, wantState: kube.StateDeleted},
		{name: "another claim's LV", pvSpec: "thick/lv1", claimUID: claim, tags: []string{OwnerTag("other")}, wantState: kube.StateFailed, wantReason: kube.ReasonNameConflict, wantLVLeft: true},
		{name: "bad spec", pvSpec: "lv1", wantState: kube.StateFailed, wantReason: kube.ReasonInvalidSpec},
		{name: "unknown vg", pvSpec: "nope/lv1", wantState: kube.StateFailed, wantReason: kube.ReasonUnknownVolumeGroup},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := start(t, Config{AllowUntagged: tc.allowUntagged})
			if tc.tags != nil {
				_, err := e.lvm.Create("thick", "lv1", 4096, tc.tags)
				require.NoError(t, err)
			}
			e.pv(t, "pv1", node, tc.claimUID, map[string]string{kube.AnnLifecycle: kube.StateDeleting, kube.AnnSpec: tc.pvSpec})
			ann := e.waitPV(t, "pv1")
			assert.Equal(t, tc.wantState, ann[kube.AnnLifecycle])
			assert.Equal(t, tc.wantReason, ann[kube.AnnReason])
			lvs, err := e.lvm.List("thick")
			require.NoError(t, err)
			assert.Equal(t, tc.wantLVLeft, len(lvs) == 1)
		})
	}
}

// Issue 14, item 2: a delete is refused while the claim the LV's ownership
// tag names still exists; a claim of that name made since is another claim.
// The PV's claimRef is only a hint: with none, or one without a UID, or one
// naming another claim, the PVCs are searched for the tag's UID.
func TestDeleteLiveClaim(t *testing.T) {
	full := &corev1.ObjectReference{Namespace: "default", Name: "data", UID: "default-data-uid"}
	for _, tc := range []struct {
		name      string
		claimUID  types.UID // of the PVC default/data that exists ("" for none)
		ref       *corev1.ObjectReference
		wantState string
	}{
		{name: "claim exists", claimUID: "default-data-uid", ref: full, wantState: kube.StateFailed},
		{name: "claim re-created", claimUID: "other-uid", ref: full, wantState: kube.StateDeleted},
		{name: "claim gone", ref: full, wantState: kube.StateDeleted},
		{name: "no claimRef, claim exists", claimUID: "default-data-uid", wantState: kube.StateFailed},
		{name: "no claimRef, claim gone", wantState: kube.StateDeleted},
		{name: "no claimRef, claim re-created", claimUID: "other-uid", wantState: kube.StateDeleted},
		{name: "claimRef without UID, claim exists", claimUID: "default-data-uid",
			ref: &corev1.ObjectReference{Namespace: "default", Name: "data"}, wantState: kube.StateFailed},
		{name: "claimRef without UID naming another claim, claim exists", claimUID: "default-data-uid",
			ref: &corev1.ObjectReference{Namespace: "default", Name: "other"}, wantState: kube.StateFailed},
		{name: "claimRef without UID, claim gone",
			ref: &corev1.ObjectReference{Namespace: "default", Name: "data"}, wantState: kube.StateDeleted},
		{name: "claimRef with a UID but no name, claim exists", claimUID: "default-data-uid",
			ref: &corev1.ObjectReference{UID: "default-data-uid"}, wantState: kube.StateFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := start(t, Config{})
			if tc.claimUID != "" {
				_, err := e.client.CoreV1().PersistentVolumeClaims("default").Create(context.Background(),
					&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "data", UID: tc.claimUID}}, metav1.CreateOptions{})
				require.NoError(t, err)
			}
			_, err := e.lvm.Create("thick", "lv1", 4096, []string{OwnerTag("default-data-uid")})
			require.NoError(t, err)
			pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv1",
				Annotations: map[string]string{kube.AnnLifecycle: kube.StateDeleting, kube.AnnSpec: "thick/lv1"}},
				Spec: corev1.PersistentVolumeSpec{
					PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: kube.DefaultDriver, VolumeHandle: "lv1"}},
					NodeAffinity:           affinity(node),
					ClaimRef:               tc.ref}}
			_, err = e.client.CoreV1().PersistentVolumes().Create(context.Background(), pv, metav1.CreateOptions{})
			require.NoError(t, err)
			ann := e.waitPV(t, "pv1")
			assert.Equal(t, tc.wantState, ann[kube.AnnLifecycle])
			lvs, err := e.lvm.List("thick")
			require.NoError(t, err)
			if tc.wantState == kube.StateFailed {
				assert.Equal(t, kube.ReasonClaimInUse, ann[kube.AnnReason])
				assert.Len(t, lvs, 1, "the live claim's LV stays")
			} else {
				assert.Empty(t, lvs)
			}
		})
	}
}

// Issue 14, item 7: only a plain volume without dependents is removed;
// lvremove -f would take an origin's snapshots or a pool's thin LVs along.
func TestDeleteOnlyPlainVolumes(t *testing.T) {
	tag := []string{OwnerTag("claim-uid")}
	for _, tc := range []struct {
		name   string
		lvs    []lvmdfake.LV // lv1 is the one the PV names
		remove bool
	}{
		{name: "linear", lvs: []lvmdfake.LV{{Name: "lv1", Tags: tag}}, remove: true},
		{name: "thin", lvs: []lvmdfake.LV{{Name: "pool0", IsPool: true}, {Name: "lv1", Pool: "pool0", Tags: tag}}, remove: true},
		{name: "origin with a snapshot", lvs: []lvmdfake.LV{{Name: "lv1", Tags: tag}, {Name: "snap", Origin: "lv1"}}},
		{name: "snapshot", lvs: []lvmdfake.LV{{Name: "base"}, {Name: "lv1", Origin: "base", Tags: tag}}},
		{name: "thin pool", lvs: []lvmdfake.LV{{Name: "lv1", IsPool: true, Tags: tag}, {Name: "thin1", Pool: "lv1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := start(t, Config{})
			for _, lv := range tc.lvs {
				lv.Class, lv.SizeBytes = "thick", 4<<20
				require.NoError(t, e.lvm.Add(lv))
			}
			e.pv(t, "pv1", node, "claim-uid", map[string]string{kube.AnnLifecycle: kube.StateDeleting, kube.AnnSpec: "thick/lv1"})
			ann := e.waitPV(t, "pv1")
			lvs, err := e.lvm.List("thick")
			require.NoError(t, err)
			if tc.remove {
				assert.Equal(t, kube.StateDeleted, ann[kube.AnnLifecycle])
				assert.Len(t, lvs, len(tc.lvs)-1)
				return
			}
			assert.Equal(t, kube.StateFailed, ann[kube.AnnLifecycle])
			assert.Equal(t, kube.ReasonNotPlainVolume, ann[kube.AnnReason])
			assert.Len(t, lvs, len(tc.lvs), "nothing removed")
		})
	}
}

// Issue 14, item 6: a PVC that is being deleted gets no LV.
func TestNoVolumeForTerminatingClaim(t *testing.T) {
	e := start(t, Config{})
	now := metav1.Now()
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pvc", UID: "uid",
		DeletionTimestamp: &now, Finalizers: []string{"kubernetes.io/pvc-protection"},
		Annotations: map[string]string{kube.AnnSelectedNode: node, kube.AnnLifecycle: kube.StateCreating,
			kube.AnnSpec: `{"volumeGroup":"thick","name":"lv1","size":4096}`}}}
	_, err := e.client.CoreV1().PersistentVolumeClaims("default").Create(context.Background(), pvc, metav1.CreateOptions{})
	require.NoError(t, err)
	e.requireTerminatingNoLV(t)
}

// requireTerminatingNoLV: default/pvc is answered failed/ClaimTerminating
// and no LV is left in "thick".
func (e *env) requireTerminatingNoLV(t *testing.T) {
	t.Helper()
	ann := e.waitPVC(t, "default", "pvc")
	assert.Equal(t, kube.StateFailed, ann[kube.AnnLifecycle])
	assert.Equal(t, kube.ReasonClaimTerminating, ann[kube.AnnReason])
	lvs, err := e.lvm.List("thick")
	require.NoError(t, err)
	assert.Empty(t, lvs)
}

// Issue 14, item 5: an lvcreate option class lvmd does not know ends failed.
func TestUnknownOptionClass(t *testing.T) {
	e := start(t, Config{StripedOptionClass: "striped"})
	e.pvc(t, "default", "pvc", node, spec(`{"volumeGroup":"thick","name":"lv1","size":4096,"striping":true}`))
	ann := e.waitPVC(t, "default", "pvc")
	assert.Equal(t, kube.StateFailed, ann[kube.AnnLifecycle])
	assert.Equal(t, kube.ReasonInvalidSpec, ann[kube.AnnReason])
	assert.Contains(t, ann[kube.AnnError], "striped")
}

// Requests of other nodes, and objects without a request, are not touched.
func TestIgnoresForeign(t *testing.T) {
	e := start(t, Config{})
	e.pvc(t, "default", "other-node", "node-b", spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`))
	e.pvc(t, "default", "no-lifecycle", node, map[string]string{kube.AnnSpec: `{"volumeGroup":"thick","name":"lv2","size":4096}`})
	e.pv(t, "pv-other", "node-b", "", map[string]string{kube.AnnLifecycle: kube.StateDeleting, kube.AnnSpec: "thick/lv1"})
	// A request of ours after them: once it is answered, the others were seen.
	e.pvc(t, "default", "mine", node, spec(`{"volumeGroup":"thick","name":"lv3","size":4096}`))
	assert.Equal(t, kube.StateCreated, e.waitPVC(t, "default", "mine")[kube.AnnLifecycle])
	for _, name := range []string{"other-node", "no-lifecycle"} {
		pvc, err := e.client.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), name, metav1.GetOptions{})
		require.NoError(t, err)
		assert.NotEqual(t, kube.StateCreated, pvc.Annotations[kube.AnnLifecycle], name)
	}
	lvs, _ := e.lvm.List("thick")
	require.Len(t, lvs, 1)
	assert.Equal(t, "lv3", lvs[0].Name)
}

// A request labelled for this node that another node owns is never acted on
// (the label is only a watch hint): a Warning event and a metric, no write.
func TestMisdirectedRequestOnlyWarned(t *testing.T) {
	e := start(t, Config{})
	labelled := map[string]string{kube.LabelNode: node}
	req := spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`)
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "elsewhere", Labels: labelled,
		Annotations: map[string]string{kube.AnnLifecycle: req[kube.AnnLifecycle], kube.AnnSpec: req[kube.AnnSpec], kube.AnnSelectedNode: "node-b"}}}
	_, err := e.client.CoreV1().PersistentVolumeClaims("default").Create(context.Background(), pvc, metav1.CreateOptions{})
	require.NoError(t, err)
	// A hostPath PV labelled for us and asked to be deleted.
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "hostpath", Labels: labelled,
		Annotations: map[string]string{kube.AnnLifecycle: kube.StateDeleting, kube.AnnSpec: "thick/lv0"}}}
	pv.Spec.HostPath = &corev1.HostPathVolumeSource{Path: "/data"}
	_, err = e.client.CoreV1().PersistentVolumes().Create(context.Background(), pv, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = e.lvm.Create("thick", "lv0", 4096, []string{OwnerTag("x")})
	require.NoError(t, err)

	var warnings []string
	for len(warnings) < 2 {
		select {
		case ev := <-e.events.Events:
			if strings.Contains(ev, "VolumeRequestNotOwned") {
				warnings = append(warnings, ev)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no Warning events for misdirected requests; got %v", warnings)
		}
	}
	assert.Contains(t, warnings[0], "Warning")
	assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.misdirected.WithLabelValues("pvc")))
	assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.misdirected.WithLabelValues("pv")))
	assert.Zero(t, e.patches(), "nothing written on a request that is not ours")
	lvs, _ := e.lvm.List("thick")
	assert.Len(t, lvs, 1, "the labelled hostPath PV's delete removed nothing")
}

// A local PV of a served provisioner, with node affinity on this node, is
// this agent's: its delete is answered.
func TestLocalPVOfServedProvisioner(t *testing.T) {
	e := start(t, Config{})
	const claim = types.UID("claim-uid")
	_, err := e.lvm.Create("thick", "lv1", 4096, []string{OwnerTag(claim)})
	require.NoError(t, err)
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv1", Annotations: map[string]string{
		kube.AnnLifecycle: kube.StateDeleting, kube.AnnSpec: "thick/lv1", kube.AnnProvisionedBy: kube.DefaultProvisioner}},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/dev/vg0/lv1"}},
			ClaimRef:               &corev1.ObjectReference{UID: claim},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}},
		}}
	_, err = e.client.CoreV1().PersistentVolumes().Create(context.Background(), pv, metav1.CreateOptions{})
	require.NoError(t, err)
	assert.Equal(t, kube.StateDeleted, e.waitPV(t, "pv1")[kube.AnnLifecycle])
	lvs, _ := e.lvm.List("thick")
	assert.Empty(t, lvs)
}

// The same PVC name in two namespaces is two requests (the original agent
// keyed PVCs by name only).
func TestSameNameTwoNamespaces(t *testing.T) {
	e := start(t, Config{})
	e.pvc(t, "ns1", "data", node, spec(`{"volumeGroup":"thick","name":"ns1-data","size":4096}`))
	e.pvc(t, "ns2", "data", node, spec(`{"volumeGroup":"thick","name":"ns2-data","size":4096}`))
	assert.Equal(t, kube.StateCreated, e.waitPVC(t, "ns1", "data")[kube.AnnLifecycle])
	assert.Equal(t, kube.StateCreated, e.waitPVC(t, "ns2", "data")[kube.AnnLifecycle])
	lvs, _ := e.lvm.List("thick")
	assert.Len(t, lvs, 2)
}

// A transient lvmd error is written as volume.error and retried; the request
// then completes and the error is removed.
func TestTransientErrorRetried(t *testing.T) {
	e := start(t, Config{})
	e.failCreates(3)
	e.pvc(t, "default", "pvc", node, spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`))
	ann := e.waitPVC(t, "default", "pvc")
	assert.Equal(t, kube.StateCreated, ann[kube.AnnLifecycle])
	assert.NotContains(t, ann, kube.AnnError)
	assert.NotContains(t, ann, kube.AnnReason)
}

// failCreates makes the fake lvmd fail the next n creates.
func (e *env) failCreates(n int) {
	e.lvm.SetHook(func(op, _, _ string) error {
		if op == "create" && n > 0 {
			n--
			return assert.AnError
		}
		return nil
	})
}

// A claim owns at most one LV on the node, whatever device class a
// re-request names.
func TestCreateSecondLVInAnotherClass(t *testing.T) {
	e := start(t, Config{})
	_, err := e.lvm.Create("thick", "lv0", 4096, []string{OwnerTag("default-pvc-uid")})
	require.NoError(t, err)
	e.pvc(t, "default", "pvc", node, spec(`{"volumeGroup":"thin","name":"lv1","size":4096}`))
	ann := e.waitPVC(t, "default", "pvc")
	assert.Equal(t, kube.StateFailed, ann[kube.AnnLifecycle])
	assert.Equal(t, kube.ReasonVolumeMismatch, ann[kube.AnnReason])
	assert.Contains(t, ann[kube.AnnError], "thick/lv0")
	lvs, err := e.lvm.List("thin")
	require.NoError(t, err)
	assert.Empty(t, lvs, "no second LV")
}

// A request's answer is timed once, from its first sighting: the error
// report of a retry is not an answer, and both kinds are timed.
func TestAnswerTimed(t *testing.T) {
	e := start(t, Config{})
	e.failCreates(1)
	claim := e.pvc(t, "default", "pvc", node, spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`))
	assert.Equal(t, kube.StateCreated, e.waitPVC(t, "default", "pvc")[kube.AnnLifecycle])
	// Observed when the patch returns, which may be after a watcher sees it.
	waitAnswers(t, e.metrics, "persistentvolumeclaims")
	// As in a cluster: the claim is gone before its volume is deleted.
	require.NoError(t, e.client.CoreV1().PersistentVolumeClaims("default").Delete(context.Background(), "pvc", metav1.DeleteOptions{}))
	e.pv(t, "pv1", node, claim.UID, map[string]string{kube.AnnLifecycle: kube.StateDeleting, kube.AnnSpec: `{"volumeGroup":"thick","name":"lv1"}`})
	assert.Equal(t, kube.StateDeleted, e.waitPV(t, "pv1")[kube.AnnLifecycle])
	waitAnswers(t, e.metrics, "persistentvolumes")
	assert.Equal(t, uint64(1), answers(t, e.metrics, "persistentvolumeclaims"), "one answer, one observation: the retry's error report is not an answer")
}

// waitAnswers waits for the first answer of resource to be timed.
func waitAnswers(t *testing.T, m *Metrics, resource string) {
	t.Helper()
	require.Eventually(t, func() bool { return answers(t, m, resource) > 0 }, 10*time.Second, 5*time.Millisecond, resource)
}

func answers(t *testing.T, m *Metrics, resource string) uint64 {
	t.Helper()
	var out dto.Metric
	require.NoError(t, m.answer.WithLabelValues(resource).(prometheus.Histogram).Write(&out))
	return out.GetHistogram().GetSampleCount()
}

// The desired state keeps a request's first sighting across its updates;
// an answer stops the clock, so that the next request under the key is
// timed from its own sighting.
func TestRequestFirstSeen(t *testing.T) {
	var d DesiredStateOfWorld
	k := Key{Kind: KindPVC, Namespace: "ns", Name: "pvc"}
	v1 := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "1"}}
	v2 := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "2"}}
	d.Add(k, v1)
	obj, first := d.get(k)
	require.Same(t, v1, obj)
	require.False(t, first.IsZero())
	d.Add(k, v2)
	obj, seen := d.get(k)
	assert.Same(t, v2, obj)
	assert.Equal(t, first, seen, "an update keeps the first sighting")
	assert.True(t, d.replace(k, v2, v1))
	_, seen = d.get(k)
	assert.Equal(t, first, seen, "a re-read keeps it too")

	d.answered(k)
	obj, seen = d.get(k)
	assert.Same(t, v1, obj, "held until the informer shows the answer")
	assert.True(t, seen.IsZero(), "but no longer timed")
	d.Add(k, v2)
	_, seen = d.get(k)
	assert.False(t, seen.IsZero())
	assert.False(t, seen.Before(first), "asked again: a new sighting")

	d.Remove(k)
	obj, seen = d.get(k)
	assert.Nil(t, obj)
	assert.True(t, seen.IsZero())
}

// lvmd away: a create waits with the error noted (never failed), and goes
// on as soon as lvmd is back (the CapacityWatcher's OnBack), not once its
// backoff, grown meanwhile, has passed.
func TestCreateResumedWhenLvmdIsBack(t *testing.T) {
	f, backend := serveLVMD(t, thickAndThin...)
	f.lvmd.Stop()
	e := startOn(t, Config{BackoffBase: time.Minute, BackoffMax: time.Minute}, f, backend)
	w := NewCapacityWatcher(backend, nil)
	w.OnBack = e.agent.Resume
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go w.Run(ctx)

	e.pvc(t, "default", "pvc", node, spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`))
	require.Eventually(t, func() bool {
		pvc, err := e.client.CoreV1().PersistentVolumeClaims("default").Get(ctx, "pvc", metav1.GetOptions{})
		return err == nil && pvc.Annotations[kube.AnnError] != ""
	}, 10*time.Second, 10*time.Millisecond, "the create failed once, lvmd away")
	require.NoError(t, f.lvmd.Serve(f.socket))
	ann := e.waitPVC(t, "default", "pvc") // 10 s: the next retry would be in a minute
	assert.Equal(t, kube.StateCreated, ann[kube.AnnLifecycle])
	assert.NotContains(t, ann, kube.AnnError)
}
