package main

import (
	"context"
	"fmt"
	"time"

	"github.com/lvm-agent/lvm-agent/integration/harness"
)

// row is one agent run: a watch mode against F foreign objects.
type row struct {
	mode    string
	foreign int
	variant bool // started for its sync cost only

	ready                    time.Duration
	sync, end                procStats
	syncObjs, syncForeign    float64 // PVCs/PVs the informers and sweeps decoded until ready (+1 s)
	syncMB                   float64 // bytes of PVC/PV lists and watches until then
	rowObjs, rowForeign      float64 // from then to the end of the row
	rowMB                    float64
	rowSeconds               float64
	bursts                   []burstResult
	seq                      sequentialResult
	seqAgentP50, seqAgentP99 time.Duration
	unlabelled               int           // unlabelled requests written
	unlabelledMax            time.Duration // the slowest answer to one (0: not all answered)
	unlabelledAnswered       int
	transitions              float64 // answers observed
	pvcWrites, pvcConflicts  float64 // the agent's patches of PVCs (409s counted apart)
	eventWrites, otherWrite  float64
	sweeps                   float64
}

const unlabelledProbe = 5

func runRow(ctx context.Context, cl *cluster, tb harness.TB, bin, mode string, foreign int, logf func(string, ...any)) (*row, error) {
	r := &row{mode: mode, foreign: foreign}
	obs, err := cl.observe(ctx)
	if err != nil {
		return nil, err
	}
	defer obs.stop()
	id := fmt.Sprintf("%s-%d", mode[:3], foreign)
	var names []string
	defer func() {
		if err := cl.deletePVCs(context.Background(), burstNS, names); err != nil {
			logf("cleanup: %v", err)
		}
	}()

	if mode == "hybrid" {
		lab, err := cl.startLabeller(ctx)
		if err != nil {
			return nil, err
		}
		defer lab.stop()
	}
	a := startAgent(tb, bin, cl.cp.Kubeconfig, mode, cl.cfg)
	defer func() {
		a.stop()
		if cl.cfg.verbose {
			logf("agent output:\n%s", a.proc.Output())
		}
	}()
	if r.ready, err = a.waitReady(ctx, 10*time.Minute); err != nil {
		return nil, err
	}
	if hybrid(mode) {
		// Readiness does not wait for the first list of the unlabelled objects; the figures do.
		if err := a.waitMetric(ctx, "lvm_agent_sweeps_total", 1, 10*time.Minute); err != nil {
			return nil, err
		}
	}
	m0, err := r.sample(a)
	if err != nil {
		return nil, err
	}
	logf("  ready in %v, RSS %.1f MiB (peak %.1f), %.0f objects received (%.0f foreign), %.1f MB",
		r.ready.Round(time.Millisecond), r.sync.rssMiB, r.sync.hwmMiB, r.syncObjs, r.syncForeign, r.syncMB)
	rowStart := time.Now()

	// Requests of a provisioner that does not label: the labelled mode never
	// sees them (by design), the others do.
	unl, err := cl.prepare(ctx, "u-"+id, unlabelledProbe)
	names = append(names, unl...)
	if err != nil {
		return nil, err
	}
	unlWritten := time.Now()
	for _, n := range unl {
		if err := cl.request(ctx, n, false); err != nil {
			return nil, err
		}
	}
	r.unlabelled = len(unl)

	var seq []string
	before, err := a.scrape()
	if err != nil {
		return nil, err
	}
	r.seq, seq, err = cl.sequential(ctx, obs, "s-"+id, cl.cfg.sequential)
	names = append(names, seq...)
	if err != nil {
		return nil, err
	}
	if r.seqAgentP50, r.seqAgentP99, err = agentTime(a, before); err != nil {
		return nil, err
	}
	logf("  sequential: %d creates, p50 %v, p99 %v; the agent's part p50 %v, p99 %v; one API write p50 %v, p99 %v",
		cl.cfg.sequential, r.seq.p50, r.seq.p99, r.seqAgentP50, r.seqAgentP99, r.seq.writeP50, r.seq.writeP99)
	if err := clearLVs(a); err != nil {
		return nil, err
	}
	for _, lat := range cl.cfg.latencies {
		before, err := a.scrape()
		if err != nil {
			return nil, err
		}
		b, bn, err := cl.burst(ctx, a, obs, fmt.Sprintf("b%s-%s", lat, id), cl.cfg.burst, lat)
		names = append(names, bn...)
		if err != nil {
			return nil, err
		}
		if b.agentP50, b.agentP99, err = agentTime(a, before); err != nil {
			return nil, err
		}
		logf("  burst of %d with lvmd %v: %v (%.3f x the lvmd floor, %.3f x the slept floor: sleeps took %v), p50 %v, p99 %v (the agent's part p50 %v, p99 %v), %d failed",
			b.n, lat, b.total.Round(time.Millisecond), ratio(b), sleptRatio(b), b.slept, b.p50, b.p99, b.agentP50, b.agentP99, b.failed)
		r.bursts = append(r.bursts, b)
		if err := clearLVs(a); err != nil {
			return nil, err
		}
		// Their deletion is part of the row (the agent sees it), not of the next burst.
		if err := cl.deletePVCs(ctx, burstNS, bn); err != nil {
			return nil, err
		}
	}

	if mode != "labelled" {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		for _, n := range unl {
			t, err := obs.wait(wctx, n)
			if err != nil {
				break
			}
			r.unlabelledAnswered++
			r.unlabelledMax = max(r.unlabelledMax, t.Sub(unlWritten))
		}
		cancel()
	} else {
		// Written an entire row ago: show that they are still unanswered.
		for _, n := range unl {
			if _, ok := obs.answer(n); ok {
				r.unlabelledAnswered++
			}
		}
	}

	time.Sleep(500 * time.Millisecond) // room for a wrong second write to show
	if r.end, err = a.stats(); err != nil {
		return nil, err
	}
	m1, err := a.scrape()
	if err != nil {
		return nil, err
	}
	r.rowSeconds = time.Since(rowStart).Seconds()
	d := m1.sub(m0)
	r.rowObjs, r.rowForeign, r.rowMB = received(d)
	r.transitions = float64(obs.count())
	r.pvcWrites = m1.sum("lvm_agent_kube_requests_total", `resource="persistentvolumeclaims"`, `verb="patch"`)
	r.pvcConflicts = m1.sum("lvm_agent_kube_requests_total", `resource="persistentvolumeclaims"`, `verb="patch"`, `code="409"`)
	r.eventWrites = m1.sum("lvm_agent_kube_requests_total", `resource="events"`, `verb="create"`) +
		m1.sum("lvm_agent_kube_requests_total", `resource="events"`, `verb="patch"`)
	r.otherWrite = writes(m1) - r.pvcWrites - r.eventWrites
	r.sweeps = m1.sum("lvm_agent_sweeps_total")
	logf("  row: %.0f objects received (%.0f foreign), %.1f MB; %.0f answers, %.0f PVC writes (%.0f conflicts), %.0f events, %.0f other writes; RSS %.1f MiB, CPU %.1f s",
		r.rowObjs, r.rowForeign, r.rowMB, r.transitions, r.pvcWrites, r.pvcConflicts, r.eventWrites, r.otherWrite, r.end.rssMiB, r.end.cpuSeconds)
	return r, nil
}

// syncOnly starts an agent and measures its start only: a variant's row.
func syncOnly(ctx context.Context, cl *cluster, tb harness.TB, bin, mode string, cfg config) (*row, error) {
	r := &row{mode: mode, foreign: cl.have, variant: true}
	a := startAgent(tb, bin, cl.cp.Kubeconfig, mode, cfg)
	defer a.stop()
	var err error
	if r.ready, err = a.waitReady(ctx, 10*time.Minute); err != nil {
		return nil, err
	}
	if _, err := r.sample(a); err != nil {
		return nil, err
	}
	return r, nil
}

// sample takes the figures of the agent's start into r, a second after it
// is ready (the garbage of the initial lists settled), and returns the
// scrape they came from.
func (r *row) sample(a *agentProc) (metrics, error) {
	time.Sleep(time.Second)
	var err error
	if r.sync, err = a.stats(); err != nil {
		return nil, err
	}
	m, err := a.scrape()
	if err != nil {
		return nil, err
	}
	r.syncObjs, r.syncForeign, r.syncMB = received(m)
	return m, nil
}

// agentTime is the p50 and p99 of the agent's own time per request since
// the scrape before.
func agentTime(a *agentProc, before metrics) (p50, p99 time.Duration, err error) {
	after, err := a.scrape()
	if err != nil {
		return 0, 0, err
	}
	d := after.sub(before)
	const h, pvc = "lvm_agent_request_answer_seconds", `resource="persistentvolumeclaims"`
	return d.quantile(h, 0.5, pvc), d.quantile(h, 0.99, pvc), nil
}

// received sums the PVCs and PVs decoded (all, foreign) and the MB of
// their lists and watches.
func received(m metrics) (objs, foreign, mb float64) {
	objs = m.sum("lvm_agent_kube_objects_received_total")
	foreign = m.sum("lvm_agent_kube_objects_received_total", `foreign="true"`)
	for _, r := range []string{`resource="persistentvolumeclaims"`, `resource="persistentvolumes"`} {
		mb += m.sum("lvm_agent_kube_received_bytes_total", r, `verb="list"`) + m.sum("lvm_agent_kube_received_bytes_total", r, `verb="watch"`)
	}
	return objs, foreign, mb / 1e6
}

// writes is every request with a writing verb.
func writes(m metrics) float64 {
	n := 0.0
	for _, v := range []string{"create", "update", "patch", "delete", "deletecollection"} {
		n += m.sum("lvm_agent_kube_requests_total", `verb="`+v+`"`)
	}
	return n
}

func sleptRatio(b burstResult) float64 {
	if b.slept == 0 {
		return 0
	}
	return b.total.Seconds() / (float64(b.n) * b.slept.Seconds())
}

func ratio(b burstResult) float64 {
	if b.latency == 0 {
		return 0
	}
	return b.total.Seconds() / (float64(b.n) * b.latency.Seconds())
}
