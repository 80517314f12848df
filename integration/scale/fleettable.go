package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// printFleet prints the cluster mode's table, the burst, the restart and
// the headline ratios.
func printFleet(out io.Writer, cfg config, fc fleetConfig, res *fleetResult) {
	fmt.Fprintf(out, "\nlvm-agent cluster: N nodes, each the real agent (a process of its own, its own fake lvmd), against one etcd + kube-apiserver;\n")
	fmt.Fprintf(out, "per row %d create requests spread over the nodes (labelled, %.0f/s; in hybrid rows %.0f%% unlabelled, beside the provisioner's labeller; hybrid-alone: the same without a labeller, the agents watch the unlabelled objects), %d foreign PVCs + %d PVs (%d%% unlabelled) with %.0f foreign writes/s of churn\n",
		fc.transitions, fc.rate, 100*fc.unlabelledRequests, fc.foreign, fc.foreign, int(cfg.unlabelledFrac*100), cfg.churn)
	fmt.Fprintf(out, "agent args %q; host load before %s, after %s\n\n", strings.Join(cfg.agentArgs, " "), res.loadavg[0], res.loadavg[1])
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := []string{"mode", "N", "ready", "start", "start", "peak", "API idle", "API CPU", "API CPU", "API RSS", "watch", "watch", "watch", "watchers", "p50", "p99", "agents RSS", "RSS", "anon", "anon", "agents CPU", "CPU", "failed", "unlabelled"}
	sub := []string{"", "", "all s", "API CPU s", "lists", "lists/s", "CPU s/s", "s", "ms/trans.", "MiB", "events", "ev/trans.", "MB", "", "ms", "ms", "sum MiB", "max MiB", "sum MiB", "max MiB", "sum s", "max s", "", "n p50/p99 ms L S"}
	fmt.Fprintln(w, strings.Join(head, "\t")+"\t")
	fmt.Fprintln(w, strings.Join(sub, "\t")+"\t")
	for _, r := range res.rows {
		c := []string{r.mode, fmt.Sprint(r.nodes), f1(r.ready.Seconds()), f1(r.start.cpuSeconds), fmt.Sprint(r.startLists.n), fmt.Sprint(r.startLists.peakPerSecond),
			f3(r.idle), f2(r.work.cpuSeconds), f2(1000 * r.cpuPerTransition()), f0(r.work.rssMiB), f0(r.work.watchEvents), f1(r.work.watchEvents / float64(max(r.transitions, 1))),
			f1(r.work.watchMB), f0(r.work.watchers), ms(r.p50), ms(r.p99), f0(r.agents.sumRSS), f1(r.agents.maxRSS), f0(r.agents.sumAnon), f1(r.agents.maxAnon), f1(r.agentCPU), f2(r.maxCPU), fmt.Sprint(r.failed), "-"}
		if r.unlabelled > 0 {
			c[len(c)-1] = fmt.Sprintf("%d %s/%s %.0f %.0f", r.unlabelled, ms(r.unlP50), ms(r.unlP99), r.byLabeller, r.bySweep)
		}
		fmt.Fprintln(w, strings.Join(c, "\t")+"\t")
	}
	w.Flush()
	fmt.Fprintln(out, `
ready: all N agents started at once -> every /readyz 200 (hybrid: and every first sweep done); start: the API server's CPU for that, and
  the PVC/PV lists it served meanwhile (audit log; plain and streamed lists), most in one second.
API idle: kube-apiserver's utime+stime per second (/proc) over the idle seconds before the transitions (fleet up, foreign churn on).
API CPU: its utime+stime from the first request written to the last answer seen + 1 s; per transition: that less the idle rate over
  the same time, per create answered (the rows' windows differ: one node queues what 300 do at once); API RSS: its VmRSS then. watch: apiserver_watch_events_total and apiserver_watch_events_sizes (bytes) over the same window,
  all kinds; watchers: watches open at its end (apiserver_longrunning_requests{verb=WATCH*}: 1.37 has no apiserver_registered_watchers).
  p50/p99: per volume, request written -> answer seen by the bench's watch.
agents: VmRSS at the end (sum, largest; the binary's pages, shared, count in each), anon: RssAnon (what each agent adds),
  utime+stime during the window (sum, largest).
unlabelled (hybrid): the row's requests written without the node label, all answered (else the row fails), their p50/p99 written -> answer
  seen; L: labelled by the labeller (since its start), S: found by the agents' sweeps (lvm_agent_unlabelled_requests_total).`)
	for _, s := range res.stopped {
		fmt.Fprintf(out, "stopped: %s\n", s)
	}
	if len(res.bursts) > 0 {
		fmt.Fprintln(out, "\nCluster-wide burst: every node gets its creates at once, the fake lvmd at its latency per operation (serialized per VG, as LVM):")
		w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(w, "mode\tN\tcreates\tlvmd\tfloor s\ttotal s\tx floor\tsleeps took\tp50 s\tp99 s\tfailed\tAPI CPU s\twatch events\tagents CPU s\t")
		for _, b := range res.bursts {
			fmt.Fprintf(w, "%s\t%d\t%d\t%v\t%s\t%s\t%.3f\t%v\t%s\t%s\t%d\t%s\t%s\t%s\t\n", b.mode, b.nodes, b.n, b.latency, secs(b.floor()), secs(b.total), b.ratio(),
				b.slept, secs(b.p50), secs(b.p99), b.failed, f1(b.api.cpuSeconds), f0(b.api.watchEvents), f1(b.agentCPU))
		}
		w.Flush()
		fmt.Fprintln(out, "floor: one node's creates x lvmd latency; total: first request written -> last answer seen; sleeps took: the mean time a sleep of the lvmd latency took in the bench process meanwhile.")
		for _, b := range res.bursts {
			fmt.Fprintf(out, "Where the %s burst's time went:\n", b.mode)
			b.why.lines(func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }, "  ")
		}
	}
	for _, r := range res.restarts {
		fmt.Fprintf(out, "\nAPI server restart (SIGTERM, down %v, ready again after %v) with N=%d agents in %s mode:\n", fc.restartDown, secs(r.back)+"s", r.nodes, r.mode)
		fmt.Fprintf(out, "  open requests answered: %d/%d; written after the restart, answered: %d/%d; agents crashed: %d\n", r.answered, r.open, r.after, r.nodes, r.crashed)
		fmt.Fprintf(out, "  re-lists from the stop on: %d (%d streamed), over %s s, peak %d started in one second, peak %d plain lists at once\n",
			r.lists.n, r.lists.streamed, secs(r.lists.span), r.lists.peakPerSecond, r.lists.peakConcurrent)
		fmt.Fprintf(out, "  (the fleet's start: %d lists over %s s, peak %d/s, %d plain at once)\n",
			r.listsStart.n, secs(r.listsStart.span), r.listsStart.peakPerSecond, r.listsStart.peakConcurrent)
	}
	fmt.Fprintln(out, "\nHeadline:")
	for _, h := range headlines(res.rows) {
		fmt.Fprintln(out, "  "+h)
	}
	for _, b := range res.bursts {
		goal := ""
		if b.mode == "labelled" {
			goal = " (goal <= 1.10)"
		}
		fmt.Fprintf(out, "  burst, %s, N=%d: %.3f x one node's floor%s\n", b.mode, b.nodes, b.ratio(), goal)
	}
}

// headlines compares, per mode, the API server's CPU per transition and
// its RSS at the largest N with N=1 (the smallest N run).
func headlines(rows []fleetRow) []string {
	var out []string
	var modes []string
	lo, hi := map[string]fleetRow{}, map[string]fleetRow{}
	for _, r := range rows {
		l, ok := lo[r.mode]
		if !ok {
			modes = append(modes, r.mode)
		}
		if !ok || r.nodes < l.nodes {
			lo[r.mode] = r
		}
		if h, ok := hi[r.mode]; !ok || r.nodes > h.nodes {
			hi[r.mode] = r
		}
	}
	for _, m := range modes {
		l, h := lo[m], hi[m]
		if l.nodes == h.nodes {
			continue
		}
		goal := " (goal <= 1.2)"
		if m == "all" {
			goal = " (the original design)"
		}
		out = append(out, fmt.Sprintf("%s: API server CPU per transition at N=%d / N=%d: %.2f / %.2f ms = %.2f%s; gross (idle not subtracted) %.2f / %.2f ms = %.2f; RSS %.0f / %.0f MiB = %.2f; idle CPU %.3f / %.3f s/s",
			m, h.nodes, l.nodes, 1000*h.cpuPerTransition(), 1000*l.cpuPerTransition(), h.cpuPerTransition()/l.cpuPerTransition(), goal,
			1000*h.grossPerTransition(), 1000*l.grossPerTransition(), h.grossPerTransition()/l.grossPerTransition(),
			h.work.rssMiB, l.work.rssMiB, h.work.rssMiB/l.work.rssMiB, h.idle, l.idle))
	}
	return out
}
