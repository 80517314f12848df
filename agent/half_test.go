package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

// An lvcreate killed with lvmd's container after it committed the claim's LV
// and before it resumed the LV's device leaves the LV inactive (lv_attr
// state '-'), or its device with an inactive table only ('i') or none
// ('d'), and nothing activates it: the request was retried forever, or
// answered with a path that never appeared, on which kubelet's mount failed
// for good (CI runs of make test's ten claims under kills). No answer
// named the LV, so it never held data: it is removed and made again, and
// the claim answered.
func TestHalfMadeLVIsMadeAgain(t *testing.T) {
	for _, state := range []byte("-id") {
		t.Run(string(state), func(t *testing.T) {
			e := start(t, Config{})
			// Thin: a whole thin LV found made is answered, so only its
			// state makes it be made again.
			require.NoError(t, e.lvm.Add(lvmdfake.LV{Class: "thin", Thin: true, Name: "lv0", SizeBytes: 4096,
				Tags: []string{OwnerTag("default-pvc-uid")}, State: state}))
			e.pvc(t, "default", "pvc", node, spec(`{"volumeGroup":"thin","name":"lv0","size":4096}`))
			got := e.waitPVC(t, "default", "pvc")
			require.Equal(t, kube.StateCreated, got[kube.AnnLifecycle], "%v", got)
			lvs, err := e.lvm.List("thin")
			require.NoError(t, err)
			require.Len(t, lvs, 1)
			assert.Equal(t, "lv0", lvs[0].Name)
			assert.Equal(t, byte('a'), lvs[0].Attr[4], "the LV made again is active: %s", lvs[0].Attr)
			assert.Contains(t, lvs[0].Tags, OwnerTag("default-pvc-uid"))
		})
	}
}

// What is not the claim's to remove stays: a half-made LV tagged protected,
// or of a claim answered with a device before (asked again: a PV may hold
// its data), is never answered and never removed, nor is another claim's,
// and an LV not made by lvm-agent under the asked name is refused as before.
func TestHalfMadeLVNotOursStays(t *testing.T) {
	for _, c := range []struct {
		name, reason, error, device string
		tags                        []string
	}{
		{name: "protected", error: "tagged protected", tags: []string{OwnerTag("default-pvc-uid"), ProtectedTag}},
		{name: "answered before", error: "answered with a device before", device: "/dev/vg0/lv0", tags: []string{OwnerTag("default-pvc-uid")}},
		{name: "another claim's", reason: kube.ReasonNameConflict, tags: []string{OwnerTag("other-uid")}},
		{name: "foreign", reason: kube.ReasonNameConflict, tags: []string{"owner=someone-else"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := start(t, Config{})
			require.NoError(t, e.lvm.Add(lvmdfake.LV{Class: "thick", Name: "lv0", SizeBytes: 4096, Tags: c.tags, State: 'i'}))
			ann := spec(`{"volumeGroup":"thick","name":"lv0","size":4096}`)
			if c.device != "" {
				ann[kube.AnnDevice] = c.device
			}
			e.pvc(t, "default", "pvc", node, ann)
			if c.reason != "" {
				got := e.waitPVC(t, "default", "pvc")
				assert.Equal(t, kube.StateFailed, got[kube.AnnLifecycle], "%v", got)
				assert.Equal(t, c.reason, got[kube.AnnReason])
			} else {
				// The request stays open, its error on the claim.
				var ann map[string]string
				require.Eventually(t, func() bool {
					pvc, err := e.client.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), "pvc", metav1.GetOptions{})
					ann = pvc.GetAnnotations()
					return err == nil && strings.Contains(ann[kube.AnnError], "left as it is")
				}, 10*time.Second, 5*time.Millisecond, "%v", ann)
				assert.Equal(t, kube.StateCreating, ann[kube.AnnLifecycle])
				assert.Contains(t, ann[kube.AnnError], "half made")
				assert.Contains(t, ann[kube.AnnError], c.error)
			}
			lvs, err := e.lvm.List("thick")
			require.NoError(t, err)
			require.Len(t, lvs, 1)
			assert.Equal(t, byte('i'), lvs[0].Attr[4], "left as it was: %s", lvs[0].Attr)
		})
	}
}
