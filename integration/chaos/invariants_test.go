package chaos

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/lvm-agent/lvm-agent/agent"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

// check is one invariant: how many things it looked at, and what broke it.
type check struct {
	name       string
	checked    int
	violations []string
}

func (c *check) fail(format string, a ...any) {
	c.violations = append(c.violations, fmt.Sprintf(format, a...))
}

// world is the end state the invariants are checked on.
type world struct {
	vols      []*volume
	records   map[objKey]record
	lvs       []lvmdfake.LV // every class
	before    []*seededLV   // foreign and protected, as made
	pvcUIDs   map[types.UID]bool
	claimUIDs map[types.UID]bool
	listed    map[objKey]listedObj
	// removes are the remove calls that reached lvmd, by LV name.
	removes map[string][]time.Time
}

type listedObj struct{ state, rv, errMsg string }

// observe lists the LVs and, from the API server, every PVC and PV.
func observe(ctx context.Context, c kubernetes.Interface, lvm *lvmdfake.LVM, vols []*volume, tr *tracker, before []*seededLV) (*world, error) {
	w := &world{vols: vols, records: tr.all(), before: before,
		pvcUIDs: map[types.UID]bool{}, claimUIDs: map[types.UID]bool{}, listed: map[objKey]listedObj{}}
	for _, cl := range classes() {
		lvs, err := lvm.List(cl.Name)
		if err != nil {
			return nil, err
		}
		w.lvs = append(w.lvs, lvs...)
	}
	pvcs, err := c.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, p := range pvcs.Items {
		w.pvcUIDs[p.UID] = true
		w.listed[objKey{"pvc", p.Namespace, p.Name}] = listedObj{p.Annotations[kube.AnnLifecycle], p.ResourceVersion, p.Annotations[kube.AnnError]}
	}
	pvs, err := c.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, p := range pvs.Items {
		if p.Spec.ClaimRef != nil {
			w.claimUIDs[p.Spec.ClaimRef.UID] = true
		}
		w.listed[objKey{"pv", "", p.Name}] = listedObj{p.Annotations[kube.AnnLifecycle], p.ResourceVersion, p.Annotations[kube.AnnError]}
	}
	return w, nil
}

// lagging lists the objects the tracker has not yet seen at the version
// the list shows: the invariants are checked once it has caught up.
func (w *world) lagging() []string {
	var out []string
	for k, l := range w.listed {
		if r, ok := w.records[k]; !ok || r.rv != l.rv {
			out = append(out, k.String())
		}
	}
	return out
}

// orphans are the LVs that carry an owner tag naming a claim that no PVC
// and no PV's claimRef has (protected ones excepted).
func (w *world) orphans() []string {
	var out []string
	for _, lv := range w.lvs {
		uid := ownerUID(lv)
		if uid == "" || slices.Contains(lv.Tags, agent.ProtectedTag) {
			continue
		}
		if !w.pvcUIDs[uid] && !w.claimUIDs[uid] {
			out = append(out, fmt.Sprintf("%s/%s (owner %s)", lv.Class, lv.Name, uid))
		}
	}
	return out
}

func ownerUID(lv lvmdfake.LV) types.UID {
	for _, t := range lv.Tags {
		if uid, ok := strings.CutPrefix(t, agent.OwnerTagPrefix); ok && uid != "" {
			return types.UID(uid)
		}
	}
	return ""
}

// checks evaluates every invariant; extra are checks made during the run.
func (w *world) checks(extra ...*check) []*check {
	final := &check{name: "every request reached its expected final state"}
	listed := &check{name: "final state unchanged in a fresh list (same resourceVersion)"}
	one := &check{name: "created volume: exactly one LV, right size, ownership tag"}
	gone := &check{name: "deleted volume: no LV left"}
	failedNoLV := &check{name: "failed or abandoned request: no LV of its claim"}
	owned := &check{name: "no LV of ours without an owner (PVC or bound PV)"}
	early := &check{name: "no LV removed unless its claim let go of it"}
	untouched := &check{name: "foreign and protected LVs untouched"}
	writes := &check{name: "no object written after its final state"}
	twice := &check{name: "no claim with two LVs"}
	open := &check{name: "no request left open without an error"}
	unanswered := &check{name: "no answer to a request labelled for the node but owned by none"}
	misdirected := map[objKey]bool{}

	byOwner := map[types.UID][]lvmdfake.LV{}
	for _, lv := range w.lvs {
		if uid := ownerUID(lv); uid != "" {
			byOwner[uid] = append(byOwner[uid], lv)
		}
	}
	for _, v := range w.vols {
		if v.err != nil {
			final.checked++
			final.fail("%s: the provisioner could not finish: %v", v, v.err)
			continue
		}
		for _, req := range []struct {
			key           objKey
			uid           types.UID
			state, reason string
		}{
			{objKey{"pvc", v.ns, v.pvc}, v.uid, first(v.wantCreate()), second(v.wantCreate())},
			{objKey{"pv", "", v.pv}, "", first(v.wantDelete()), second(v.wantDelete())},
		} {
			if req.state == "" {
				continue
			}
			final.checked++
			r, ok := w.records[req.key]
			switch {
			case !ok || r.final == nil || (req.uid != "" && r.uid != req.uid):
				final.fail("%s: %s never reached a final state (last seen %q)", v, req.key, r.state)
				continue
			case r.state != req.state || r.reason != req.reason:
				final.fail("%s: %s is %s/%s, want %s/%s (error: %s)", v, req.key, r.state, r.reason, req.state, req.reason, r.errMsg)
			}
			// Objects the provisioner keeps must show the same final state,
			// at the same version, in a list made now.
			if l, ok := w.listed[req.key]; ok {
				listed.checked++
				if l.state != req.state || l.rv != r.finalRV {
					listed.fail("%s: listed %s at rv %s; final %s was seen at rv %s", req.key, l.state, l.rv, r.state, r.finalRV)
				}
			}
		}
		if v.kind == kindMisdirected {
			k := objKey{"pv", "", v.pv}
			misdirected[k] = true
			unanswered.checked++
			if r, ok := w.records[k]; ok && r.final != nil {
				unanswered.fail("%s: %s was answered %s/%s (error: %s)", v, k, r.state, r.reason, r.errMsg)
			}
		}
		// No LV is removed unless its claim let go of it (claim deleted,
		// delete asked): never one a volume keeps, never one not its own.
		// Until a created answer names it (if one ever does), the claim's
		// own LV may be removed and made again (the agent does so with an
		// LV it found made, which an lvcreate cut short may have left half
		// made or unwiped).
		early.checked++
		owner := v // whose LV v.lv is
		if v.kind == kindPointer && v.victim != nil {
			owner = v.victim
		}
		r, claimed := w.records[objKey{"pvc", owner.ns, owner.pvc}]
		unnamed := func(at, answered time.Time) bool { return answered.IsZero() || at.Before(answered) }
		notOwn := v.kind == kindConflict || v.kind == kindProtected // and no owner's to make again
		for _, at := range w.removes[v.lv] {
			switch {
			case !notOwn && claimed && unnamed(at, r.answered):
				// Its owner's, removed before an answer named it (made again).
			case notOwn || v.kind == kindPointer:
				early.fail("%s: the LV it names (not its own) was removed at %s", v, at.Format(time.StampMilli))
			case v.keeps():
				early.fail("%s: LV %s, which it keeps, removed at %s", v, v.lv, at.Format(time.StampMilli))
			case v.released.IsZero() || at.Before(v.released):
				early.fail("%s: LV %s removed at %s, while still in use (released at %s)", v, v.lv, at.Format(time.StampMilli), v.released.Format(time.StampMilli))
			}
		}
		if v.oldLV != "" {
			for _, at := range w.removes[v.oldLV] {
				if at.Before(v.first) && !unnamed(at, v.firstAnswered) {
					early.fail("%s: LV %s removed at %s, before its first claim was deleted (%s)", v, v.oldLV, at.Format(time.StampMilli), v.first.Format(time.StampMilli))
				}
			}
		}
		lvs := byOwner[v.uid]
		switch {
		case v.keeps():
			one.checked++
			if len(lvs) != 1 {
				one.fail("%s: %d LVs tagged %s: %v", v, len(lvs), agent.OwnerTag(v.uid), lvNames(lvs))
				continue
			}
			if lv := lvs[0]; lv.Class != v.class || lv.Name != v.lv || lv.SizeBytes != v.lvSize() {
				one.fail("%s: LV %s/%s of %d bytes, want %s/%s of %d", v, lv.Class, lv.Name, lv.SizeBytes, v.class, v.lv, v.lvSize())
			}
		case v.kind == kindFull || v.kind == kindLegacy:
			gone.checked++
			for _, lv := range w.lvs {
				if lv.Name == v.lv || v.uid != "" && ownerUID(lv) == v.uid {
					gone.fail("%s: LV %s/%s left (tags %v)", v, lv.Class, lv.Name, lv.Tags)
				}
			}
		case v.kind == kindAbandon || v.kind == kindInvalid || v.kind == kindConflict || v.kind == kindTooBig || v.kind == kindTerminating:
			failedNoLV.checked++
			if len(lvs) != 0 {
				failedNoLV.fail("%s: LVs of its claim left: %v", v, lvNames(lvs))
			}
		}
	}
	for _, lv := range w.lvs {
		if ownerUID(lv) != "" && !slices.Contains(lv.Tags, agent.ProtectedTag) {
			owned.checked++
		}
	}
	for _, o := range w.orphans() {
		owned.fail("orphan LV %s", o)
	}
	for uid, lvs := range byOwner {
		twice.checked++
		if len(lvs) > 1 {
			twice.fail("claim %s has %d LVs: %v", uid, len(lvs), lvNames(lvs))
		}
	}
	for k, l := range w.listed {
		if misdirected[k] {
			continue // nobody's to answer: checked above
		}
		open.checked++
		if (l.state == kube.StateCreating || l.state == kube.StateDeleting) && l.errMsg == "" {
			open.fail("%s is %s, with no error", k, l.state)
		}
	}
	have := map[string]lvmdfake.LV{}
	for _, lv := range w.lvs {
		have[lv.Class+"/"+lv.Name] = lv
	}
	for _, s := range w.before {
		untouched.checked++
		if at := w.removes[s.name]; len(at) > 0 {
			untouched.fail("%s/%s: remove called %d times", s.class, s.name, len(at))
		}
		lv, ok := have[s.class+"/"+s.name]
		switch {
		case !ok:
			untouched.fail("%s/%s was removed", s.class, s.name)
		case lv.SizeBytes != s.size || !slices.Equal(lv.Tags, s.tags):
			untouched.fail("%s/%s changed: %d bytes, tags %v (was %d, %v)", s.class, s.name, lv.SizeBytes, lv.Tags, s.size, s.tags)
		}
	}
	keys := make([]objKey, 0, len(w.records))
	for k := range w.records {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	for _, k := range keys {
		r := w.records[k]
		if r.final == nil {
			continue
		}
		writes.checked++
		for _, wr := range r.writesAfterFinal {
			writes.fail("%s written after its final state %s: %s", k, r.state, wr)
		}
	}
	return append([]*check{final, listed, one, gone, failedNoLV, owned, early, untouched, writes, twice, open, unanswered}, extra...)
}

func first(a, _ string) string  { return a }
func second(_, b string) string { return b }

func lvNames(lvs []lvmdfake.LV) []string {
	out := make([]string, 0, len(lvs))
	for _, lv := range lvs {
		out = append(out, lv.Class+"/"+lv.Name)
	}
	return out
}

// printTable writes the invariants as a table, then each violation.
func printTable(out io.Writer, checks []*check) int {
	total := 0
	fmt.Fprintf(out, "%-62s %8s %10s\n", "invariant", "checked", "violations")
	for _, c := range checks {
		fmt.Fprintf(out, "%-62s %8d %10d\n", c.name, c.checked, len(c.violations))
		total += len(c.violations)
	}
	for _, c := range checks {
		for i, v := range c.violations {
			if i == 20 {
				fmt.Fprintf(out, "  %s: ... and %d more\n", c.name, len(c.violations)-i)
				break
			}
			fmt.Fprintf(out, "  %s: %s\n", c.name, v)
		}
	}
	return total
}
