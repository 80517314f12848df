package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// printTable prints every row side by side, then the goals' figures.
func printTable(out io.Writer, cfg config, rows []*row, lvmd lvmdCosts) {
	fmt.Fprintf(out, "\nlvm-agent scale: F foreign PVCs + F foreign PVs (%d%% unlabelled, 1 in 10 with an open request for another node, %.0f foreign writes/s of churn);\n",
		int(cfg.unlabelledFrac*100), cfg.churn)
	fmt.Fprintf(out, "bursts of %d labelled creates for the agent's node, written by %d writers; sweep interval %v; agent args %q\n",
		cfg.burst, cfg.createWorkers, cfg.sweepInterval, strings.Join(cfg.agentArgs, " "))
	fmt.Fprintf(out, "lvmd's part of a create at 0 ms (GetLVList + CreateLV over the socket, up to %d LVs, measured from the bench): p50 %s ms, p99 %s ms;\n",
		cfg.burst, ms(lvmd.p50), ms(lvmd.p99))
	fmt.Fprintf(out, "the fake's GetLVList (the agent's look before each create) holds the VG lock %s ms in all over %d creates (%.1f%% of a %d x 20 ms floor)\n\n",
		ms(lvmd.listLocked), cfg.burst, 100*lvmd.listLocked.Seconds()/(float64(cfg.burst)*0.020), cfg.burst)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := []string{"mode", "F", "ready", "RSS", "peak", "CPU", "CPU", "recv@sync", "foreign", "MB", "recv/row", "foreign", "MB", "1-by-1", "p99", "agent", "p99", "write", "p99"}
	sub := []string{"", "", "s", "MiB", "MiB", "sync s", "row s", "objs", "objs", "", "objs", "objs", "", "p50 ms", "ms", "p50 ms", "ms", "p50 ms", "ms"}
	for _, l := range cfg.latencies {
		head = append(head, "burst "+short(l), "x floor", "x slept", "p50", "p99", "agent", "p99")
		sub = append(sub, "total s", "", "", "ms", "ms", "p50 ms", "ms")
	}
	head = append(head, "PVC writes", "409", "events", "other", "unlabelled")
	sub = append(sub, "/answer", "", "/answer", "writes", "answered")
	fmt.Fprintln(w, strings.Join(head, "\t")+"\t")
	fmt.Fprintln(w, strings.Join(sub, "\t")+"\t")
	for _, r := range rows {
		if r.variant {
			continue
		}
		c := []string{r.mode, fmt.Sprint(r.foreign), secs(r.ready), f1(r.sync.rssMiB), f1(r.sync.hwmMiB), f2(r.sync.cpuSeconds),
			f2(r.end.cpuSeconds - r.sync.cpuSeconds), f0(r.syncObjs), f0(r.syncForeign), f1(r.syncMB), f0(r.rowObjs), f0(r.rowForeign), f1(r.rowMB),
			ms(r.seq.p50), ms(r.seq.p99), ms(r.seqAgentP50), ms(r.seqAgentP99), ms(r.seq.writeP50), ms(r.seq.writeP99)}
		for _, b := range r.bursts {
			x, xs := "-", "-"
			if b.latency > 0 {
				x, xs = fmt.Sprintf("%.3f", ratio(b)), fmt.Sprintf("%.3f", sleptRatio(b))
			}
			c = append(c, secs(b.total), x, xs, ms(b.p50), ms(b.p99), ms(b.agentP50), ms(b.agentP99))
		}
		unl := fmt.Sprintf("%d/%d", r.unlabelledAnswered, r.unlabelled)
		if r.unlabelledAnswered == r.unlabelled && r.unlabelled > 0 {
			unl += " in " + secs(r.unlabelledMax) + "s"
		}
		c = append(c, fmt.Sprintf("%.3f", r.pvcWrites/max(r.transitions, 1)), f0(r.pvcConflicts),
			fmt.Sprintf("%.3f", r.eventWrites/max(r.transitions, 1)), f0(r.otherWrite), unl)
		fmt.Fprintln(w, strings.Join(c, "\t")+"\t")
	}
	w.Flush()
	fmt.Fprintln(out, `
ready: process start to /readyz 200. RSS: VmRSS 1 s after ready (hybrid: after its first list of the unlabelled objects); peak: VmHWM
  then. CPU: utime+stime until then / during the rest of the row.
recv: PVCs and PVs the agent decoded (its informers and sweeps, lvm_agent_kube_objects_received_total), "foreign" = of other nodes,
  and MB of their list and watch bodies (lvm_agent_kube_received_bytes_total); @sync = until the RSS sample, /row = the rest of the row.
1-by-1: creates written one at a time, each when the previous was answered, lvmd 0 ms: request written -> "created" seen by a watch
  (the agent plus two API writes and two watch deliveries). agent: the agent's own part per request, from the request's arrival
  to its answer sent: queueing and lvmd calls (lvm_agent_request_answer_seconds, interpolated in 25% buckets);
  write: the bench's own request write (the same kind of merge patch as the agent's answer): what one API write costs here.
  Bursts: all requests written at once; total = first write to last answer; x floor = total / (n x lvmd latency), the fake
  serializing per VG like LVM; x slept = total / (n x the mean time a sleep of that latency took in the bench process during
  the burst: a busy host wakes sleepers late, and the fake's latency is such a sleep); p50/p99 per volume, written -> seen;
  agent p50/p99 as above (queueing for the VG included).
PVC writes/answer: the agent's PVC patches / answers seen (1.000 = one write per transition); 409: conflicts among them;
  events: Event writes per answer; other: the remaining writes of the row (Node capacity annotation, ...).
unlabelled: requests written without the node label at the start of the row, answered / written (slowest; hybrid: the provisioner's labeller runs beside the agent).`)
	goals(out, rows, lvmd)
}

func goals(out io.Writer, rows []*row, lvmd lvmdCosts) {
	fmt.Fprintln(out, "\nGoals:")
	var l0, lmax *row
	for _, r := range rows {
		if r.mode != "labelled" || r.variant {
			continue
		}
		if l0 == nil || r.foreign < l0.foreign {
			l0 = r
		}
		if lmax == nil || r.foreign > lmax.foreign {
			lmax = r
		}
		fmt.Fprintf(out, "  labelled, F=%d: foreign objects received: %.0f (goal 0)\n", r.foreign, r.syncForeign+r.rowForeign)
	}
	if l0 != nil && lmax != nil && l0 != lmax {
		fmt.Fprintf(out, "  labelled: RSS at F=%d / RSS at F=%d: %.1f / %.1f MiB = %.3f (goal <= 1.1)\n", lmax.foreign, l0.foreign,
			lmax.sync.rssMiB, l0.sync.rssMiB, lmax.sync.rssMiB/l0.sync.rssMiB)
	}
	for _, r := range rows {
		if r.variant {
			continue
		}
		line := fmt.Sprintf("  %s, F=%d: agent per volume, lvmd 0 ms, 1-by-1: p50 %s ms (goal < 5; lvmd's part %s; an API write %s), p99 %s ms (goal < 50; lvmd %s, write %s)",
			r.mode, r.foreign, ms(r.seqAgentP50), ms(lvmd.p50), ms(r.seq.writeP50), ms(r.seqAgentP99), ms(lvmd.p99), ms(r.seq.writeP99))
		for _, b := range r.bursts {
			if b.latency > 0 {
				line += fmt.Sprintf("; burst %s: %.3f x floor (goal <= 1.05), %.3f x the slept floor", short(b.latency), ratio(b), sleptRatio(b))
			}
		}
		line += fmt.Sprintf("; PVC writes per transition %.3f (goal 1)", r.pvcWrites/max(r.transitions, 1))
		fmt.Fprintln(out, line)
	}
}

func short(d time.Duration) string {
	if d == 0 {
		return "0ms"
	}
	return d.String()
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2f", d.Seconds()) }
func ms(d time.Duration) string   { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }
func f0(v float64) string         { return fmt.Sprintf("%.0f", v) }
func f1(v float64) string         { return fmt.Sprintf("%.1f", v) }
func f2(v float64) string         { return fmt.Sprintf("%.2f", v) }
func f3(v float64) string         { return fmt.Sprintf("%.3f", v) }

// printVariants prints the variants' start beside the rows of their mode at
// the same F (-sync-variants).
func printVariants(out io.Writer, cfg config, rows []*row) {
	if len(cfg.variants) == 0 {
		return
	}
	fmt.Fprintln(out, "\nStart only, at the largest F (-sync-variants):")
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "agent\tF\tready s\tRSS MiB\tpeak MiB\tCPU s\tobjs\tforeign\tMB\t")
	byMode := map[string]bool{}
	for _, v := range cfg.variants {
		byMode[v.mode] = true
	}
	last := 0
	for _, r := range rows {
		last = max(last, r.foreign)
	}
	for _, r := range rows {
		if r.foreign != last || (!r.variant && !byMode[r.mode]) {
			continue
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.mode, r.foreign, secs(r.ready), f1(r.sync.rssMiB), f1(r.sync.hwmMiB),
			f2(r.sync.cpuSeconds), f0(r.syncObjs), f0(r.syncForeign), f1(r.syncMB))
	}
	w.Flush()
}
