package agent

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

func TestClassify(t *testing.T) {
	terminating := gcPVC("live", "")
	terminating.Finalizers = []string{"kubernetes.io/pvc-protection"}
	noClaimUID := gcPV("pv-x", "", "", "")
	noClaimUID.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "default", Name: "someone"}
	owner := OwnerTag("gone")
	cases := []struct {
		name string
		tags []string
		attr string // lv_attr ("": the dialect reports none)
		objs []runtime.Object
		want LVRef
	}{
		{name: "untagged", want: LVRef{Use: LVForeign}},
		{name: "foreign tags", tags: []string{"made-by-hand", "lvm-agent.pvcx"}, want: LVRef{Use: LVForeign}},
		{name: "prefix without a UID", tags: []string{OwnerTagPrefix}, want: LVRef{Use: LVForeign}},
		{name: "prefix without a UID, protected", tags: []string{OwnerTagPrefix, ProtectedTag}, want: LVRef{Use: LVForeign}},
		{name: "orphan", tags: []string{owner, "app"}, want: LVRef{Use: LVOrphan, OwnerUID: "gone"}},
		{name: "protected", tags: []string{owner, ProtectedTag}, want: LVRef{Use: LVKept, OwnerUID: "gone", By: "tagged " + ProtectedTag}},
		{name: "retained", tags: []string{owner, kube.RetainedTag}, want: LVRef{Use: LVKept, OwnerUID: "gone", By: "tagged " + kube.RetainedTag}},
		{name: "linear", tags: []string{owner}, attr: "-wi-a-----", want: LVRef{Use: LVOrphan, OwnerUID: "gone"}},
		{name: "thin", tags: []string{owner}, attr: "Vwi-a-tz--", want: LVRef{Use: LVOrphan, OwnerUID: "gone"}},
		{name: "origin", tags: []string{owner}, attr: "owi-a-s---", want: LVRef{Use: LVKept, OwnerUID: "gone", By: "not a plain volume (lv_attr owi-a-s---)"}},
		{name: "thin pool", tags: []string{owner}, attr: "twi-a-tz--", want: LVRef{Use: LVKept, OwnerUID: "gone", By: "not a plain volume (lv_attr twi-a-tz--)"}},
		{name: "snapshot", tags: []string{owner}, attr: "swi-a-s---", want: LVRef{Use: LVKept, OwnerUID: "gone", By: "not a plain volume (lv_attr swi-a-s---)"}},
		{name: "a claim beats not plain", tags: []string{OwnerTag("live")}, attr: "owi-a-s---", objs: []runtime.Object{gcPVC("live", "")},
			want: LVRef{Use: LVClaimed, OwnerUID: "live", By: "PVC default/pvc-live"}},
		{name: "PVC exists", tags: []string{OwnerTag("live")}, objs: []runtime.Object{gcPVC("live", "")},
			want: LVRef{Use: LVClaimed, OwnerUID: "live", By: "PVC default/pvc-live"}},
		{name: "PVC being deleted", tags: []string{OwnerTag("live")}, objs: []runtime.Object{terminating},
			want: LVRef{Use: LVClaimed, OwnerUID: "live", By: "PVC default/pvc-live"}},
		{name: "a claim beats a retained tag", tags: []string{OwnerTag("live"), kube.RetainedTag}, objs: []runtime.Object{gcPVC("live", "")},
			want: LVRef{Use: LVClaimed, OwnerUID: "live", By: "PVC default/pvc-live"}},
		{name: "PV bound to the claim", tags: []string{owner}, objs: []runtime.Object{gcPV("pv", "gone", "", "h")},
			want: LVRef{Use: LVReleased, OwnerUID: "gone", By: "PV pv"}},
		{name: "PV spec names it", tags: []string{owner}, objs: []runtime.Object{gcPV("pv", "", "vg9/lv1", "h")},
			want: LVRef{Use: LVNamed, OwnerUID: "gone", By: "the spec of PV pv"}},
		{name: "PV JSON spec names it", tags: []string{owner}, objs: []runtime.Object{gcPV("pv", "", `{"volumeGroup":"vg9","name":"lv1"}`, "h")},
			want: LVRef{Use: LVNamed, OwnerUID: "gone", By: "the spec of PV pv"}},
		{name: "a spec the agent would refuse still names it", tags: []string{owner}, objs: []runtime.Object{gcPV("pv", "", `{"name":"lv1","size":"huge"}`, "h")},
			want: LVRef{Use: LVNamed, OwnerUID: "gone", By: "the spec of PV pv"}},
		{name: "PV volume handle", tags: []string{owner}, objs: []runtime.Object{gcPV("pv", "", "", "lv1")},
			want: LVRef{Use: LVNamed, OwnerUID: "gone", By: "the CSI volume handle of PV pv"}},
		{name: "another PVC's spec names it", tags: []string{owner}, objs: []runtime.Object{gcPVC("other", `{"volumeGroup":"thick","name":"lv1","size":4096}`)},
			want: LVRef{Use: LVNamed, OwnerUID: "gone", By: "the spec of PVC default/pvc-other"}},
		{name: "the first object naming it is the one given", tags: []string{owner},
			objs: []runtime.Object{gcPV("pv-a", "", "", "lv1"), gcPV("pv-b", "", "vg/lv1", "lv1")},
			want: LVRef{Use: LVNamed, OwnerUID: "gone", By: "the CSI volume handle of PV pv-a"}},
		{name: "a claimRef without a UID names no claim", tags: []string{owner}, objs: []runtime.Object{noClaimUID},
			want: LVRef{Use: LVOrphan, OwnerUID: "gone"}},
		{name: "unrelated objects", tags: []string{owner},
			objs: []runtime.Object{gcPVC("other", `{"volumeGroup":"thick","name":"lv2","size":4096}`), gcPV("pv", "other", "thick/lv2", "lv2"), &corev1.Node{}},
			want: LVRef{Use: LVOrphan, OwnerUID: "gone"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var refs References
			for _, o := range tc.objs {
				refs.Add(o)
			}
			lv := lvmbackend.Volume{Name: "lv1", Tags: tc.tags, Attr: tc.attr}
			assert.Equal(t, tc.want, refs.Classify(&lv))
		})
	}
}
