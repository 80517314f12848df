package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// Orphan garbage collection. An LV is an orphan when it carries this
// agent's ownership tag, is tagged neither protected nor retained (the
// provisioner's tag for volumes of Retain classes: their data outlives the
// PV, as Kubernetes promises), no PVC with the tag's UID exists, and no PV or
// PVC references it. That happens when a PVC is deleted
// while its create is in flight (lvmd finishes the lvcreate, the answer finds
// no PVC), or when a provisioner deletes a PV without asking for "deleting".
//
// An orphan is removed on the second pass that finds it orphaned, never on
// the first. The mark between the passes is kept in this process only:
// topolvm's lvmd has no RPC that adds a tag to an existing LV (the Backend
// has none either), and keeping it in the API server (an annotation, a
// ConfigMap) would need write access to objects the agent otherwise never
// writes, against a minimal role. A mark lost with a restart only makes the
// two passes start again, which delays a removal and never hastens one.
//
// Before removing anything the references are read from the API server (a
// paged, consistent list), not only from the informers' caches: a cache may
// lag, or (watch mode "labelled") not hold every PVC. That list is of the
// whole cluster, so it is bounded: an LV the list explained (its PVC exists
// but is not in the cache) is not listed for again before RecheckAfter, and
// in a dry run an LV already reported is reported again without a list. A
// list thus happens only for an LV that is new to the collector, due for
// removal, or explained longer ago than RecheckAfter.
//
// It is on by default, so it holds back where its rule could be wrong for
// many LVs at once: a pass with more orphans due than GCConfig.Max removes
// none of them. A crash leaves at most the creates in flight (bounded by the
// lvmd-call slots); an API server restored from an old backup, or an agent
// pointed at another cluster, makes many LVs look orphaned together.

// GCConfig configures the orphan collector.
type GCConfig struct {
	// Interval between passes; an orphan is removed at least this long after
	// it was first found orphaned.
	Interval time.Duration
	// DryRun logs and counts what would be removed, and removes nothing.
	DryRun bool
	// RecheckAfter is how long an LV that the API server's references
	// explained is left out of the live list (0: ten intervals). It delays
	// the removal of an LV whose last reference goes, never hastens one.
	RecheckAfter time.Duration
	// Max is the most orphans one pass removes; a pass with more due removes
	// none and reports them held (0: no bound).
	Max int
}

// firstPassAfter bounds the wait for the first pass, and for the next one
// after a pass that failed: an agent's start is when a crash's orphans are
// to be found, not an interval later, and lvmd may not answer yet then.
var firstPassAfter = time.Minute

// Orphan is an LV found orphaned.
type Orphan struct {
	DeviceClass string
	Name        string
	OwnerUID    string
	SizeBytes   int64
	// Since is when a pass first found it orphaned.
	Since time.Time
}

func (o Orphan) String() string { return o.DeviceClass + "/" + o.Name }

// GCResult is what one pass did.
type GCResult struct {
	// Marked are orphans found for the first time: removed on a later pass.
	Marked []Orphan
	// Removed were removed (never in a dry run).
	Removed []Orphan
	// WouldRemove were orphaned on two passes but left in place: dry run, or
	// an operation on the same LV was in flight.
	WouldRemove []Orphan
	// Held were due for removal but left in place: more than Max were due.
	Held []Orphan
}

// OrphanGC is the orphan collector of one agent.
type OrphanGC struct {
	a   *Agent
	cfg GCConfig

	mu    sync.Mutex
	marks map[orphanKey]time.Time
	// explained are the LVs the live list last explained, and when.
	explained map[orphanKey]time.Time
	// reported are the LVs a dry run reported as would_remove last pass.
	reported map[orphanKey]bool

	passes   *prometheus.CounterVec
	removals *prometheus.CounterVec
	orphans  *prometheus.GaugeVec
}

// orphanKey names an orphan with its owner, so that an LV removed and made
// again for another PVC between two passes is not taken for the one marked.
type orphanKey struct {
	target
	uid string
}

// NewOrphanGC makes a collector for a's node; its metrics are registered
// with reg (nil: not registered).
func NewOrphanGC(a *Agent, cfg GCConfig, reg prometheus.Registerer) *OrphanGC {
	if cfg.RecheckAfter <= 0 {
		cfg.RecheckAfter = 10 * cfg.Interval
	}
	g := &OrphanGC{a: a, cfg: cfg, marks: map[orphanKey]time.Time{}, explained: map[orphanKey]time.Time{}, reported: map[orphanKey]bool{},
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_orphan_gc_passes_total",
			Help: "Orphan collector passes by result (ok, error)."}, []string{"result"}),
		removals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_orphan_gc_removals_total",
			Help: "Orphan LVs removed (result=removed) or that failed to be removed (result=error)."}, []string{"result"}),
		orphans: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lvm_agent_orphan_lvs",
			Help: "Orphan LVs after the last pass: marked (found once, removed if still orphaned next pass), would_remove (dry run, or busy) or held (more due than --orphan-gc-max)."}, []string{"phase"}),
	}
	if reg != nil {
		reg.MustRegister(g.passes, g.removals, g.orphans)
	}
	return g
}

// Run makes a pass every Interval until ctx ends.
func (g *OrphanGC) Run(ctx context.Context) {
	klog.InfoS("Orphan LV collector started", "interval", g.cfg.Interval, "dryRun", g.cfg.DryRun, "max", g.cfg.Max)
	t := time.NewTimer(min(g.cfg.Interval, firstPassAfter))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next := g.cfg.Interval
		if _, err := g.Pass(ctx); err != nil && ctx.Err() == nil {
			// Nothing was removed; the marks stay for the next pass.
			next = min(next, firstPassAfter)
			klog.ErrorS(err, "Orphan LV collector pass failed; nothing removed", "next", next)
		}
		t.Reset(next)
	}
}

// candidate is an LV that nothing would keep if no object referred to it:
// ours, and tagged neither protected nor retained.
type candidate struct {
	orphanKey
	lv lvmbackend.Volume
}

// unreferenced classifies an LV against no objects at all: LVOrphan for a
// candidate.
func unreferenced(lv *lvmbackend.Volume) LVRef { return (&References{}).Classify(lv) }

// Pass lists the LVs, marks new orphans and removes (or in a dry run,
// reports) those marked on an earlier pass and still orphaned.
func (g *OrphanGC) Pass(ctx context.Context) (GCResult, error) {
	var res GCResult
	g.mu.Lock()
	defer g.mu.Unlock()
	// LVs first, then references: a PVC whose LV is seen existed before the
	// listing of PVCs, so it cannot be missed by it.
	cands, err := g.candidates(ctx)
	if err == nil {
		var orphaned []candidate
		if orphaned, err = g.orphaned(ctx, cands); err == nil {
			res = g.act(ctx, orphaned)
		}
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	g.passes.WithLabelValues(result).Inc()
	return res, err
}

func (g *OrphanGC) candidates(ctx context.Context) ([]candidate, error) {
	// Listings begun now (ListVolumes): an orphan is an LV this agent did
	// not make or lost track of, which a kept listing may not show yet.
	// Only the classes' names may be older.
	lctx, cancel := context.WithTimeout(ctx, g.a.cfg.OpTimeout)
	defer cancel()
	caps, err := g.a.capacityWithin(lctx)
	if err != nil {
		return nil, fmt.Errorf("list device classes: %w", err)
	}
	var out []candidate
	seen := map[string]bool{} // a thick class of topolvm lists the thin LVs of its VG too
	for _, c := range caps {
		lvs, err := g.a.backend.ListVolumes(lctx, c.DeviceClass)
		if err != nil {
			return nil, fmt.Errorf("list LVs of %s: %w", c.DeviceClass, err)
		}
		for _, lv := range lvs {
			ref := unreferenced(&lv)
			if ref.Use != LVOrphan || seen[lv.Name+"\x00"+ref.OwnerUID] {
				continue
			}
			seen[lv.Name+"\x00"+ref.OwnerUID] = true
			out = append(out, candidate{orphanKey{target{c.DeviceClass, lv.Name}, ref.OwnerUID}, lv})
		}
	}
	return out, nil
}

// kept reports whether refs keep a candidate.
func (c *candidate) kept(refs *References) bool { return refs.Classify(&c.lv).Use != LVOrphan }

// orphaned filters the candidates: the informers' caches first (cheap, and
// in the steady state they explain every LV), then, for what they do not
// explain, a live list from the API server, which alone decides.
func (g *OrphanGC) orphaned(ctx context.Context, cands []candidate) ([]candidate, error) {
	if len(cands) == 0 {
		return nil, nil
	}
	var cached References
	for _, o := range g.a.inf.PVC.GetStore().List() {
		cached.Add(o.(runtime.Object))
	}
	for _, o := range g.a.inf.PV.GetStore().List() {
		cached.Add(o.(runtime.Object))
	}
	now := time.Now()
	explained := map[orphanKey]time.Time{}
	var suspects, out []candidate
	for _, c := range cands {
		switch at, ok := g.explained[c.orphanKey]; {
		case c.kept(&cached):
		case ok && now.Sub(at) < g.cfg.RecheckAfter:
			explained[c.orphanKey] = at // kept without a list
		case g.cfg.DryRun && g.reported[c.orphanKey]:
			out = append(out, c) // reported again without a list
		default:
			suspects = append(suspects, c)
		}
	}
	g.explained = explained
	if len(suspects) == 0 {
		return out, nil
	}
	live, err := g.a.liveRefs(ctx, true)
	if err != nil {
		return nil, err
	}
	for _, c := range suspects {
		if c.kept(live) {
			explained[c.orphanKey] = now
		} else {
			out = append(out, c)
		}
	}
	return out, nil
}

// act keeps the marks of this pass's orphans only (an LV that is gone or
// referenced again loses its mark) and removes those marked before.
func (g *OrphanGC) act(ctx context.Context, orphaned []candidate) GCResult {
	var res GCResult
	now := time.Now()
	marks := map[orphanKey]time.Time{}
	due := 0
	for _, c := range orphaned {
		if _, marked := g.marks[c.orphanKey]; marked {
			due++
		}
	}
	hold := !g.cfg.DryRun && g.cfg.Max > 0 && due > g.cfg.Max
	if hold {
		klog.ErrorS(nil, "Orphan LV collector: more orphans due than it removes in one pass; removing none. So many at once suggests an API server restored from an old backup or an agent pointed at another cluster: check them (lvm-agent volume status), then remove them by hand or raise --orphan-gc-max",
			"due", due, "max", g.cfg.Max)
	}
	for _, c := range orphaned {
		since, marked := g.marks[c.orphanKey]
		o := Orphan{DeviceClass: c.deviceClass, Name: c.name, OwnerUID: c.uid, SizeBytes: c.lv.SizeBytes, Since: since}
		switch {
		case !marked:
			o.Since = now
			marks[c.orphanKey] = now
			res.Marked = append(res.Marked, o)
			klog.InfoS("Orphan LV found: no PVC or PV references it; removed on the next pass if still orphaned",
				"lv", o, "ownerUID", o.OwnerUID, "dryRun", g.cfg.DryRun)
		case g.cfg.DryRun:
			marks[c.orphanKey] = since
			res.WouldRemove = append(res.WouldRemove, o)
			klog.InfoS("Dry run: would remove orphan LV", "lv", o, "ownerUID", o.OwnerUID, "sizeBytes", o.SizeBytes, "orphanedSince", since)
		case hold:
			marks[c.orphanKey] = since
			res.Held = append(res.Held, o)
		default:
			switch err := g.remove(ctx, c); {
			case errors.Is(err, errBusy):
				marks[c.orphanKey] = since
				res.WouldRemove = append(res.WouldRemove, o)
			case err != nil:
				marks[c.orphanKey] = since
				g.removals.WithLabelValues("error").Inc()
				klog.ErrorS(err, "Could not remove orphan LV; will try again next pass", "lv", o)
			default:
				res.Removed = append(res.Removed, o)
				g.removals.WithLabelValues("removed").Inc()
				klog.InfoS("Removed orphan LV", "lv", o, "ownerUID", o.OwnerUID, "sizeBytes", o.SizeBytes, "orphanedSince", since)
			}
		}
	}
	g.marks = marks
	g.reported = map[orphanKey]bool{}
	if g.cfg.DryRun {
		for _, o := range res.WouldRemove {
			g.reported[orphanKey{target{o.DeviceClass, o.Name}, o.OwnerUID}] = true
		}
	}
	g.orphans.WithLabelValues("marked").Set(float64(len(res.Marked)))
	g.orphans.WithLabelValues("would_remove").Set(float64(len(res.WouldRemove)))
	g.orphans.WithLabelValues("held").Set(float64(len(res.Held)))
	slices.SortFunc(res.Removed, func(a, b Orphan) int { return strings.Compare(a.String(), b.String()) })
	return res
}

var errBusy = errors.New("an operation on this LV is in flight")

// remove takes the LV's operation lock (so that it never races the agent's
// own create or delete of it) and removes it only if it is still the LV
// that was marked: same owner, still not protected, still plain.
func (g *OrphanGC) remove(ctx context.Context, c candidate) error {
	if !g.a.acquire(c.target) {
		return errBusy
	}
	defer g.a.release(c.target)
	ctx, cancel := context.WithTimeout(ctx, g.a.cfg.OpTimeout)
	defer cancel()
	lv, err := g.a.backend.GetVolume(ctx, c.deviceClass, c.name)
	if errors.Is(err, lvmbackend.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if ref := unreferenced(lv); ref.Use != LVOrphan || ref.OwnerUID != c.uid {
		return fmt.Errorf("LV %s changed since it was found orphaned (owner %q); left in place", c.target, ref.OwnerUID)
	}
	// Classify keeps an LV whose lv_attr says it is not plain; with a
	// dialect that reports none, the delete path's listing for dependents.
	if out, ok := g.a.plain(ctx, lv, c.target); !ok {
		return fmt.Errorf("orphan LV left in place: %w", out.err)
	}
	return g.a.removeLV(ctx, lv)
}
