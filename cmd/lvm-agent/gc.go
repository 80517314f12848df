package main

import (
	"context"
	"flag"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lvm-agent/lvm-agent/agent"
)

// gcOptions are the orphan LV collector's flags. It is opt-in: it removes
// LVs, and an operator should first see (--orphan-gc-dry-run) what it would
// remove on their nodes.
type gcOptions struct {
	interval time.Duration
	dryRun   bool
}

func (o *gcOptions) addFlags(fs *flag.FlagSet) {
	fs.DurationVar(&o.interval, "orphan-gc-interval", 0, "remove LVs that carry lvm-agent's ownership tag but whose PVC is gone and that no PV references, on the second pass that finds them so, one pass every interval (0: off). LVs tagged \"protected\" or without the tag are never removed")
	fs.BoolVar(&o.dryRun, "orphan-gc-dry-run", false, "with --orphan-gc-interval: only log and count (lvm_agent_orphan_lvs) what would be removed")
}

// startGC starts the collector in the background when it is on.
func startGC(ctx context.Context, o gcOptions, a *agent.Agent, reg prometheus.Registerer) {
	if o.interval <= 0 {
		return
	}
	go agent.NewOrphanGC(a, agent.GCConfig{Interval: o.interval, DryRun: o.dryRun}, reg).Run(ctx)
}
