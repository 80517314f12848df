package agent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

// startWiper runs an agent that wipes, with LV devices as regular files
// under a directory of the test's (lvmd's /dev/vg0/<lv>) and open counts
// from oc.
func startWiper(t *testing.T, oc openCounter) (*env, string) {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "dev", "vg0"), 0o700))
	return start(t, Config{openCounts: oc, deviceRoot: root, Wiper: NewWiper(0), BackoffBase: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}), root
}

// deadLV is the thick LV lv1 of a deleted claim, its device full of a
// previous tenant's bytes, and its PV asked to be deleted.
func deadLV(t *testing.T, e *env, root string, size int, tags ...string) string {
	t.Helper()
	const claim = types.UID("gone-uid")
	require.NoError(t, e.lvm.Add(lvmdfake.LV{Class: "thick", Name: "lv1", SizeBytes: uint64(size), Tags: append([]string{OwnerTag(claim)}, tags...)}))
	dev := filepath.Join(root, "dev", "vg0", "lv1")
	require.NoError(t, os.WriteFile(dev, bytes.Repeat([]byte("tenant A's data "), size/16), 0o600))
	e.pv(t, "pv1", node, claim, map[string]string{kube.AnnLifecycle: kube.StateDeleting, kube.AnnSpec: "thick/lv1"})
	return dev
}

// A thick LV is zeroed, every byte, before lvmd removes it; the PV is
// answered deleted only then.
func TestDeleteZeroesThickVolume(t *testing.T) {
	e, root := startWiper(t, &counts{n: []int32{0}})
	size := 3*wipeChunk + 8<<20 // a chunk that is not whole
	dev := deadLV(t, e, root, size)
	ann := e.waitPV(t, "pv1")
	require.Equal(t, kube.StateDeleted, ann[kube.AnnLifecycle], ann[kube.AnnError])
	got, err := os.ReadFile(dev)
	require.NoError(t, err)
	require.Len(t, got, size)
	assert.Zero(t, bytes.Count(got, []byte("tenant A")), "no byte of the deleted volume left")
	assert.True(t, bytes.Equal(got, make([]byte, size)), "every byte zero")
	lvs, err := e.lvm.List("thick")
	require.NoError(t, err)
	assert.Empty(t, lvs, "removed after the wipe")
	assert.EqualValues(t, size, testutil.ToFloat64(e.metrics.wiped))
	assert.Zero(t, testutil.ToFloat64(e.metrics.wipeWaiting))
}

// A class with wipe: none tags its LVs: removed as they are.
func TestDeleteNoWipeTag(t *testing.T) {
	e, root := startWiper(t, &counts{n: []int32{0}})
	dev := deadLV(t, e, root, 8<<20, kube.NoWipeTag)
	ann := e.waitPV(t, "pv1")
	require.Equal(t, kube.StateDeleted, ann[kube.AnnLifecycle], ann[kube.AnnError])
	got, err := os.ReadFile(dev)
	require.NoError(t, err)
	assert.Equal(t, 8<<20/16, bytes.Count(got, []byte("tenant A's data ")), "not zeroed")
	assert.Zero(t, testutil.ToFloat64(e.metrics.wiped))
}

// An LV still open (a Pod's kubelet has not let go of it) is neither
// zeroed nor removed: the delete waits, with the reason on the PV, and
// goes on once it is let go.
func TestDeleteWaitsWhileTheVolumeIsOpen(t *testing.T) {
	oc := &counts{n: []int32{1}}
	e, root := startWiper(t, oc)
	dev := deadLV(t, e, root, 8<<20)
	require.Eventually(t, func() bool {
		pv, err := e.client.CoreV1().PersistentVolumes().Get(context.Background(), "pv1", metav1.GetOptions{})
		require.NoError(t, err)
		return bytes.Contains([]byte(pv.Annotations[kube.AnnError]), []byte("has 1 openers"))
	}, 10*time.Second, 5*time.Millisecond)
	pv, err := e.client.CoreV1().PersistentVolumes().Get(context.Background(), "pv1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, kube.StateDeleting, pv.Annotations[kube.AnnLifecycle])
	lvs, err := e.lvm.List("thick")
	require.NoError(t, err)
	assert.Len(t, lvs, 1, "the LV stays while it is open")
	got, err := os.ReadFile(dev)
	require.NoError(t, err)
	assert.Equal(t, 8<<20/16, bytes.Count(got, []byte("tenant A's data ")), "not written while open")

	oc.set(0)
	ann := e.waitPV(t, "pv1")
	require.Equal(t, kube.StateDeleted, ann[kube.AnnLifecycle], ann[kube.AnnError])
	got, err = os.ReadFile(dev)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(got, make([]byte, 8<<20)))
}

// A thick clone larger than its source: the source's bytes, then zeros
// where its new extents held another volume's bytes.
func TestThickCloneTailZeroed(t *testing.T) {
	e, root := startWiper(t, &counts{n: []int32{0, 0, 1}})
	size := 2 * copyChunk
	data := thickSource(t, e, root, size) // the clone's device: 2 × size of 0xee
	e.pvc(t, "default", "pvc", node, cloneSpec("thick", "src", kube.CloneCopy, int64(2*size)))
	ann := e.waitPVC(t, "default", "pvc")
	require.Equal(t, kube.StateCreated, ann[kube.AnnLifecycle], ann[kube.AnnError])
	got, err := os.ReadFile(filepath.Join(root, "dev", "vg0", "clone"))
	require.NoError(t, err)
	require.Len(t, got, 2*size)
	assert.True(t, bytes.Equal(data, got[:size]), "the source's bytes")
	assert.True(t, bytes.Equal(make([]byte, size), got[size:]), "zeros beyond the source's size")
}

// The read-back finds a block the wipe missed, in the last block too.
func TestCheckZero(t *testing.T) {
	dev := filepath.Join(t.TempDir(), "dev")
	b := make([]byte, 1<<20)
	require.NoError(t, os.WriteFile(dev, b, 0o600))
	require.NoError(t, checkZero(context.Background(), dev, 0, int64(len(b))))
	b[len(b)-1] = 1
	require.NoError(t, os.WriteFile(dev, b, 0o600))
	assert.ErrorContains(t, checkZero(context.Background(), dev, 0, int64(len(b))), "reads byte 0x1 at offset 1048575 after the wipe")
	assert.NoError(t, checkZero(context.Background(), dev, 0, int64(len(b))-4096), "outside the range")
}

// --wipe-rate: a token bucket over every wipe, at least one chunk deep.
func TestWiperRate(t *testing.T) {
	assert.Nil(t, NewWiper(0).limit, "0: no bound")
	w := NewWiper(128 << 20)
	assert.EqualValues(t, 128<<20, w.limit.Limit())
	assert.Equal(t, 128<<20, w.limit.Burst())
	assert.Equal(t, wipeChunk, NewWiper(1<<20).limit.Burst(), "a chunk fits the bucket")
}
