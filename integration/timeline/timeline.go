// Package timeline is make bench-peers' timeline of every hop, for each
// stack, from what the bench kept (scripts/guest/peers.sh): the watch lines,
// the LVs gone, the Pods' "grown" lines, the components' logs (stamped by
// containerd) and kubelet's. It gives, for create, delete and grow, the
// median time of each hop since the operation began (one claim at a time,
// every round), prints them as the bench's report does, and draws them as an
// SVG: one bar per hop, lvm-agent's above TopoLVM's. The same code runs in
// the guest (`lvm-stories timeline`) and on the host.
//
// Hops (all on the guest's clock; a hop a stack does not have is left out):
//
//	create  from the PVC seen: node selected (the scheduler's annotation);
//	        the request (lvm-agent's "creating"; TopoLVM's LogicalVolume
//	        made by its CreateVolume); the agent saw it, started, lvmd's
//	        CreateLV called and returned (the agent's done line and its
//	        steps); lvmd's LV made (TopoLVM: its lvmd's "created a new LV");
//	        the answer ("created"; the LogicalVolume's volumeID); PV made;
//	        claim Bound; Pod bound to the node; kubelet's first MountDevice
//	        or SetUp of the volume (its log); Pod Running
//	delete  from the PVC and Pod marked deleted: PV Released; the request
//	        ("deleting"; the LogicalVolume marked deleted); the agent and
//	        lvmd's RemoveLV as above (TopoLVM: its lvmd's "removed a LV");
//	        the answer ("deleted"); PV marked deleted; the LV's device gone
//	grow    from the claim's request raised: the resizer's allocated size;
//	        the request ("expanding"; the LogicalVolume's size raised); the
//	        agent and lvmd's ResizeLV; the answer ("expanded"; the
//	        LogicalVolume's current size raised); PV capacity raised;
//	        NodeResizePending; the Pod nudged (either stack's annotation);
//	        the claim's capacity (kubelet's resize done); the Pod's "grown"
//
// A stack's bar for a hop starts where the previous hop that stack has ends:
// a hop it lacks has no median (nil), never a zero.
package timeline

import "slices"

// Stack is one of the two stacks the bench compares.
type Stack int

const (
	LVMAgent Stack = iota
	TopoLVM
)

// Stacks in the order of the report's columns and of each row's bars.
var Stacks = []Stack{LVMAgent, TopoLVM}

func (s Stack) String() string { return [...]string{"lvm-agent", "TopoLVM"}[s] }

// claimPrefix: the bench names each stack's claims STACK-rR-I (one at a
// time) and STACK-rR-gG (grown).
func (s Stack) claimPrefix() string { return [...]string{"lvm-agent-", "topolvm-"}[s] }

// Op is one operation's timeline: its hops in order.
type Op struct {
	Name  string // create, delete, grow
	Title string
	start string // the event the times count from
	Hops  []Hop
}

// Hop is one row of an operation's timeline: the event that ends it, for
// each stack ("pvc|pod|pv|lv|vid EVENT", resolved per claim; "" where the
// stack has no such hop).
type Hop struct {
	Label string
	event [2]string
}

func hop(label, lvmAgent, topolvm string) Hop {
	return Hop{Label: label, event: [2]string{lvmAgent, topolvm}}
}

// Ops: the three operations of the report, in its order.
var Ops = []Op{
	{Name: "create", Title: "Create: PVC seen -> Pod Running", start: "pvc seen", Hops: []Hop{
		hop("node selected (scheduler)", "pvc selected", "pvc selected"),
		hop("request (creating / LogicalVolume made)", "pvc request", "lv made"),
		hop("agent saw the request", "pvc agentsaw", ""),
		hop("agent started", "pvc agentstart", ""),
		hop("lvmd CreateLV called", "pvc lvmdstart", ""),
		hop("lvmd CreateLV returned / LV made", "pvc lvmdend", "vid made"),
		hop("answer (created / volumeID)", "pvc answer", "lv vid"),
		hop("PV made", "pv made", "pv made"),
		hop("claim Bound", "pvc bound", "pvc bound"),
		hop("Pod bound to the node", "pod node", "pod node"),
		hop("volume set up (kubelet)", "pod mounted", "pod mounted"),
		hop("Pod Running", "pod running", "pod running"),
	}},
	{Name: "delete", Title: "Delete: PVC and Pod deleted -> LV gone", start: "pvc deleted", Hops: []Hop{
		hop("PV Released", "pv released", "pv released"),
		hop("request (deleting / LogicalVolume deleted)", "pv request", "lv deleted"),
		hop("agent saw the request", "pv agentsaw", ""),
		hop("agent started", "pv agentstart", ""),
		hop("lvmd RemoveLV called", "pv lvmdstart", ""),
		hop("lvmd RemoveLV returned / LV removed", "pv lvmdend", "vid gone"),
		hop("answer (deleted)", "pv answer", ""),
		hop("PV deleted", "pv deleted", "pv deleted"),
		hop("LV's device gone", "pvc gone", "pvc gone"),
	}},
	{Name: "grow", Title: "Grow: request raised -> new size seen in the Pod", start: "pvc raised", Hops: []Hop{
		hop("resizer took it (allocatedResources)", "pvc alloc", "pvc alloc"),
		hop("request (expanding / LogicalVolume size)", "pv growrequest", "lv sizeraised"),
		hop("agent saw the request", "pv growagentsaw", ""),
		hop("agent started", "pv growagentstart", ""),
		hop("lvmd ResizeLV called", "pv growlvmdstart", ""),
		hop("lvmd ResizeLV returned", "pv growlvmdend", ""),
		hop("answer (expanded / currentSize)", "pv growanswer", "lv curraised"),
		hop("PV capacity raised", "pv cap", "pv cap"),
		hop("NodeResizePending", "pvc nodepending", "pvc nodepending"),
		hop("Pod nudged", "pod nudged", "pod nudged"),
		hop("claim capacity (kubelet's resize)", "pvc capdone", "pvc capdone"),
		hop("new size seen in the Pod", "pvc grown", "pvc grown"),
	}},
}

// Median is one hop's median time for one stack.
type Median struct {
	Seconds float64 // since the operation began
	Claims  int     // how many claims showed the hop; 0: not known (a report read without its counts)
}

// Result is a run's timeline: each hop's median per stack, and lvm-agent's
// own share of PVC -> Bound.
type Result struct {
	// Medians[op][i][stack] is the median of Ops' op's hop i, nil where the
	// stack has no such hop or no claim showed it. Each op has one entry per
	// hop of its Op.
	Medians map[string][][2]*Median
	Share   *Share // nil when no claim showed every hop the share needs
}

// Share is lvm-agent's own share of PVC -> Bound: the provisioner's hops
// (selected -> request; answer -> PV made) and the agent's (request -> lvmd
// called; lvmd returned -> answer), over the whole, its median over claims.
type Share struct {
	Claims int
	Median float64 // a fraction of the whole
}

// ShareGoal: the goal of lvm-agent's own share.
const ShareGoal = 0.2

func newResult() *Result {
	r := &Result{Medians: map[string][][2]*Median{}}
	for _, op := range Ops {
		r.Medians[op.Name] = make([][2]*Median, len(op.Hops))
	}
	return r
}

// median of xs (sorted in place); xs is not empty.
func median(xs []float64) float64 {
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}
