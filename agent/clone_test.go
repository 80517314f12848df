package agent

import (
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
		{"copy not made yet", "thick", "src", kube.CloneCopy, []string{OwnerTag("src-uid")}, kube.ReasonCloneNotSupported, `a clone of kind "copy" is not made by this agent`},
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
	m := lvmdfake.NewLVM(lvmdfake.Class{Name: "vg0", SizeBytes: 1 << 30})
	srv := lvmdfake.NewGoogle(m)
	addr, err := srv.Serve("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	b, err := lvmbackend.NewGoogleLVMD(addr, nil, 10*time.Millisecond)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	e := startOn(t, Config{}, fakeLVMD{lvm: m}, b)
	require.NoError(t, m.Add(lvmdfake.LV{Class: "vg0", Name: "src", SizeBytes: 8 * mib, Tags: []string{OwnerTag("src-uid")}}))
	e.pvc(t, "default", "pvc", node, cloneSpec("vg0", "src", kube.CloneSnapshot, 8*mib))
	ann := e.waitPVC(t, "default", "pvc")
	assert.Equal(t, kube.StateFailed, ann[kube.AnnLifecycle])
	assert.Equal(t, kube.ReasonCloneNotSupported, ann[kube.AnnReason])
	assert.Contains(t, ann[kube.AnnError], "google/lvmd has no snapshot call")
}

// The capacity annotation says which clones each class makes.
func TestCloneKindPublished(t *testing.T) {
	assert.Equal(t, kube.CloneSnapshot, cloneKind(lvmbackend.Capacity{DeviceClass: "thin", Thin: true}))
	assert.Equal(t, "", cloneKind(lvmbackend.Capacity{DeviceClass: "thick"}))
}
