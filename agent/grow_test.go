package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

const mib = 1 << 20

// growSpec is a PV's grow request for lv1 of class to size bytes.
func growSpec(class string, size int64) map[string]string {
	return map[string]string{kube.AnnLifecycle: kube.StateExpanding,
		kube.AnnSpec: `{"volumeGroup":"` + class + `","name":"lv1","size":` + strconv.FormatInt(size, 10) + `}`}
}

// waitGrow waits until the PV's lifecycle leaves "expanding".
func (e *env) waitGrow(t *testing.T, name string) map[string]string {
	return e.wait(t, func(ctx context.Context) (metav1.Object, error) {
		return e.client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	}, kube.StateExpanding)
}

// resizes counts the ResizeLV calls that reach the fake lvmd.
func resizes(m *lvmdfake.LVM) *atomic.Int32 {
	var n atomic.Int32
	m.SetHook(func(op, _, _ string) error {
		if op == "resize" {
			n.Add(1)
		}
		return nil
	})
	return &n
}

func lvSize(t *testing.T, m *lvmdfake.LVM, class string) uint64 {
	t.Helper()
	lvs, err := m.List(class)
	require.NoError(t, err)
	for _, lv := range lvs {
		if lv.Name == "lv1" {
			return lv.SizeBytes
		}
	}
	t.Fatalf("no lv1 in %s", class)
	return 0
}

func TestGrow(t *testing.T) {
	const claim = types.UID("claim-uid")
	ours := []string{OwnerTag(claim)}
	cases := []struct {
		name      string
		class     string
		tags      []string
		size      int64 // the LV's size before
		ask       int64
		claimUID  types.UID
		noLV      bool
		wantState string
		wantSize  int64 // after, when expanded (and the LV's)
		reason    string
		resized   bool // ResizeLV was called
	}{
		{name: "owned thick", class: "thick", tags: ours, size: 8 * mib, ask: 20*mib + 1, claimUID: claim,
			wantState: kube.StateExpanded, wantSize: 24 * mib, resized: true},
		{name: "owned thin", class: "thin", tags: ours, size: 8 * mib, ask: 2 << 30, claimUID: claim,
			wantState: kube.StateExpanded, wantSize: 2 << 30, resized: true},
		{name: "smaller than the LV", class: "thick", tags: ours, size: 64 * mib, ask: 16 * mib, claimUID: claim,
			wantState: kube.StateExpanded, wantSize: 64 * mib},
		{name: "equal", class: "thick", tags: ours, size: 64 * mib, ask: 64 * mib, claimUID: claim,
			wantState: kube.StateExpanded, wantSize: 64 * mib},
		{name: "another claim's LV", class: "thick", tags: []string{OwnerTag("other")}, size: 8 * mib, ask: 64 * mib, claimUID: claim,
			wantState: kube.StateFailed, reason: kube.ReasonNameConflict},
		{name: "untagged LV", class: "thick", size: 8 * mib, ask: 64 * mib, claimUID: claim,
			wantState: kube.StateFailed, reason: kube.ReasonNameConflict},
		{name: "no claimRef", class: "thick", tags: ours, size: 8 * mib, ask: 64 * mib,
			wantState: kube.StateFailed, reason: kube.ReasonInvalidSpec},
		{name: "too big for the VG", class: "thick", tags: ours, size: 8 * mib, ask: 2 << 30, claimUID: claim,
			wantState: kube.StateFailed, reason: kube.ReasonInsufficientCapacity, resized: true},
		{name: "too big for the thin pool", class: "thin", tags: ours, size: 8 * mib, ask: 6 << 30, claimUID: claim,
			wantState: kube.StateFailed, reason: kube.ReasonInsufficientCapacity, resized: true},
		{name: "no LV", class: "thick", noLV: true, ask: 64 * mib, claimUID: claim,
			wantState: kube.StateFailed, reason: kube.ReasonVolumeNotFound},
		{name: "unknown volume group", class: "nope", noLV: true, ask: 64 * mib, claimUID: claim,
			wantState: kube.StateFailed, reason: kube.ReasonUnknownVolumeGroup},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := start(t, Config{})
			if !tc.noLV {
				require.NoError(t, e.lvm.Add(lvmdfake.LV{Class: tc.class, Name: "lv1", SizeBytes: uint64(tc.size), Tags: tc.tags, Thin: tc.class == "thin"}))
			}
			calls := resizes(e.lvm)
			e.pv(t, "pv1", node, tc.claimUID, growSpec(tc.class, tc.ask))
			ann := e.waitGrow(t, "pv1")
			require.Equal(t, tc.wantState, ann[kube.AnnLifecycle], "annotations: %v", ann)
			assert.Equal(t, tc.resized, calls.Load() > 0, "ResizeLV called")
			if tc.wantState == kube.StateExpanded {
				assert.Equal(t, strconv.FormatInt(tc.wantSize, 10), ann[kube.AnnSize])
				assert.Equal(t, uint64(tc.wantSize), lvSize(t, e.lvm, tc.class))
				assert.NotContains(t, ann, kube.AnnError)
				return
			}
			assert.Equal(t, tc.reason, ann[kube.AnnReason])
			assert.NotEmpty(t, ann[kube.AnnError])
			assert.NotContains(t, ann, kube.AnnSize)
			if !tc.noLV {
				assert.Equal(t, uint64(tc.size), lvSize(t, e.lvm, tc.class), "the LV is left as it was")
			}
		})
	}
}

// An agent whose lvmd cannot resize (google/lvmd) answers at once with its
// own reason, and the LV stays as it was.
func TestGrowGoogleLVMD(t *testing.T) {
	m, e := startGoogle(t)
	require.NoError(t, m.Add(lvmdfake.LV{Class: "vg0", Name: "lv1", SizeBytes: 8 * mib, Tags: []string{OwnerTag("claim-uid")}}))
	e.pv(t, "pv1", node, "claim-uid", growSpec("vg0", 64*mib))
	ann := e.waitGrow(t, "pv1")
	assert.Equal(t, kube.StateFailed, ann[kube.AnnLifecycle])
	assert.Equal(t, kube.ReasonResizeNotSupported, ann[kube.AnnReason])
	assert.Contains(t, ann[kube.AnnError], "google/lvmd has no resize")
	assert.Equal(t, uint64(8*mib), lvSize(t, m, "vg0"))
}

// A grow that lvmd cannot serve for a while is retried, and answered once
// lvmd is back; a grow answered is never asked of lvmd again.
func TestGrowRetriesUntilLVMDIsBack(t *testing.T) {
	e := start(t, Config{})
	require.NoError(t, e.lvm.Add(lvmdfake.LV{Class: "thick", Name: "lv1", SizeBytes: 8 * mib, Tags: []string{OwnerTag("claim-uid")}}))
	e.lvmd.Stop()
	e.pv(t, "pv1", node, "claim-uid", growSpec("thick", 32*mib))
	require.Eventually(t, func() bool {
		pv, err := e.client.CoreV1().PersistentVolumes().Get(context.Background(), "pv1", metav1.GetOptions{})
		return err == nil && pv.Annotations[kube.AnnError] != ""
	}, 10*time.Second, 10*time.Millisecond, "the transient error is recorded")
	require.NoError(t, e.lvmd.Serve(e.socket))
	ann := e.waitGrow(t, "pv1")
	assert.Equal(t, kube.StateExpanded, ann[kube.AnnLifecycle])
	assert.Equal(t, strconv.Itoa(32*mib), ann[kube.AnnSize])
	assert.NotContains(t, ann, kube.AnnError)
}

// startGoogle starts an agent whose lvmd is google/lvmd's (the fake, over
// its real gRPC protocol) with one VG, vg0, of 1 GiB.
func startGoogle(t *testing.T) (*lvmdfake.LVM, *env) {
	t.Helper()
	m := lvmdfake.NewLVM(lvmdfake.Class{Name: "vg0", SizeBytes: 1 << 30})
	srv := lvmdfake.NewGoogle(m)
	addr, err := srv.Serve("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	b, err := lvmbackend.NewGoogleLVMD(addr, nil, 10*time.Millisecond)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	e := startOn(t, Config{}, fakeLVMD{lvm: m}, b)
	return m, e
}

// With shared reads, a grow goes by the class's kept listing when the
// kernel's device confirms the LV (its device-mapper name, at the listed
// numbers) and reads the size from that device: no listing of its own.
// Whatever does not match reads a fresh listing.
func TestGrowConfirmedByTheKernel(t *testing.T) {
	cases := []struct {
		name    string
		dmName  func(vg string) string // "" for no device in sysfs
		sectors int64                  // the device's size
		listed  bool                   // a listing of its own
		want    int64                  // the answer
		resized bool
	}{
		{name: "confirmed", dmName: func(vg string) string { return vg + "-lv1" }, sectors: 8 * mib / 512,
			want: 32 * mib, resized: true},
		{name: "the device is larger than listed", dmName: func(vg string) string { return vg + "-lv1" }, sectors: 40 * mib / 512,
			want: 40 * mib},
		{name: "another LV at the numbers", dmName: func(vg string) string { return vg + "-lv2" }, sectors: 8 * mib / 512,
			listed: true, want: 32 * mib, resized: true},
		{name: "no device", dmName: func(string) string { return "" },
			listed: true, want: 32 * mib, resized: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			e := start(t, Config{sysRoot: root})
			require.NoError(t, e.lvm.Add(lvmdfake.LV{Class: "thick", Name: "lv1", SizeBytes: 8 * mib, Tags: []string{OwnerTag("claim-uid")}}))
			vols, err := e.agent.backend.ListVolumes(context.Background(), "thick")
			require.NoError(t, err)
			require.Len(t, vols, 1)
			lv := vols[0]
			if name := tc.dmName(filepath.Base(filepath.Dir(lv.Path))); name != "" {
				dir := filepath.Join(root, "sys/dev/block", fmt.Sprintf("%d:%d", lv.DevMajor, lv.DevMinor))
				require.NoError(t, os.MkdirAll(filepath.Join(dir, "dm"), 0o755))
				require.NoError(t, os.WriteFile(filepath.Join(dir, "dm", "name"), []byte(name+"\n"), 0o644))
				require.NoError(t, os.WriteFile(filepath.Join(dir, "size"), []byte(strconv.FormatInt(tc.sectors, 10)+"\n"), 0o644))
			}
			var lists, resized atomic.Int32
			e.lvm.SetHook(func(op, _, _ string) error {
				switch op {
				case "list":
					lists.Add(1)
				case "resize":
					resized.Add(1)
				}
				return nil
			})
			e.pv(t, "pv1", node, "claim-uid", growSpec("thick", 32*mib))
			ann := e.waitGrow(t, "pv1")
			require.Equal(t, kube.StateExpanded, ann[kube.AnnLifecycle], "annotations: %v", ann)
			assert.Equal(t, strconv.FormatInt(tc.want, 10), ann[kube.AnnSize])
			assert.Equal(t, tc.listed, lists.Load() > 0, "a listing of its own")
			assert.Equal(t, tc.resized, resized.Load() > 0, "ResizeLV called")
		})
	}
}
