package agent

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

// Issue 29, item 4: the host chaos once ended with a PV answered "deleted"
// and its claim's LV still there. A create acts on a claim as an informer
// last showed it; two ways for that view to be old by the time lvcreate
// runs, each made deterministic here with the fake lvmd's hook:

// lvmOps counts the operations that reach the fake lvmd, by op.
type lvmOps struct{ create, remove atomic.Int32 }

// The create of a claim that, while this agent looks at the volume group, another agent answered and the user deleted, its LV made
// and removed in between (the second agent of a node, or this agent's own
// retry with an informer that lags behind an API server restart). No LV
// may be made for it.
func TestNoVolumeForAnsweredRequest(t *testing.T) {
	e := start(t, Config{})
	var ops lvmOps
	var once atomic.Bool
	e.lvm.SetHook(func(op, class, _ string) error {
		switch {
		case op == "list" && class == "thick" && once.CompareAndSwap(false, true):
			// Everything the other side did, before this agent's listing
			// returns: its answer, then the claim deleted (its LV gone).
			ctx := context.Background()
			_, err := kube.UpdatePvcWithAnnotations(ctx, clientset.Wrap(e.client), "default", "pvc", "", kube.Set(map[string]string{kube.AnnLifecycle: kube.StateCreated}), nil)
			assert.NoError(t, err)
			assert.NoError(t, e.client.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "pvc", metav1.DeleteOptions{}))
		case op == "create":
			ops.create.Add(1)
		}
		return nil
	})
	e.pvc(t, "default", "pvc", node, spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`))
	e.settle(t, &once)
	assert.Zero(t, ops.create.Load(), "no lvcreate for a request the API server no longer has")
	lvs, err := e.lvm.List("thick")
	require.NoError(t, err)
	assert.Empty(t, lvs)
}

// The other way: the claim is deleted while this agent's lvcreate is on its
// way to lvm (it had checked the claim, then lvmd or the VG lock kept the
// call waiting). The LV it made for a claim that is gone is removed again.
func TestVolumeOfGoneClaimRemoved(t *testing.T) {
	e := start(t, Config{})
	var ops lvmOps
	var once atomic.Bool
	e.lvm.SetHook(func(op, _, _ string) error {
		switch op {
		case "create":
			ops.create.Add(1)
			if once.CompareAndSwap(false, true) {
				assert.NoError(t, e.client.CoreV1().PersistentVolumeClaims("default").Delete(context.Background(), "pvc", metav1.DeleteOptions{}))
			}
		case "remove":
			ops.remove.Add(1)
		}
		return nil
	})
	e.pvc(t, "default", "pvc", node, spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`))
	e.settle(t, &once)
	assert.Equal(t, int32(1), ops.create.Load())
	assert.Equal(t, int32(1), ops.remove.Load(), "the LV made for a gone claim is removed")
	lvs, err := e.lvm.List("thick")
	require.NoError(t, err)
	assert.Empty(t, lvs)
}

// A claim that exists but is being deleted when its LV is made gets no LV
// either: the next attempt answers failed/ClaimTerminating, with none left.
func TestVolumeOfTerminatingClaimRemoved(t *testing.T) {
	e := start(t, Config{})
	var once atomic.Bool
	e.lvm.SetHook(func(op, _, _ string) error {
		if op == "create" && once.CompareAndSwap(false, true) {
			// Deleted, kept by pvc-protection (the fake clientset has no
			// finalizers: it is written so).
			ctx := context.Background()
			pvc, err := e.client.CoreV1().PersistentVolumeClaims("default").Get(ctx, "pvc", metav1.GetOptions{})
			if assert.NoError(t, err) {
				now := metav1.Now()
				pvc.DeletionTimestamp, pvc.Finalizers = &now, []string{"kubernetes.io/pvc-protection"}
				_, err = e.client.CoreV1().PersistentVolumeClaims("default").Update(ctx, pvc, metav1.UpdateOptions{})
				assert.NoError(t, err)
			}
		}
		return nil
	})
	e.pvc(t, "default", "pvc", node, spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`))
	e.requireTerminatingNoLV(t)
}

// The claim answered, then deleted, while this agent's lvcreate made its LV:
// the node's other agent listed the LV between that lvcreate and this
// agent's answer, answered created with it, and the user deleted the
// claim, which a Pod may still hold (pvc-protection keeps it, terminating).
// This agent's answer, conditional on the claim as it read it before the
// lvcreate, does not land; the claim read again, the LV is the claim's
// volume, not one no answer named: it stays, and nothing more is written
// on the claim.
func TestAnsweredVolumeOfTerminatingClaimKept(t *testing.T) {
	e := start(t, Config{})
	ops, once := e.otherAgentAnswersFirst(t, func(pvc *corev1.PersistentVolumeClaim) {
		pvc.Annotations[kube.AnnLifecycle], pvc.Annotations[kube.AnnDevice] = kube.StateCreated, "/dev/vg0/lv1"
		now := metav1.Now()
		pvc.DeletionTimestamp, pvc.Finalizers = &now, []string{"kubernetes.io/pvc-protection"}
	})
	e.pvc(t, "default", "pvc", node, spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`))
	e.settle(t, once)
	assert.Equal(t, int32(1), ops.create.Load())
	assert.Zero(t, ops.remove.Load(), "the LV another agent answered with is not removed")
	lvs, err := e.lvm.List("thick")
	require.NoError(t, err)
	assert.Len(t, lvs, 1)
	pvc, err := e.client.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), "pvc", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, kube.StateCreated, pvc.Annotations[kube.AnnLifecycle], "the other agent's answer stands")
	assert.Empty(t, pvc.Annotations[kube.AnnReason])
}

// The same race, answered otherwise: the node's other agent found the
// claim's first LV and answered failed/VolumeMismatch to its renamed
// request, while this agent's lvcreate made the LV of the new name. No
// answer names that LV: this agent's answer does not land, and the LV goes,
// not left as the claim's second (seen in make chaos, seed 28).
func TestVolumeOfRequestAnsweredMeanwhileRemoved(t *testing.T) {
	e := start(t, Config{})
	ops, once := e.otherAgentAnswersFirst(t, func(pvc *corev1.PersistentVolumeClaim) {
		pvc.Annotations[kube.AnnLifecycle], pvc.Annotations[kube.AnnReason] = kube.StateFailed, kube.ReasonVolumeMismatch
	})
	e.pvc(t, "default", "pvc", node, spec(`{"volumeGroup":"thick","name":"lv1-renamed","size":4096}`))
	e.settle(t, once)
	assert.Equal(t, int32(1), ops.create.Load())
	assert.Equal(t, int32(1), ops.remove.Load(), "the LV no answer named is removed")
	lvs, err := e.lvm.List("thick")
	require.NoError(t, err)
	assert.Empty(t, lvs)
	pvc, err := e.client.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), "pvc", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, kube.StateFailed, pvc.Annotations[kube.AnnLifecycle], "the other agent's answer stands")
}

// Two agents of a node found the same thick LV of a claim made by an
// lvcreate cut short (make chaos, seed 1): the other agent wrote its mark
// on the claim, removed the LV, made it again, and was about to answer
// created, conditional on the claim's version with its mark. This agent
// found the new LV and wrote the same mark: a patch that changes nothing
// keeps the version, so it fenced nothing, and the other agent's answer
// landed on a claim whose LV this agent then removed: created, no LV.
// Each agent's mark is its own, so it always moves the claim on: the other
// agent's answer does not land, and the claim's answer names a live LV.
func TestRemadeLVMarkFencesTheOtherAgent(t *testing.T) {
	e := start(t, Config{})
	tags := []string{OwnerTag("default-pvc-uid")}
	require.NoError(t, e.lvm.Add(lvmdfake.LV{Class: "thick", Name: "lv1", SizeBytes: 4 << 20, Tags: tags}))
	var removes atomic.Int32
	var remade, answered atomic.Bool
	var marked string // the claim's version with the first mark: what the other agent read
	pvcNow := func() *corev1.PersistentVolumeClaim {
		pvc, err := e.client.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), "pvc", metav1.GetOptions{})
		require.NoError(t, err)
		return pvc
	}
	e.lvm.SetHook(func(op, _, _ string) error {
		switch {
		case op == "remove":
			if removes.Add(1) == 2 && answered.CompareAndSwap(false, true) {
				// This agent removes the LV the other agent made again:
				// that agent's answer comes now.
				_, err := kube.UpdatePvcWithAnnotations(context.Background(), clientset.Wrap(e.client), "default", "pvc", marked,
					kube.Set(map[string]string{kube.AnnLifecycle: kube.StateCreated, kube.AnnDevice: "/dev/vg0/lv1"}), nil)
				assert.True(t, apierrors.IsConflict(err), "the other agent's answer lands on a claim whose LV is being removed: %v", err)
			}
		case op == "create" && removes.Load() == 1 && remade.CompareAndSwap(false, true):
			// The first mark is on the claim and the LV gone: the other
			// agent, having written that mark, makes the LV again, just
			// before this agent's lvcreate (which then finds it).
			marked = pvcNow().ResourceVersion
			assert.NoError(t, e.lvm.Add(lvmdfake.LV{Class: "thick", Name: "lv1", SizeBytes: 4 << 20, Tags: tags}))
		}
		return nil
	})
	e.pvc(t, "default", "pvc", node, spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`))
	e.settle(t, &answered)
	pvc := pvcNow()
	require.Equal(t, kube.StateCreated, pvc.Annotations[kube.AnnLifecycle], "%v", pvc.Annotations)
	lvs, err := e.lvm.List("thick")
	require.NoError(t, err)
	require.Len(t, lvs, 1, "the claim answered created has its LV")
	assert.Equal(t, "/dev/vg0/lv1", pvc.Annotations[kube.AnnDevice])
}

// The same, should the other agent's mark be word for word this agent's
// (the one the claim carries when this agent's patch reaches the API
// server): the patch changes nothing and moves no version, so this agent
// removes nothing on it. It removes the LV only after a mark of its own
// moved the claim on.
func TestRemadeLVMarkThatChangedNothingRemovesNothing(t *testing.T) {
	e := start(t, Config{})
	require.NoError(t, e.lvm.Add(lvmdfake.LV{Class: "thick", Name: "lv1", SizeBytes: 4 << 20, Tags: []string{OwnerTag("default-pvc-uid")}}))
	gvr := corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims")
	var doctored atomic.Bool
	var sameRV atomic.Value // the claim's version carrying the doctored mark
	e.prependReactor("patch", "persistentvolumeclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		var p struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		if json.Unmarshal(a.(k8stesting.PatchAction).GetPatch(), &p) != nil || !strings.Contains(p.Metadata.Annotations[kube.AnnError], "made again") ||
			!doctored.CompareAndSwap(false, true) {
			return false, nil, nil
		}
		// The other agent's mark, the same words, already on the claim at
		// the version this agent read.
		obj, err := e.client.Tracker().Get(gvr, "default", "pvc")
		if assert.NoError(t, err) {
			pvc := obj.(*corev1.PersistentVolumeClaim).DeepCopy()
			pvc.Annotations[kube.AnnError] = p.Metadata.Annotations[kube.AnnError]
			sameRV.Store(pvc.ResourceVersion)
			assert.NoError(t, e.client.Tracker().Update(gvr, pvc, "default"))
		}
		return false, nil, nil
	})
	var removed atomic.Bool
	e.lvm.SetHook(func(op, _, _ string) error {
		if op == "remove" && removed.CompareAndSwap(false, true) {
			obj, err := e.client.Tracker().Get(gvr, "default", "pvc")
			if assert.NoError(t, err) {
				assert.NotEqual(t, sameRV.Load(), obj.(*corev1.PersistentVolumeClaim).ResourceVersion,
					"the LV is removed only after this agent's mark moved the claim on")
			}
		}
		return nil
	})
	e.pvc(t, "default", "pvc", node, spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`))
	require.Equal(t, kube.StateCreated, e.waitPVC(t, "default", "pvc")[kube.AnnLifecycle])
	assert.True(t, doctored.Load() && removed.Load())
}

// otherAgentAnswersFirst counts lvmd's creates and removes and, once an LV
// is made, has change (the node's other agent's answer) land on the claim
// just before this agent's answer reaches the API server (through the
// tracker, not the clientset, whose reactor chain holds its lock). once
// says it did.
func (e *env) otherAgentAnswersFirst(t *testing.T, change func(*corev1.PersistentVolumeClaim)) (*lvmOps, *atomic.Bool) {
	var ops lvmOps
	var made, once atomic.Bool
	e.lvm.SetHook(func(op, _, _ string) error {
		switch op {
		case "create":
			ops.create.Add(1)
			made.Store(true)
		case "remove":
			ops.remove.Add(1)
		}
		return nil
	})
	gvr := corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims")
	e.prependReactor("patch", "persistentvolumeclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		if !made.Load() || !once.CompareAndSwap(false, true) {
			return false, nil, nil
		}
		obj, err := e.client.Tracker().Get(gvr, "default", "pvc")
		if assert.NoError(t, err) {
			pvc := obj.(*corev1.PersistentVolumeClaim).DeepCopy()
			change(pvc)
			pvc.ResourceVersion = "by-the-other-agent"
			assert.NoError(t, e.client.Tracker().Update(gvr, pvc, "default"))
		}
		return false, nil, nil
	})
	return &ops, &once
}

// settle waits until hooked has fired and the agent is done with the claim
// default/pvc (settled): a retry it had pending has run.
func (e *env) settle(t *testing.T, hooked *atomic.Bool) {
	t.Helper()
	k := Key{Kind: KindPVC, Namespace: "default", Name: "pvc"}
	require.Eventually(t, func() bool { return hooked.Load() && e.settled(k) }, 10*time.Second, 5*time.Millisecond)
}

// settled reports whether the agent is done with k: it holds no request
// and runs no operation, nothing is queued, and k's last sync ended done
// (a retry pending counts a requeue until the sync that forgets it). From
// then on a sync of k, should one come, finds no request and does nothing.
func (e *env) settled(k Key) bool {
	e.agent.mu.Lock()
	busy := len(e.agent.busy)
	e.agent.mu.Unlock()
	return busy == 0 && e.agent.DSW.Len() == 0 && e.agent.queue.Len() == 0 && e.agent.queue.NumRequeues(k) == 0
}

// A create's listing may be --lvmd-list-max-age old. It answers the creates
// that find nothing in the way without a listing of their own, and what it
// shows in the way, or a clone's source, is read again: an operator's foreign LV
// removed since, an LV of the claim removed since, a clone's source made
// since by the node's other agent.
func TestOldListingDecidesNothingInTheWay(t *testing.T) {
	e := start(t, Config{ReadMaxAge: time.Hour})
	var lists atomic.Int32
	e.lvm.SetHook(func(op, _, _ string) error {
		if op == "list" {
			lists.Add(1)
		}
		return nil
	})
	_, err := e.lvm.Create("thick", "foreign", 4096, []string{"someone-else"})
	require.NoError(t, err)
	created := func(name, specJSON string) {
		t.Helper()
		if specJSON != "" {
			e.pvc(t, "default", name, node, spec(specJSON))
		}
		ann := e.waitPVC(t, "default", name)
		require.Equal(t, kube.StateCreated, ann[kube.AnnLifecycle], "annotations: %v", ann)
	}
	created("a", `{"volumeGroup":"thick","name":"lv-a","size":4096}`)
	first := lists.Load()
	require.NotZero(t, first, "the first create lists the classes")
	created("b", `{"volumeGroup":"thick","name":"lv-b","size":4096}`)
	assert.Equal(t, first, lists.Load(), "a create with nothing in the way reads the kept listings")

	// Removed behind the agent's back: the kept listing still shows them.
	require.NoError(t, e.lvm.Remove("thick", "foreign"))
	created("c", `{"volumeGroup":"thick","name":"foreign","size":4096}`)
	require.NoError(t, e.lvm.Remove("thick", "lv-b"))
	_, err = kube.UpdatePvcWithAnnotations(context.Background(), clientset.Wrap(e.client), "default", "b", "", kube.Set(map[string]string{kube.AnnLifecycle: kube.StateCreating}), nil)
	require.NoError(t, err)
	created("b", "")
	lvs, err := e.lvm.List("thick")
	require.NoError(t, err)
	names := map[string][]string{}
	for _, lv := range lvs {
		names[lv.Name] = lv.Tags
	}
	assert.Equal(t, map[string][]string{"lv-a": {OwnerTag("default-a-uid")}, "foreign": {OwnerTag("default-c-uid")}, "lv-b": {OwnerTag("default-b-uid")}}, names,
		"the LVs the kept listing wrongly showed in the way are made for their claims")

	// Made behind the agent's back: a clone's source the kept listing lacks.
	_, err = e.lvm.Create("thin", "src", 4096, []string{OwnerTag("default-other-uid")})
	require.NoError(t, err)
	e.pvc(t, "default", "d", node, cloneSpec("thin", "src", kube.CloneSnapshot, 4096))
	created("d", "")
}

// A claim asked again under another name after its create was answered:
// its LV, made by the node's other agent after this agent's kept listing
// began, is found by a listing begun now, and no second LV is made (the
// chaos suite's seed 1 once had two).
func TestRenamedAfterAnotherAgentsAnswer(t *testing.T) {
	e := start(t, Config{})
	// This agent keeps a listing of the class: a first claim made.
	e.pvc(t, "default", "first", node, spec(`{"volumeGroup":"thick","name":"lv-first","size":4096}`))
	require.Equal(t, kube.StateCreated, e.waitPVC(t, "default", "first")[kube.AnnLifecycle])
	// The other agent made the claim's LV and answered with it.
	_, err := e.lvm.Create("thick", "lv0", 4096, []string{OwnerTag("default-pvc-uid")})
	require.NoError(t, err)
	ann := spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`)
	ann[kube.AnnDevice] = "/dev/vg0/lv0"
	e.pvc(t, "default", "pvc", node, ann)
	got := e.waitPVC(t, "default", "pvc")
	assert.Equal(t, kube.StateFailed, got[kube.AnnLifecycle], "%v", got)
	assert.Equal(t, kube.ReasonVolumeMismatch, got[kube.AnnReason])
	lvs, err := e.lvm.List("thick")
	require.NoError(t, err)
	for _, lv := range lvs {
		assert.NotEqual(t, "lv1", lv.Name, "a second LV of the claim")
	}
}
