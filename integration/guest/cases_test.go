//go:build guest

package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lvm-agent/lvm-agent/agent"
	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// A case runs against any stack that has what it needs.
type need int

const (
	needThin    need = 1 << iota // thin volumes (topolvm's lvmd only)
	needLVMDCtl                  // the suite can kill and restart the daemon
	needNothing need = 0
)

type testCase struct {
	name  string
	needs need
	run   func(t *testing.T, s *stack)
}

// cases is the one table both dialects run.
var cases = []testCase{
	{"create-delete-thick", needNothing, caseCreateDelete(false)},
	{"create-delete-thin", needThin, caseCreateDelete(true)},
	{"volume-status", needNothing, caseVolumeStatus},
	{"re-request", needNothing, caseReRequest},
	{"vg-full", needNothing, caseVGFull},
	{"unknown-vg", needNothing, caseUnknownVG},
	{"name-conflict", needNothing, caseNameConflict},
	{"protected", needNothing, caseProtected},
	{"not-plain-origin", needNothing, caseNotPlainOrigin},
	{"not-plain-pool", needThin, caseNotPlainPool},
	{"pool-not-zeroing", needThin, casePoolNotZeroing},
	{"lvm-refuses", needNothing, caseLVMRefuses},
	{"agent-killed-during-lvcreate", needNothing, caseAgentKilled},
	{"lvmd-restart-during-burst", needLVMDCtl, caseLVMDRestartBurst},
}

func (s *stack) has(n need) bool {
	return (n&needThin == 0 || s.thin != nil) && (n&needLVMDCtl == 0 || s.lvmdCtl != nil)
}

// The two dialects run side by side: they share nothing but the API server
// (their own node, VG, daemon and agent), and most of a case's time is spent
// waiting on lvm, which overlaps well. Within a dialect the cases run one
// after the other: several compare a VG's whole LV list before and after.
func runCases(t *testing.T, s *stack) {
	t.Parallel()
	s.startAgent(t, true)
	for _, c := range cases {
		if !s.has(c.needs) {
			continue // not a skip: the dialect has no such feature
		}
		t.Run(c.name, func(t *testing.T) { c.run(t, s) })
	}
}

func TestTopolvm(t *testing.T) { runCases(t, newTopolvmStack(t)) }

func TestGoogleLVMD(t *testing.T) { runCases(t, newGoogleStack(t)) }

// Sizes that are not extent multiples: the agent rounds to 4096, LVM to 4 MiB
// extents. Thick volumes get two, thin ones the third: each create and
// delete costs several lvm runs, a second or more each under TCG.
var (
	thickSizes = []int64{1, 10_000_001}
	thinSizes  = []int64{4<<20 + 1}
)

func caseCreateDelete(thin bool) func(*testing.T, *stack) {
	return func(t *testing.T, s *stack) {
		vg, kind, sizes := s.thick, "thick", thickSizes
		if thin {
			vg, kind, sizes = *s.thin, "thin", thinSizes
		}
		// The sizes at once, as a provisioner's requests come: the agent
		// works on them in parallel.
		for i, size := range sizes {
			t.Run(fmt.Sprintf("size-%d", size), func(t *testing.T) {
				t.Parallel()
				name := s.lvName(kind, fmt.Sprint(i))
				removeLeftover(t, vg.vg, name)
				pvc := s.pvc(t, name)
				tags := []string{"it.case=" + kind}
				require.NoError(t, s.create(pvc, vg, name, size, tags...))
				requireAnswered(t, pvc, kube.StateCreated)
				requireLV(t, vg, name, pvc, size, tags...)

				pv := s.pv(t, name, pvc)
				harness.DeleteClaim(t, env.cp.Client, pvc) // released: the claim is gone before the delete
				require.NoError(t, s.delete(pv, vg, name))
				requireAnswered(t, pv, kube.StateDeleted)
				requireNoLV(t, vg.vg, name)
			})
		}
	}
}

// A provisioner that writes its request again gets the same answer, and no
// second LV: not for a create, not for a delete.
func caseReRequest(t *testing.T, s *stack) {
	vg, name := s.thick, s.lvName("again")
	removeLeftover(t, vg.vg, name)
	pvc := s.pvc(t, name)
	require.NoError(t, s.create(pvc, vg, name, 8<<20))
	first := requireLV(t, vg, name, pvc, 8<<20)
	before := lvsOf(t, vg.vg)

	require.NoError(t, s.create(pvc, vg, name, 8<<20), "create written again")
	requireAnswered(t, pvc, kube.StateCreated)
	again := requireLV(t, vg, name, pvc, 8<<20)
	assert.Equal(t, first.UUID, again.UUID, "the LV was made again")
	assert.Equal(t, keys(before), keys(lvsOf(t, vg.vg)), "LVs changed")

	pv := s.pv(t, name, pvc)
	harness.DeleteClaim(t, env.cp.Client, pvc) // released: the claim is gone before the delete
	require.NoError(t, s.delete(pv, vg, name))
	requireNoLV(t, vg.vg, name)
	require.NoError(t, s.delete(pv, vg, name), "delete written again")
	requireAnswered(t, pv, kube.StateDeleted)
	requireNoLV(t, vg.vg, name)
}

// A request larger than the free space fails with InsufficientCapacity and
// leaves nothing behind.
func caseVGFull(t *testing.T, s *stack) {
	try := func(t *testing.T, vg volumeGroup, name string, size int64) {
		removeLeftover(t, vg.vg, name)
		_, freeBefore := vgInfo(t, vg.vg)
		pvc := s.pvc(t, name)
		err := s.create(pvc, vg, name, size)
		requireFailed(t, err, kube.ErrInsufficientCapacity, pvc)
		requireNoLV(t, vg.vg, name)
		// Nothing allocated: no partial LV under another name either.
		_, freeAfter := vgInfo(t, vg.vg)
		assert.Equal(t, freeBefore, freeAfter, "free space of %s changed", vg.vg)
	}
	t.Run("thick", func(t *testing.T) {
		extent, free := vgInfo(t, s.thick.vg)
		// One extent more than there is: the smallest request that cannot fit.
		try(t, s.thick, s.lvName("full"), free+extent)
	})
	if s.thin != nil {
		t.Run("thin", func(t *testing.T) {
			// Far beyond the pool with its overprovisioning (5x 1 GiB).
			try(t, *s.thin, s.lvName("full-thin"), 64<<30)
		})
	}
}

func caseUnknownVG(t *testing.T, s *stack) {
	name := s.lvName("novg")
	pvc := s.pvc(t, name)
	err := s.create(pvc, volumeGroup{spec: "it-no-such-vg"}, name, 4<<20)
	requireFailed(t, err, kube.ErrUnknownVolumeGroup, pvc)
}

// An LV the agent did not make is never adopted and never removed.
func caseNameConflict(t *testing.T, s *stack) {
	vg, name := s.thick, s.lvName("foreign")
	removeLeftover(t, vg.vg, name)
	_, err := lvm("lvcreate", "-y", "-n", name, "-L", "4m", "--addtag", "someone-else", vg.vg)
	require.NoError(t, err)
	foreign := lvsOf(t, vg.vg)[name]

	pvc := s.pvc(t, name)
	err = s.create(pvc, vg, name, 4<<20)
	requireFailed(t, err, kube.ErrNameConflict, pvc)
	assert.Equal(t, foreign, lvsOf(t, vg.vg)[name], "the foreign LV changed")

	pv := s.pv(t, name, pvc)
	harness.DeleteClaim(t, env.cp.Client, pvc) // released: the claim is gone before the delete
	err = s.delete(pv, vg, name)
	requireFailed(t, err, kube.ErrNameConflict, pv)
	assert.Equal(t, foreign, lvsOf(t, vg.vg)[name], "the foreign LV changed")

	// Tagged for another claim: a PV bound to this claim cannot remove it.
	_, err = lvm("lvchange", "--addtag", agent.OwnerTag(types.UID("0000-another-claim")), vg.vg+"/"+name)
	require.NoError(t, err)
	other := lvsOf(t, vg.vg)[name]
	pv2 := s.pv(t, name+"-2", pvc)
	err = s.delete(pv2, vg, name)
	requireFailed(t, err, kube.ErrNameConflict, pv2)
	assert.Equal(t, other, lvsOf(t, vg.vg)[name], "the other claim's LV changed")
}

// Issue 14, item 5: what lvm refuses for good ends "failed", never stays
// "creating": a name part lvm2 reserves (the agent's validator knows lvm2's
// list; the backend also reads real lvm's refusal of one, through lvmd, as
// a permanent error), an lvcreate option class lvmd does not have, and a
// thick name held by a thin LV of the same VG.
func caseLVMRefuses(t *testing.T, s *stack) {
	vg := s.thick
	t.Run("reserved-name", func(t *testing.T) {
		name := s.lvName("x_cvol")
		pvc := s.pvc(t, "reserved-cvol")
		err := s.create(pvc, vg, name, 4<<20)
		requireFailed(t, err, kube.ErrInvalidSpec, pvc)
		requireNoLV(t, vg.vg, name)
	})
	if s.thin == nil {
		return // the rest asks topolvm's lvmd directly
	}
	b, err := lvmbackend.NewTopolvm(env.socket)
	require.NoError(t, err)
	defer func() { _ = b.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	t.Run("lvm-says-reserved", func(t *testing.T) {
		for _, part := range []string{"_cvol", "_wcorig", "_imeta"} {
			name := s.lvName("y" + part)
			_, err := b.CreateVolume(ctx, lvmbackend.CreateRequest{DeviceClass: "thick", Name: name, SizeBytes: 4 << 20})
			require.ErrorIs(t, err, lvmbackend.ErrInvalidArgument, "real lvm's refusal of %s", part)
			t.Logf("lvmd: %v", err)
			requireNoLV(t, vg.vg, name)
		}
	})
	t.Run("unknown-option-class", func(t *testing.T) {
		name := s.lvName("optclass")
		_, err := b.CreateVolume(ctx, lvmbackend.CreateRequest{DeviceClass: "thick", Name: name, SizeBytes: 4 << 20, OptionClass: "it-no-such-class"})
		require.ErrorIs(t, err, lvmbackend.ErrInvalidArgument)
		t.Logf("lvmd: %v", err)
		requireNoLV(t, vg.vg, name)
	})
	t.Run("thick-name-held-by-thin", func(t *testing.T) {
		name := s.lvName("thin-held")
		removeLeftover(t, vg.vg, name)
		thin := s.pvc(t, "thin-held")
		require.NoError(t, s.create(thin, *s.thin, name, 4<<20))
		held := lvsOf(t, vg.vg)[name]
		pvc := s.pvc(t, "thick-wants")
		err := s.create(pvc, vg, name, 4<<20)
		requireFailed(t, err, kube.ErrNameConflict, pvc)
		assert.Equal(t, held, lvsOf(t, vg.vg)[name], "the thin LV changed")
		pv := s.pv(t, "thin-held", thin)
		harness.DeleteClaim(t, env.cp.Client, thin)
		require.NoError(t, s.delete(pv, *s.thin, name))
		requireNoLV(t, vg.vg, name)
	})
}

// An LV tagged "protected" survives a delete; without the tag, a new delete
// request removes it.
func caseProtected(t *testing.T, s *stack) {
	vg, name := s.thick, s.lvName("protected")
	removeLeftover(t, vg.vg, name)
	pvc := s.pvc(t, name)
	require.NoError(t, s.create(pvc, vg, name, 4<<20))
	_, err := lvm("lvchange", "--addtag", agent.ProtectedTag, vg.vg+"/"+name)
	require.NoError(t, err)
	before := lvsOf(t, vg.vg)[name]

	pv := s.pv(t, name, pvc)
	harness.DeleteClaim(t, env.cp.Client, pvc) // released: the claim is gone before the delete
	err = s.delete(pv, vg, name)
	requireFailed(t, err, kube.ErrProtected, pv)
	assert.Equal(t, before, lvsOf(t, vg.vg)[name], "the protected LV changed")

	_, err = lvm("lvchange", "--deltag", agent.ProtectedTag, vg.vg+"/"+name)
	require.NoError(t, err)
	require.NoError(t, s.delete(pv, vg, name), "delete written again once unprotected")
	requireAnswered(t, pv, kube.StateDeleted)
	requireNoLV(t, vg.vg, name)
}

// Issue 14, item 7, against real lvm: lvmd removes with lvremove -f, which
// would take an origin's snapshot (or a pool's thin LVs) along, so a PV
// naming an origin of ours is answered NotPlainVolume and nothing is
// removed.
func caseNotPlainOrigin(t *testing.T, s *stack) {
	vg, name := s.thick, s.lvName("origin")
	snap := name + "-snap"
	pvc := s.pvc(t, name)
	require.NoError(t, s.create(pvc, vg, name, 4<<20))
	removeAll(t, vg.vg, snap, name)
	_, err := lvm("lvcreate", "-y", "-s", "-n", snap, "-L", "4m", vg.vg+"/"+name)
	require.NoError(t, err)
	requireNotPlain(t, s, pvc, name, vg, name, snap)
}

// A PV naming a thin pool (tagged as ours, so that no tag check stops it
// first): topolvm's lvmd lists no thin pool in any device class (nor does
// the agent's metadata reader, which answers as lvmd would), so the pool is
// no LV of class thick: the delete is answered "deleted", as for an absent
// LV, and the pool and its thin LV stay, untouched. (google/lvmd would
// show the pool; there the delete path's plain check, NotPlainVolume,
// refuses it, as the unit tests pin.)
func caseNotPlainPool(t *testing.T, s *stack) {
	vg, pool := s.thick, s.lvName("pool")
	thin := pool + "-thin"
	pvc := s.pvc(t, pool)
	removeAll(t, vg.vg, thin, pool)
	_, err := lvm("lvcreate", "-y", "-T", "-L", "8m", "-n", pool, "--addtag", agent.OwnerTag(pvc.UID), vg.vg)
	require.NoError(t, err)
	_, err = lvm("lvcreate", "-y", "-V", "4m", "-T", vg.vg+"/"+pool, "-n", thin)
	require.NoError(t, err)
	before := lvsOf(t, vg.vg)
	require.Contains(t, before, pool)
	require.Contains(t, before, thin)
	pv := s.pv(t, pool, pvc)
	harness.DeleteClaim(t, env.cp.Client, pvc)
	require.NoError(t, s.delete(pv, vg, pool))
	requireAnswered(t, pv, kube.StateDeleted)
	after := lvsOf(t, vg.vg)
	assert.Equal(t, before[pool], after[pool], "the pool changed")
	assert.Equal(t, before[thin], after[thin], "the pool's thin LV changed")
}

// requireNotPlain binds a PV to pvc, deletes the claim (a cluster's order),
// asks for the deletion of lv and checks the NotPlainVolume answer, with
// the LVs kept unchanged.
// Issue 64: a thin volume in a pool that does not zero new chunks could
// read a deleted volume's bytes: the agent removes the LV it made and
// answers PoolNotZeroing, unless the spec's tags carry lvm-agent.nowipe (a
// class with wipe: none). The suite's pool zeroes (lvcreate's default); it
// is turned off for the case and on again after. (The guest's agents run
// as root: they read device-mapper, and so the pool's table.)
func casePoolNotZeroing(t *testing.T, s *stack) {
	vg := *s.thin
	pool := vg.vg + "/" + vg.pool
	// The kernel's table is what zeroes, and what the agent reads: the
	// new flag is loaded into the active pool with --refresh.
	_, err := lvm("lvchange", "-Z", "n", pool)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := lvm("lvchange", "-Z", "y", pool)
		assert.NoError(t, err)
		_, err = lvm("lvchange", "--refresh", pool)
		assert.NoError(t, err)
	})
	_, err = lvm("lvchange", "--refresh", pool)
	require.NoError(t, err)
	table, err := exec.Command("dmsetup", "table").Output()
	require.NoError(t, err)
	require.Contains(t, string(table), "skip_block_zeroing", "no pool's table says it after lvchange -Z n --refresh:\n%s", table)
	name := s.lvName("nozero")
	removeLeftover(t, vg.vg, name)
	pvc := s.pvc(t, name)
	err = s.create(pvc, vg, name, 4<<20)
	var fe *kube.FailedError
	require.True(t, errors.As(err, &fe), "not an agent's failed answer: %v", err)
	assert.Equal(t, kube.ReasonPoolNotZeroing, fe.Reason, fe.Message)
	assert.Contains(t, fe.Message, "does not zero new chunks")
	requireNoLV(t, vg.vg, name)

	name = s.lvName("nozero-ok")
	removeLeftover(t, vg.vg, name)
	pvc = s.pvc(t, name)
	require.NoError(t, s.create(pvc, vg, name, 4<<20, kube.NoWipeTag))
	requireAnswered(t, pvc, kube.StateCreated)
	requireLV(t, vg, name, pvc, 4<<20, kube.NoWipeTag)
}

func requireNotPlain(t *testing.T, s *stack, pvc *corev1.PersistentVolumeClaim, pvName string, vg volumeGroup, lv string, kept ...string) {
	t.Helper()
	before := lvsOf(t, vg.vg)
	for _, n := range kept {
		require.Contains(t, before, n)
	}
	pv := s.pv(t, pvName, pvc)
	harness.DeleteClaim(t, env.cp.Client, pvc)
	err := s.delete(pv, vg, lv)
	requireFailed(t, err, kube.ErrNotPlainVolume, pv)
	after := lvsOf(t, vg.vg)
	for _, n := range kept {
		assert.Equal(t, before[n], after[n], "LV %s changed", n)
	}
}

// removeAll removes the named LVs, in order, when the test ends.
func removeAll(t *testing.T, vg string, names ...string) {
	t.Cleanup(func() {
		for _, n := range names {
			if _, ok := lvsOf(t, vg)[n]; !ok {
				continue
			}
			if _, err := lvm("lvremove", "-y", vg+"/"+n); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
}

// The agent dies (SIGKILL) while lvmd runs lvcreate for it; restarted, it
// answers the request, which the provisioner is still watching, with exactly
// one LV and no orphan.
func caseAgentKilled(t *testing.T, s *stack) {
	vg, name := s.thick, s.lvName("crash")
	removeLeftover(t, vg.vg, name)
	pvc := s.pvc(t, name)
	before := keys(lvsOf(t, vg.vg))

	ctx, cancel := context.WithTimeout(context.Background(), 2*requestTimeout)
	defer cancel()
	answer := make(chan error, 1)
	go func() { answer <- s.createCtx(ctx, pvc, vg, name, 12<<20) }()

	findCtx, cancelFind := context.WithTimeout(ctx, requestTimeout)
	pid, err := findProcess(findCtx, isLVCreateOf(name))
	cancelFind()
	require.NoError(t, err, "never saw lvcreate of %s", name)
	s.agent.Kill()
	running := alive(pid)
	t.Logf("agent SIGKILLed while lvcreate (pid %d) ran; lvcreate still running right after: %v", pid, running)
	for i := 0; i < 600 && alive(pid); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	if got, ok := lvsOf(t, vg.vg)[name]; ok {
		t.Logf("after the kill, LVM has %s: attr %s tags %v", name, got.Attr, got.Tags)
	} else {
		t.Logf("after the kill, LVM has no %s (the interrupted lvcreate left nothing)", name)
	}

	s.startAgent(t, false)
	require.NoError(t, <-answer)
	requireAnswered(t, pvc, kube.StateCreated)
	requireLV(t, vg, name, pvc, 12<<20)
	assert.Equal(t, sortedAppend(before, name), keys(lvsOf(t, vg.vg)), "exactly one new LV, no orphan")

	pv := s.pv(t, name, pvc)
	harness.DeleteClaim(t, env.cp.Client, pvc) // released: the claim is gone before the delete
	require.NoError(t, s.delete(pv, vg, name))
	requireNoLV(t, vg.vg, name)
}

// lvmd is killed (SIGKILL, as a crash) and restarted while 20 creates are in
// flight: every one reaches "created", with exactly its LV.
func caseLVMDRestartBurst(t *testing.T, s *stack) {
	const n = 20
	vg, prefix := s.thick, s.lvName("burst")+"-"
	t.Cleanup(func() { _, _ = lvm("lvremove", "-y", "-S", "lv_name=~^"+prefix, vg.vg) })
	before := keys(lvsOf(t, vg.vg))
	pvcs := make([]*corev1.PersistentVolumeClaim, n)
	for i := range pvcs {
		pvcs[i] = s.pvc(t, fmt.Sprintf("%s%02d", prefix, i))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, pvc := range pvcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.createCtx(ctx, pvc, vg, pvc.Name, 4<<20)
		}()
	}

	// Kill lvmd once a few LVs exist: the rest are queued or in flight.
	deadline := time.Now().Add(requestTimeout)
	for len(names(t, vg.vg, prefix)) < 3 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	made := len(names(t, vg.vg, prefix))
	require.NoError(t, s.lvmdCtl("kill"))
	t.Logf("lvmd killed with %d of %d LVs made", made, n)
	time.Sleep(3 * time.Second)
	require.NoError(t, s.lvmdCtl("start"))
	t.Logf("lvmd restarted with %d of %d LVs made", len(names(t, vg.vg, prefix)), n)

	wg.Wait()
	for i, err := range errs {
		assert.NoError(t, err, "create %d", i)
	}
	var want []string
	lvs := lvsOf(t, vg.vg)
	for _, pvc := range pvcs {
		want = append(want, pvc.Name)
		if got, ok := lvs[pvc.Name]; assert.True(t, ok, "no LV %s", pvc.Name) {
			assert.Equal(t, []string{agent.OwnerTag(pvc.UID)}, got.Tags, "tags of %s", pvc.Name)
			assert.True(t, got.active(), "%s inactive (%s)", pvc.Name, got.Attr)
		}
	}
	assert.Equal(t, want, names(t, vg.vg, prefix), "exactly one LV per request")
	assert.Equal(t, len(before)+n, len(lvs), "no orphan LV")
}

func keys(m map[string]lv) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func sortedAppend(s []string, v ...string) []string {
	out := append(slices.Clone(s), v...)
	slices.Sort(out)
	return out
}

// "lvm-agent volume status" on the node shows each LV's device as
// device-mapper has it: active, and for a thin LV the pool space it maps;
// the thin pool's fill agrees with lvs.
func caseVolumeStatus(t *testing.T, s *stack) {
	vgs := []volumeGroup{s.thick}
	if s.thin != nil {
		vgs = append(vgs, *s.thin)
	}
	rows := map[string]volumeGroup{}
	for i, vg := range vgs {
		name := s.lvName("status", fmt.Sprint(i))
		removeLeftover(t, vg.vg, name)
		pvc := s.pvc(t, name)
		require.NoError(t, s.create(pvc, vg, name, 8<<20))
		rows["pvc/"+pvc.Namespace+"/"+pvc.Name] = vg
		t.Cleanup(func() {
			pv := s.pv(t, name, pvc)
			harness.DeleteClaim(t, env.cp.Client, pvc) // released: the claim is gone before the delete
			assert.NoError(t, s.delete(pv, vg, name))
		})
		if vg.pool != "" {
			writeLV(t, "/dev/"+vg.vg+"/"+name, 4<<20)
		}
	}

	args := append([]string{"volume", "status", "--kubeconfig", env.cp.Kubeconfig, "--node", s.node,
		"--device-classes", s.classes, "-o", "wide"}, s.args...)
	cmd := exec.Command(env.agentBin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	t.Logf("lvm-agent %s:\n%s%s", strings.Join(args, " "), out, stderr.String())
	// Earlier cases delete LVs through a PV while their PVC stays (a real
	// provisioner deletes the PVC first): status rightly calls those
	// MISSING-LV and exits 6. Anything else is a failure.
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 6 {
		require.NoError(t, err)
	}
	assert.NotContains(t, string(out), "DEVICE-INACTIVE")
	lines := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			lines[f[0]] = l
		}
	}
	for row, vg := range rows {
		line := lines[row]
		require.NotEmpty(t, line, "no row %s", row)
		assert.Contains(t, line, " ok", row)
		if vg.pool == "" {
			assert.Regexp(t, ` active +ok`, line, row)
			continue
		}
		assert.Contains(t, line, " active, 4Mi mapped in "+vg.vg+"/"+vg.pool+" ", row)
		pool := regexp.MustCompile(`(?m)^thin pool ` + vg.vg + `/` + vg.pool + ` .*\(([0-9.]+)%\), metadata .* mode rw$`).FindStringSubmatch(string(out))
		require.NotNil(t, pool, "no healthy line for the pool %s/%s", vg.vg, vg.pool)
		lvs, err := lvm("lvs", "--noheadings", "-o", "data_percent", vg.vg+"/"+vg.pool)
		require.NoError(t, err)
		ours, _ := strconv.ParseFloat(pool[1], 64)
		theirs, err := strconv.ParseFloat(strings.TrimSpace(string(lvs)), 64)
		require.NoError(t, err, "lvs data_percent %q", lvs)
		assert.InDelta(t, theirs, ours, 0.011, "data used: lvs says %v%%, status %v%%", theirs, ours)

		// The agent's metrics, read from device-mapper at the scrape.
		m, err := harness.ReadMetrics(s.metrics)
		require.NoError(t, err)
		series := `lvm_agent_thin_pool_data_used_ratio{device="` + vg.vg + "-" + vg.pool + `-tpool"}`
		require.Contains(t, m, series)
		assert.InDelta(t, theirs/100, m[series], 0.00011, series)
		assert.Equal(t, 1.0, m[`lvm_agent_dm_device_state{device="`+vg.vg+"-"+vg.pool+`-tpool",state="active"}`])
		assert.Equal(t, 0.0, m["lvm_agent_dm_read_failed"])
	}
	for row, vg := range rows {
		name := strings.ReplaceAll(strings.TrimPrefix(row, "pvc/"+s.ns()+"/"), "-", "--")
		m, err := harness.ReadMetrics(s.metrics)
		require.NoError(t, err)
		assert.Equal(t, 1.0, m[`lvm_agent_dm_device_state{device="`+vg.vg+"-"+name+`",state="active"}`], row)
	}
	assert.Contains(t, string(out), " 0 orphan LVs, 0 stuck requests, 0 unhealthy thin pools, 0 other problems")
}

// writeLV writes n bytes at the start of a block device and syncs them.
func writeLV(t *testing.T, dev string, n int) {
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.Write(bytes.Repeat([]byte{0x5a}, n))
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())
}
