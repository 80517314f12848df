package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

// snapshots counts lvmd's CreateLVSnapshot calls.
func snapshots(m *lvmdfake.LVM) *atomic.Int32 {
	var n atomic.Int32
	m.SetHook(func(op, _, _ string) error {
		if op == "snapshot" {
			n.Add(1)
		}
		return nil
	})
	return &n
}

func cloneSpec(class, source, kind string, size int64) map[string]string {
	s, _ := json.Marshal(kube.CreateSpec{VolumeGroup: class, Name: "clone", Size: size, Source: &kube.CloneSource{Name: source, Kind: kind}})
	return spec(string(s))
}

// A thin clone is one CreateLVSnapshot of the source: a thin LV of the
// clone's size with the clone's ownership tag only, its device answered.
func TestThinClone(t *testing.T) {
	e := start(t, Config{})
	n := snapshots(e.lvm)
	require.NoError(t, e.lvm.Add(lvmdfake.LV{Class: "thin", Name: "src", SizeBytes: 8 * mib, Thin: true, Tags: []string{OwnerTag("src-uid")}}))
	pvc := e.pvc(t, "default", "pvc", node, cloneSpec("thin", "src", kube.CloneSnapshot, 16*mib))
	ann := e.waitPVC(t, "default", "pvc")
	require.Equal(t, kube.StateCreated, ann[kube.AnnLifecycle], ann[kube.AnnError])
	assert.Equal(t, "/dev/vg0/clone", ann[kube.AnnDevice])
	assert.EqualValues(t, 1, n.Load(), "one snapshot call")
	lvs, err := e.lvm.List("thin")
	require.NoError(t, err)
	require.Len(t, lvs, 2)
	clone := lvs[0]
	assert.Equal(t, "clone", clone.Name)
	assert.True(t, clone.Thin)
	assert.Equal(t, []string{OwnerTag(pvc.UID)}, clone.Tags)
	assert.EqualValues(t, 16*mib, clone.SizeBytes)
}

func TestCloneRefused(t *testing.T) {
	for _, c := range []struct {
		name, class, source, kind string
		srcTags                   []string
		reason, says              string
	}{
		{"source missing", "thin", "nope", kube.CloneSnapshot, nil, kube.ReasonVolumeNotFound, "source LV thin/nope does not exist"},
		{"source not ours", "thin", "src", kube.CloneSnapshot, []string{"someone"}, kube.ReasonNameConflict, "was not made by lvm-agent for a claim"},
		{"snapshot in a thick class", "thick", "src", kube.CloneSnapshot, []string{OwnerTag("src-uid")}, kube.ReasonCloneNotSupported, "Thick snapshots are not implemented"},
		{"copy without device-mapper", "thick", "src", kube.CloneCopy, []string{OwnerTag("src-uid")}, kube.ReasonCloneNotSupported, "this agent makes no thick copy: it cannot read device-mapper"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := start(t, Config{})
			require.NoError(t, e.lvm.Add(lvmdfake.LV{Class: c.class, Name: "src", SizeBytes: 8 * mib, Thin: c.class == "thin", Tags: c.srcTags}))
			e.pvc(t, "default", "pvc", node, cloneSpec(c.class, c.source, c.kind, 8*mib))
			ann := e.waitPVC(t, "default", "pvc")
			assert.Equal(t, kube.StateFailed, ann[kube.AnnLifecycle])
			assert.Equal(t, c.reason, ann[kube.AnnReason])
			assert.Contains(t, ann[kube.AnnError], c.says)
			lvs, err := e.lvm.List(c.class)
			require.NoError(t, err)
			assert.Len(t, lvs, 1, "no LV made")
		})
	}
}

// google/lvmd has no snapshot call: a thin clone asked of it is refused.
func TestThinCloneGoogleLVMD(t *testing.T) {
	m, e := startGoogle(t)
	require.NoError(t, m.Add(lvmdfake.LV{Class: "vg0", Name: "src", SizeBytes: 8 * mib, Tags: []string{OwnerTag("src-uid")}}))
	e.pvc(t, "default", "pvc", node, cloneSpec("vg0", "src", kube.CloneSnapshot, 8*mib))
	ann := e.waitPVC(t, "default", "pvc")
	assert.Equal(t, kube.StateFailed, ann[kube.AnnLifecycle])
	assert.Equal(t, kube.ReasonCloneNotSupported, ann[kube.AnnReason])
	assert.Contains(t, ann[kube.AnnError], "google/lvmd has no snapshot call")
}

// The capacity annotation says which clones each class makes.
func TestCloneKindPublished(t *testing.T) {
	assert.Equal(t, kube.CloneSnapshot, cloneKind(lvmbackend.Capacity{DeviceClass: "thin", Thin: true}, true))
	assert.Equal(t, kube.CloneCopy, cloneKind(lvmbackend.Capacity{DeviceClass: "thick"}, true))
	assert.Equal(t, "", cloneKind(lvmbackend.Capacity{DeviceClass: "thick"}, false), "no copies without device-mapper")
}

// startCopier runs an agent that copies, with devices as regular files
// under a directory of the test's (lvmd's /dev/vg0/<lv> paths) and open
// counts from oc.
func startCopier(t *testing.T, oc openCounter) (*env, string) {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "dev", "vg0"), 0o700))
	return start(t, Config{openCounts: oc, deviceRoot: root}), root
}

// thickSource is an LV of the claim src-uid with its device's bytes.
func thickSource(t *testing.T, e *env, root string, size int) []byte {
	t.Helper()
	require.NoError(t, e.lvm.Add(lvmdfake.LV{Class: "thick", Name: "src", SizeBytes: uint64(size), Tags: []string{OwnerTag("src-uid")}}))
	data := make([]byte, size)
	_, err := rand.Read(data)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(root, "dev", "vg0", "src"), data, 0o600))
	// The clone's device, as LVM would make it: lvcreate does not zero it.
	require.NoError(t, os.WriteFile(filepath.Join(root, "dev", "vg0", "clone"), bytes.Repeat([]byte{0xee}, 2*size), 0o600))
	return data
}

// A thick clone: a new LV through lvmd, the source's bytes copied into it
// and verified, progress at each 10 %, then created.
func TestThickClone(t *testing.T) {
	e, root := startCopier(t, &counts{n: []int32{0, 0, 1}})
	size := 10 * copyChunk // a chunk each 10 %
	data := thickSource(t, e, root, size)
	pvc := e.pvc(t, "default", "pvc", node, cloneSpec("thick", "src", kube.CloneCopy, int64(size+16*mib)))
	ann := e.waitPVC(t, "default", "pvc")
	require.Equal(t, kube.StateCreated, ann[kube.AnnLifecycle], ann[kube.AnnError])
	got, err := os.ReadFile(filepath.Join(root, "dev", "vg0", "clone"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got[:len(data)]), "the clone holds the source's bytes")
	lvs, err := e.lvm.List("thick")
	require.NoError(t, err)
	require.Len(t, lvs, 2)
	assert.Equal(t, []string{OwnerTag(pvc.UID)}, lvs[0].Tags)
	assert.EqualValues(t, size+16*mib, lvs[0].SizeBytes)
	var progress []string
	for len(e.events.Events) > 0 {
		if ev := <-e.events.Events; strings.Contains(ev, "CloneCopying") || strings.Contains(ev, "CloneCopied") {
			progress = append(progress, ev)
		}
	}
	require.Len(t, progress, 11, "an event at each 10 %% and one when verified: %v", progress)
	assert.Equal(t, fmt.Sprintf("Normal CloneCopying copied 10%% of LV src (%d of %d bytes)", copyChunk, size), progress[0])
	assert.Equal(t, fmt.Sprintf("Normal CloneCopied copied and verified the %d bytes of LV src", size), progress[10])
	assert.EqualValues(t, size, testutil.ToFloat64(e.metrics.copied))
}

// While the source is open the clone waits (SourceInUse), and is copied
// once it is free.
func TestThickCloneWaitsForItsSource(t *testing.T) {
	oc := &counts{n: []int32{1}}
	e, root := startCopier(t, oc)
	thickSource(t, e, root, 8*mib)
	e.pvc(t, "default", "pvc", node, cloneSpec("thick", "src", kube.CloneCopy, 8*mib))
	require.Eventually(t, func() bool {
		ev := <-e.events.Events
		return strings.HasPrefix(ev, "Warning SourceInUse the clone waits for its source to be free")
	}, 10*time.Second, time.Millisecond)
	pvc, err := e.client.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), "pvc", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, kube.StateCreating, pvc.Annotations[kube.AnnLifecycle], "no answer while the source is in use")
	oc.set(0, 0, 1)
	ann := e.waitPVC(t, "default", "pvc")
	assert.Equal(t, kube.StateCreated, ann[kube.AnnLifecycle], ann[kube.AnnError])
}

// A source held for a long while does not push the clone's next look out
// with the backoff: it is copied within WaitPoll of being free (here the
// backoff would reach an hour after two looks).
func TestThickCloneLooksAtItsSourceEveryWaitPoll(t *testing.T) {
	oc := &counts{n: []int32{1}}
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "dev", "vg0"), 0o700))
	e := start(t, Config{openCounts: oc, deviceRoot: root, BackoffBase: time.Hour, BackoffMax: time.Hour, WaitPoll: 50 * time.Millisecond})
	thickSource(t, e, root, 8*mib)
	e.pvc(t, "default", "pvc", node, cloneSpec("thick", "src", kube.CloneCopy, 8*mib))
	waits := 0
	require.Eventually(t, func() bool {
		if strings.HasPrefix(<-e.events.Events, "Warning SourceInUse") {
			waits++
		}
		return waits == 3
	}, 10*time.Second, time.Millisecond, "three looks at the source in use")
	oc.set(0, 0, 1)
	ann := e.waitPVC(t, "default", "pvc")
	assert.Equal(t, kube.StateCreated, ann[kube.AnnLifecycle], ann[kube.AnnError])
}

// An agent killed in the middle of a copy finds the clone's LV on its next
// attempt and copies again from the start before it answers.
func TestThickCloneCopiedAgainAfterACrash(t *testing.T) {
	e, root := startCopier(t, &counts{n: []int32{0, 0, 1}})
	data := thickSource(t, e, root, 8*mib)
	// What a killed agent left: the claim's LV made, its device partly
	// copied (or not at all: 0xee), no answer.
	require.NoError(t, e.lvm.Add(lvmdfake.LV{Class: "thick", Name: "clone", SizeBytes: 8 * mib, Tags: []string{OwnerTag("default-pvc-uid")}}))
	e.pvc(t, "default", "pvc", node, cloneSpec("thick", "src", kube.CloneCopy, 8*mib))
	ann := e.waitPVC(t, "default", "pvc")
	require.Equal(t, kube.StateCreated, ann[kube.AnnLifecycle], ann[kube.AnnError])
	got, err := os.ReadFile(filepath.Join(root, "dev", "vg0", "clone"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got[:len(data)]), "copied again, whole")
}
