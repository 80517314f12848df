package agent

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/pager"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// What references an LV: the one rule that both the orphan collector (which
// removes only an LVOrphan) and "volume status" (which reports it as
// ORPHAN-LV) follow, so that they never disagree.

// LVUse is what the cluster's objects say about an LV.
type LVUse int

const (
	// LVForeign: no ownership tag with a UID; someone else's LV (or the
	// original agent's), never the collector's.
	LVForeign LVUse = iota
	// LVClaimed: a PVC of the owner UID exists (being deleted included).
	LVClaimed
	// LVReleased: no PVC of the owner UID, but a PV's claimRef names it.
	LVReleased
	// LVNamed: a PVC's or PV's spec, or a PV's CSI volume handle, names
	// the LV (by name, in any device class).
	LVNamed
	// LVKept: nothing refers to it, but it is tagged protected or retained,
	// or is not a plain volume (an origin, a pool, a snapshot, ...).
	LVKept
	// LVOrphan: ours, and nothing keeps it.
	LVOrphan
)

// LVRef is an LV's classification.
type LVRef struct {
	Use LVUse
	// OwnerUID is the UID the ownership tag names ("" for LVForeign).
	OwnerUID string
	// By is what keeps it: "PVC ns/name", "PV name", "the spec of PVC
	// ns/name", "the spec of PV name", "the CSI volume handle of PV name",
	// or for an LVKept "tagged <tag>" or "not a plain volume (lv_attr
	// <attr>)"; "" for LVForeign and LVOrphan.
	By string
}

// References index the PVCs and PVs that may refer to LVs. The zero value
// holds none: Classify then tells ours from foreign and kept.
type References struct {
	claims   map[string]referrer // PVC UID → the PVC
	pvClaims map[string]referrer // claimRef UID → the PV
	names    map[string]referrer // LV name → the first object naming it
}

// referrer is an object that refers to an LV, and how; kept as the
// object's own strings, since the collector indexes the whole cluster and
// only the LVs it reports need the words.
type referrer struct{ how, kind, namespace, name string }

func (r referrer) String() string {
	if r.namespace != "" {
		return r.how + r.kind + " " + r.namespace + "/" + r.name
	}
	return r.how + r.kind + " " + r.name
}

// Add indexes a PVC or a PV (anything else is ignored).
func (r *References) Add(obj runtime.Object) {
	if r.claims == nil {
		r.claims, r.pvClaims, r.names = map[string]referrer{}, map[string]referrer{}, map[string]referrer{}
	}
	first := func(m map[string]referrer, k string, v referrer) {
		if _, ok := m[k]; !ok && k != "" {
			m[k] = v
		}
	}
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		first(r.claims, string(o.UID), referrer{"", "PVC", o.Namespace, o.Name})
		first(r.names, kube.SpecName(o.Annotations[kube.AnnSpec]), referrer{"the spec of ", "PVC", o.Namespace, o.Name})
	case *corev1.PersistentVolume:
		if o.Spec.ClaimRef != nil {
			first(r.pvClaims, string(o.Spec.ClaimRef.UID), referrer{"", "PV", "", o.Name})
		}
		first(r.names, kube.SpecName(o.Annotations[kube.AnnSpec]), referrer{"the spec of ", "PV", "", o.Name})
		if o.Spec.CSI != nil {
			first(r.names, o.Spec.CSI.VolumeHandle, referrer{"the CSI volume handle of ", "PV", "", o.Name})
		}
	}
}

// Classify says what keeps lv, the strongest reference first.
func (r *References) Classify(lv *lvmbackend.Volume) LVRef {
	uid, ours := OwnerUID(lv)
	if !ours || uid == "" { // an empty UID is not a tag the agent writes
		return LVRef{Use: LVForeign}
	}
	if by, ok := r.claims[uid]; ok {
		return LVRef{Use: LVClaimed, OwnerUID: uid, By: by.String()}
	}
	if by, ok := r.pvClaims[uid]; ok {
		return LVRef{Use: LVReleased, OwnerUID: uid, By: by.String()}
	}
	if by, ok := r.names[lv.Name]; ok {
		return LVRef{Use: LVNamed, OwnerUID: uid, By: by.String()}
	}
	for _, tag := range []string{ProtectedTag, kube.RetainedTag} {
		if lv.HasTag(tag) {
			return LVRef{Use: LVKept, OwnerUID: uid, By: "tagged " + tag}
		}
	}
	// lvmd removes with lvremove -f, which takes an origin's snapshots and a
	// pool's thin LVs along: as a delete (NotPlainVolume), the collector
	// never removes such an LV. (A dialect without lv_attr is checked by the
	// collector's listing before it removes; see OrphanGC.remove.)
	if plain, known := lv.Plain(); known && !plain {
		return LVRef{Use: LVKept, OwnerUID: uid, By: "not a plain volume (lv_attr " + lv.Attr + ")"}
	}
	return LVRef{Use: LVOrphan, OwnerUID: uid}
}

// Claim names the PVC of UID uid ("" if none was added).
func (r *References) Claim(uid string) string {
	if by, ok := r.claims[uid]; ok {
		return by.String()
	}
	return ""
}

// liveRefs lists every PVC (and with pvs, every PV) from the API server,
// paged. An unset resourceVersion makes the list a consistent read: the API
// server answers with etcd's latest revision (from its watch cache once that
// has caught up), never with a state older than the LVs just listed.
func (a *Agent) liveRefs(ctx context.Context, pvs bool) (*References, error) {
	r := &References{}
	lctx, cancel := context.WithTimeout(ctx, a.cfg.OpTimeout)
	defer cancel()
	each := func(what string, list pager.ListPageFunc) error {
		err := pager.New(list).EachListItem(lctx, metav1.ListOptions{}, func(obj runtime.Object) error { r.Add(obj); return nil })
		if err != nil {
			return fmt.Errorf("list %s: %w", what, err)
		}
		return nil
	}
	if err := each("PVCs", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return a.client.PVCs("").List(ctx, o)
	}); err != nil || !pvs {
		return r, err
	}
	return r, each("PVs", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return a.client.PVs().List(ctx, o)
	})
}
