package main

import (
	"context"
	"flag"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lvm-agent/lvm-agent/agent"
)

// gcOptions are the orphan LV collector's flags. It is on by default: a
// crash between an lvcreate and its answer leaves an LV whose claim may be
// deleted before the agent is back, and nothing else would ever remove it.
// --orphan-gc-max holds back a pass that finds many orphans at once.
type gcOptions struct {
	interval time.Duration
	dryRun   bool
	max      int
}

// DefaultOrphanGCInterval is --orphan-gc-interval's default.
const DefaultOrphanGCInterval = 5 * time.Minute

func (o *gcOptions) addFlags(fs *flag.FlagSet) {
	fs.DurationVar(&o.interval, "orphan-gc-interval", DefaultOrphanGCInterval, "remove LVs that carry lvm-agent's ownership tag but whose PVC is gone and that no PV references, on the second pass that finds them so, one pass every interval, the first at most a minute after start (0: off). LVs tagged \"protected\" or \"lvm-agent.retained\" or without the tag are never removed")
	fs.BoolVar(&o.dryRun, "orphan-gc-dry-run", false, "only log and count (lvm_agent_orphan_lvs) what the orphan collector would remove")
	fs.IntVar(&o.max, "orphan-gc-max", 10, "the most orphan LVs one pass removes: a pass with more due removes none and logs them (lvm_agent_orphan_lvs{phase=\"held\"}); 0: no bound")
}

// startGC starts the collector in the background when it is on.
func startGC(ctx context.Context, o gcOptions, a *agent.Agent, reg prometheus.Registerer) {
	if o.interval <= 0 {
		return
	}
	go agent.NewOrphanGC(a, agent.GCConfig{Interval: o.interval, DryRun: o.dryRun, Max: o.max}, reg).Run(ctx)
}
