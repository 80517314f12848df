package nodeloss

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/provisioner"
)

// The classes every scenario uses.
const (
	recreate = "nl-recreate" // onNodeLoss unset: recreate, reclaim Delete
	keep     = "nl-keep"     // onNodeLoss: keep
	retain   = "nl-retain"   // recreate, reclaim Retain
)

// The scenarios share the cluster and run side by side, each on its own
// pair of nodes.
func TestNodeLoss(t *testing.T) {
	storageClass(t, recreate, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg1"})
	storageClass(t, keep, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg1", "onNodeLoss": "keep"})
	storageClass(t, retain, corev1.PersistentVolumeReclaimRetain, map[string]string{"volumeGroup": "vg1"})
	t.Run("group", func(t *testing.T) {
		t.Run("OutOfService", func(t *testing.T) { t.Parallel(); outOfService(t) })
		t.Run("Deleted", func(t *testing.T) { t.Parallel(); deleted(t) })
		t.Run("NotLost", func(t *testing.T) { t.Parallel(); notLost(t) })
	})
	t.Run("Metrics", func(t *testing.T) {
		m, err := harness.ReadMetrics(provMetrics)
		require.NoError(t, err)
		assert.Equal(t, 1.0, m[`lvm_agent_provisioner_nodes_lost_total{reason="out-of-service taint"}`], "A of OutOfService")
		assert.Equal(t, 1.0, m[`lvm_agent_provisioner_nodes_lost_total{reason="deleted"}`], "A of Deleted; not NotLost's")
		assert.Equal(t, 3.0, m[`lvm_agent_provisioner_node_loss_claims_total{action="recreated"}`], "db and ret of OutOfService, db of Deleted")
		assert.Equal(t, 2.0, m[`lvm_agent_provisioner_node_loss_claims_total{action="kept"}`], "kept and plain")
		assert.Equal(t, 1.0, m[`lvm_agent_provisioner_node_loss_claims_total{action="rescheduled"}`], "late")
		assert.GreaterOrEqual(t, m[`lvm_agent_provisioner_node_loss_claims_total{action="volume-released"}`], 3.0, "gone, and the PVs of the db claims")
	})
}

// replicaOn is the StatefulSet set's replica (claim data-set-N) whose
// volume is on node.
func replicaOn(t *testing.T, ns, set string, replicas int, node string) (claim, pod string, v volume) {
	t.Helper()
	for i := range replicas {
		c := fmt.Sprintf("data-%s-%d", set, i)
		if v := waitBound(t, ns, c, ""); v.node == node {
			return c, fmt.Sprintf("%s-%d", set, i), v
		}
	}
	t.Fatalf("no replica of %s/%s on %s", ns, set, node)
	return "", "", volume{}
}

// Node A is down and tainted out-of-service. Its StatefulSet replicas get
// new claims on B and their Pods go there; B's replica is untouched; a
// keep class's claim and a plain claim are kept, with the event; a Retain
// class's PV stays; a claim still being created on A is sent back to the
// scheduler and made on B; a PV being deleted on A is removed without A's
// agent. Then A comes back with its disks: its orphan collector finds the
// old LVs, and no claim has them.
func outOfService(t *testing.T) {
	ns := newNamespace(t, "out-of-service")
	a, b := startNode(t, "oos-a", ns), startNode(t, "oos-b", ns)
	both := []string{a.name, b.name}
	waitCapacity(t, both, recreate, keep, retain)
	statefulSet(t, ns, "db", recreate, 2, both, "")
	statefulSet(t, ns, "kept", keep, 1, []string{a.name}, "")
	statefulSet(t, ns, "ret", retain, 1, both, a.name)
	claimAndPod(t, ns, "plain", recreate, placement([]string{a.name}, ""))
	claimAndPod(t, ns, "gone", recreate, placement([]string{a.name}, ""))

	dbClaim, dbPod, dbA := replicaOn(t, ns, "db", 2, a.name)
	otherClaim, otherPod, dbB := replicaOn(t, ns, "db", 2, b.name)
	kept := waitBound(t, ns, "data-kept-0", "")
	ret := waitBound(t, ns, "data-ret-0", "")
	require.Equal(t, a.name, ret.node, "the Retain replica prefers A")
	plain := waitBound(t, ns, "plain", "")
	gone := waitBound(t, ns, "gone", "")
	require.Equal(t, a.name, plain.node)
	otherPodUID, _ := podOn(ns, otherPod)
	// The workload runs (no kubelet here: its Pods are bound to their
	// nodes) before A goes down.
	for _, pod := range []string{dbPod, otherPod, "kept-0", "ret-0", "plain", "gone"} {
		waitFor(t, "Pod "+pod+" scheduled", func() bool { _, on := podOn(ns, pod); return on != "" })
	}

	// A goes down: its agent with it.
	a.agent.Kill()
	ctx := context.Background()
	// A PV released while A is down: its delete request stays open.
	require.NoError(t, cluster.Client.CoreV1().Pods(ns).Delete(ctx, "gone", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}))
	require.NoError(t, cluster.Client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "gone", metav1.DeleteOptions{}))
	waitFor(t, "PV of gone deleting", func() bool {
		pv, err := cluster.Client.CoreV1().PersistentVolumes().Get(ctx, gone.pv.Name, metav1.GetOptions{})
		return err == nil && pv.Annotations[kube.AnnLifecycle] == kube.StateDeleting
	})
	// A claim whose create request went to A just before: still creating.
	claimAndPod(t, ns, "late", recreate, placement(both, a.name))
	waitFor(t, "late creating on A", func() bool {
		pvc, err := getClaim(ns, "late")
		return err == nil && pvc.Annotations[kube.AnnLifecycle] == kube.StateCreating && pvc.Annotations[kube.AnnSelectedNode] == a.name
	})

	oldPodUID, _ := podOn(ns, dbPod)
	setReady(t, a.name, corev1.ConditionFalse)
	setOutOfService(t, a.name, true)
	start := time.Now()

	// The figure: from the taint to A's replica's new claim bound on B,
	// and to its Pod scheduled there; on the way, when the old Pod (taint
	// eviction, then pod GC) and the old claim were gone.
	var podGone, claimGone, toBound, toScheduled time.Duration
	waitFor(t, "A's replica bound and scheduled on B", func() bool {
		if uid, _ := podOn(ns, dbPod); uid != oldPodUID && podGone == 0 {
			podGone = time.Since(start)
		}
		if pvc, err := getClaim(ns, dbClaim); (err != nil || pvc.UID != dbA.pvc.UID) && claimGone == 0 {
			claimGone = time.Since(start)
		}
		if v, ok := bound(ns, dbClaim, string(dbA.pvc.UID)); ok && toBound == 0 {
			require.Equal(t, b.name, v.node)
			toBound = time.Since(start)
		}
		if _, on := podOn(ns, dbPod); on == b.name && toBound != 0 {
			toScheduled = time.Since(start)
			return true
		}
		return false
	})
	t.Logf("FIGURE out-of-service taint → replacement claim Bound on the other node: %v; → its Pod scheduled there: %v "+
		"(on the way: old Pod gone %v, old claim gone %v)", toBound, toScheduled, podGone, claimGone)
	msg := waitEvent(t, ns, dbClaim, string(dbA.pvc.UID), a.name, provisioner.LostOutOfService, "StatefulSet db", dbA.pv.Name)
	t.Logf("event on the replaced claim: %s", msg)

	// B's replica: the same claim, the same Pod.
	v, ok := bound(ns, otherClaim, "")
	require.True(t, ok)
	assert.Equal(t, dbB.pvc.UID, v.pvc.UID, "B's claim untouched")
	uid, on := podOn(ns, otherPod)
	assert.Equal(t, otherPodUID, uid, "B's Pod untouched")
	assert.Equal(t, b.name, on)

	// Kept: the keep class's StatefulSet claim, and the plain claim.
	for _, k := range []volume{kept, plain} {
		msg := waitEvent(t, ns, k.pvc.Name, string(k.pvc.UID), a.name, provisioner.LostOutOfService, "kept", "kubectl -n "+ns+" delete pvc "+k.pvc.Name)
		t.Logf("event on the kept claim %s: %s", k.pvc.Name, msg)
		pvc, err := getClaim(ns, k.pvc.Name)
		require.NoError(t, err)
		assert.Equal(t, k.pvc.UID, pvc.UID, "%s kept", k.pvc.Name)
		assert.Nil(t, pvc.DeletionTimestamp, "%s kept", k.pvc.Name)
		assert.Equal(t, kube.NodeLostValue(a.name, provisioner.LostOutOfService), pvc.Annotations[kube.AnnNodeLost], "shown NODE-LOST by volume status")
	}

	// Retain: the replica gets a new claim on B; the old PV stays, released.
	newRet := waitBound(t, ns, "data-ret-0", string(ret.pvc.UID))
	assert.Equal(t, b.name, newRet.node)
	waitFor(t, "the Retain PV released", func() bool {
		pv, err := cluster.Client.CoreV1().PersistentVolumes().Get(ctx, ret.pv.Name, metav1.GetOptions{})
		return err == nil && pv.Status.Phase == corev1.VolumeReleased
	})

	// The open requests: late made on B; gone's PV removed without A.
	late := waitBound(t, ns, "late", "")
	assert.Equal(t, b.name, late.node, "the claim creating on A went back to the scheduler")
	waitEvent(t, ns, "late", string(late.pvc.UID), a.name, "sent back to the scheduler")
	waitFor(t, "gone's PV removed", func() bool {
		_, err := cluster.Client.CoreV1().PersistentVolumes().Get(ctx, gone.pv.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	msg = waitEvent(t, "default", gone.pv.Name, string(gone.pv.UID), a.name, "vg1/"+gone.pv.Name)
	t.Logf("event on the PV removed without its agent: %s", msg)
	// The PV of A's replaced claim went the same way (reclaim Delete).
	waitFor(t, "the replaced claim's PV removed", func() bool {
		_, err := cluster.Client.CoreV1().PersistentVolumes().Get(ctx, dbA.pv.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})

	// A comes back with its disks: the LVs of the claims that went are
	// still there. Its orphan collector finds them; no claim has them.
	setOutOfService(t, a.name, false)
	setReady(t, a.name, corev1.ConditionTrue)
	a.startAgent(t, "--orphan-gc-interval", "1s", "--orphan-gc-dry-run")
	for _, k := range []volume{kept, plain} {
		waitFor(t, k.pvc.Name+" no longer marked lost", func() bool {
			pvc, err := getClaim(ns, k.pvc.Name)
			return err == nil && pvc.Annotations[kube.AnnNodeLost] == "" && pvc.UID == k.pvc.UID
		})
	}
	for _, lv := range []string{dbA.pv.Name, gone.pv.Name} {
		require.Contains(t, lvNames(t, a), lv)
		waitFor(t, "the orphan collector reports "+lv, func() bool {
			for _, line := range strings.Split(a.agent.Output(), "\n") {
				if strings.Contains(line, "would remove orphan LV") && strings.Contains(line, lv) {
					return true
				}
			}
			return false
		})
	}
	pvs, err := cluster.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	for _, pv := range pvs.Items {
		assert.NotContains(t, []string{dbA.pv.Name, gone.pv.Name}, pv.Name, "no PV names an old LV")
		if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == ns && pv.Status.Phase == corev1.VolumeBound {
			assert.NotEqual(t, dbA.pvc.UID, pv.Spec.ClaimRef.UID)
		}
	}
	// Each LV on A is named for, and tagged with, the claim it was made
	// for: the new claims' LVs are on B.
	assert.NotContains(t, lvNames(t, a), late.pv.Name)
	assert.NotContains(t, lvNames(t, a), newRet.pv.Name)
	v, ok = bound(ns, dbClaim, string(dbA.pvc.UID))
	require.True(t, ok)
	assert.NotContains(t, lvNames(t, a), v.pv.Name)
	assert.Contains(t, lvNames(t, b), v.pv.Name)
}

// Node A's Node object is deleted and does not come back: once the grace
// has passed, its replica gets a new claim on B, and its Pod goes there
// (once the control plane has removed the deleted node's Pod).
func deleted(t *testing.T) {
	ns := newNamespace(t, "deleted")
	a, b := startNode(t, "del-a", ns), startNode(t, "del-b", ns)
	waitCapacity(t, []string{a.name, b.name}, recreate)
	statefulSet(t, ns, "db", recreate, 2, []string{a.name, b.name}, "")
	dbClaim, dbPod, dbA := replicaOn(t, ns, "db", 2, a.name)
	otherClaim, _, dbB := replicaOn(t, ns, "db", 2, b.name)

	a.agent.Kill()
	require.NoError(t, cluster.Client.CoreV1().Nodes().Delete(context.Background(), a.name, metav1.DeleteOptions{}))
	start := time.Now()
	msg := waitEvent(t, ns, dbClaim, string(dbA.pvc.UID), a.name, provisioner.LostDeleted)
	t.Logf("deleted node: the claim released after %v (grace %v): %s", time.Since(start), grace, msg)
	v := waitBound(t, ns, dbClaim, string(dbA.pvc.UID))
	assert.Equal(t, b.name, v.node)
	waitFor(t, "the replica's Pod scheduled on B", func() bool { _, on := podOn(ns, dbPod); return on == b.name })
	t.Logf("deleted node: replacement bound and scheduled on B %v after the deletion (grace %v)", time.Since(start), grace)
	same, ok := bound(ns, otherClaim, "")
	require.True(t, ok)
	assert.Equal(t, dbB.pvc.UID, same.pvc.UID, "B's claim untouched")
}

// Neither a node NotReady for longer than the grace nor one deleted and
// registered again within it is lost: the controller looks at the node
// (its log says so) and touches nothing, no event.
func notLost(t *testing.T) {
	ns := newNamespace(t, "not-lost")
	a, b := startNode(t, "stay-a", ns), startNode(t, "stay-b", ns)
	waitCapacity(t, []string{a.name, b.name}, recreate)
	statefulSet(t, ns, "db", recreate, 2, []string{a.name, b.name}, "")
	_, podA, va := replicaOn(t, ns, "db", 2, a.name)
	_, _, vb := replicaOn(t, ns, "db", 2, b.name)
	// Scheduled before anything happens to its node: untouched compares
	// with where it runs.
	waitFor(t, "Pod "+podA+" scheduled on "+a.name, func() bool { _, on := podOn(ns, podA); return on == a.name })
	podUID, _ := podOn(ns, podA)
	untouched := func(what string) {
		for _, v := range []volume{va, vb} {
			now, ok := bound(ns, v.pvc.Name, "")
			require.True(t, ok, what)
			assert.Equal(t, v.pvc.UID, now.pvc.UID, "%s: %s untouched", what, v.pvc.Name)
		}
		uid, on := podOn(ns, podA)
		assert.Equal(t, podUID, uid, what)
		assert.Equal(t, a.name, on, what)
		assert.Empty(t, nodeLostEvents(t, ns), what)
	}

	// NotReady: looked at, not lost, nothing to look at again for (a
	// present Node's answer never changes with time alone).
	rv := setReady(t, a.name, corev1.ConditionFalse)
	notReady := time.Now()
	waitLooked(t, a.name, rv)
	untouched("NotReady")
	// Still NotReady once the grace has passed: its next heartbeat is looked
	// at, with the same answer.
	time.Sleep(time.Until(notReady.Add(grace + time.Second)))
	waitLooked(t, a.name, setReady(t, a.name, corev1.ConditionFalse))
	untouched("NotReady longer than the grace")
	setReady(t, a.name, corev1.ConditionTrue)

	// Deleted, and registered again once the controller counts it missing:
	// looked at again when the grace ends, and not lost.
	require.NoError(t, cluster.Client.CoreV1().Nodes().Delete(context.Background(), a.name, metav1.DeleteOptions{}))
	waitLog(t, `"Node deleted: lost unless it registers again within the grace" node="`+a.name+`"`)
	registerNode(t, a.name, ns)
	waitLog(t, `"Node registered again within its grace: not lost" node="`+a.name+`"`)
	untouched("deleted and registered again within the grace")
	assert.False(t, slices.ContainsFunc(strings.Split(prov.Output(), "\n"), func(l string) bool {
		return strings.Contains(l, "Node lost") && strings.Contains(l, `"`+a.name+`"`)
	}), "no decision logged for %s", a.name)
}

// looked matches the provisioner's V(4) line of a node-loss decision
// (--vmodule=nodeloss_controller=4).
var looked = regexp.MustCompile(`"Node looked at" node="([^"]+)" resourceVersion="(\d*)" lost=(true|false) reason="[^"]*" recheckIn="([^"]+)"`)

// waitLooked waits for the node-loss controller to have looked at node at
// resourceVersion rv or a later one, and requires its answer: not lost,
// nothing to look at again for.
func waitLooked(t *testing.T, node, rv string) {
	t.Helper()
	want, err := strconv.ParseUint(rv, 10, 64)
	require.NoError(t, err, "resourceVersion %q", rv)
	var line []string
	waitFor(t, node+" looked at, at resourceVersion "+rv+" or later", func() bool {
		for _, l := range strings.Split(prov.Output(), "\n") {
			m := looked.FindStringSubmatch(l)
			if m == nil || m[1] != node {
				continue
			}
			if got, err := strconv.ParseUint(m[2], 10, 64); err == nil && got >= want {
				line = m
				return true
			}
		}
		return false
	})
	assert.Equal(t, "false", line[3], "lost: %s", line[0])
	assert.Equal(t, "0s", line[4], "looked at again in: %s", line[0])
}

// waitLog waits for a line of the provisioner's output that contains s.
func waitLog(t *testing.T, s string) {
	t.Helper()
	waitFor(t, "the provisioner logs "+s, func() bool { return strings.Contains(prov.Output(), s) })
}
