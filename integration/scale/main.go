// Command scale measures what the lvm-agent costs as a cluster grows: the
// real agent binary, as a child process, against a real etcd +
// kube-apiserver (integration/harness) holding F foreign PVCs and F foreign
// PVs (other nodes' objects, some with open requests, under constant
// churn), with the fake lvmd in this process on a unix socket. For each
// number of foreign objects and each watch mode it starts a fresh agent and
// prints one row: memory, CPU, what the agent received, start-to-ready time,
// and bursts of creates for its node. The foreign objects are made once,
// growing between the rows; only the agent restarts. With -leader-claims
// it measures the provisioner's leader instead (leader.go): its memory
// with that many bound claims.
//
//	KUBEBUILDER_ASSETS=$(scripts/kube-assets.sh) go run ./integration/scale [flags]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/lvm-agent/lvm-agent/integration/harness"
)

type config struct {
	foreign        []int
	modes          []string
	burst          int
	latencies      []time.Duration
	sequential     int
	unlabelledFrac float64
	churn          float64
	createWorkers  int
	sweepInterval  time.Duration
	agentArgs      []string
	agentBin       string
	verbose        bool
	// variants are extra agents started at the largest F, after the rows,
	// for their start only: tuning evidence.
	variants []variant
}

// variant is an agent started for its sync cost only.
type variant struct {
	name, bin, mode string
	args            []string
}

func main() {
	cfg := config{}
	foreign := flag.String("foreign", "0,10000,50000", "numbers of foreign PVCs (and as many PVs), comma-separated, ascending")
	modes := flag.String("modes", "labelled,hybrid,all", "watch modes, comma-separated")
	latencies := flag.String("lvmd-latency", "0,20ms", "fake lvmd latency of each burst, comma-separated")
	flag.IntVar(&cfg.burst, "burst", 1000, "creates per burst")
	flag.IntVar(&cfg.sequential, "sequential", 100, "creates one at a time (lvmd 0 ms) to measure per-request overhead without queueing")
	flag.Float64Var(&cfg.unlabelledFrac, "unlabelled", 0.25, "fraction of foreign objects without the volume.node label (written by a provisioner that does not label, or another driver)")
	flag.Float64Var(&cfg.churn, "churn", 20, "foreign writes per second during the rows")
	flag.IntVar(&cfg.createWorkers, "create-workers", 32, "parallel writers for the foreign objects")
	flag.DurationVar(&cfg.sweepInterval, "sweep-interval", 30*time.Minute, "the agent's --sweep-interval (hybrid mode's full re-list)")
	extra := flag.String("agent-args", "", "extra agent flags, space-separated")
	flag.StringVar(&cfg.agentBin, "agent-bin", "", "agent binary (default: $LVM_AGENT_BIN, or built from this module)")
	flag.BoolVar(&cfg.verbose, "v", false, "print the agent's output of each row")
	variants := flag.String("sync-variants", "", `after the rows, at the largest F, start these agents for their sync cost only, ";"-separated `+
		`"name:mode:binary:args" (binary empty: the agent under test), e.g. "json:all::--kube-api-content-type=application/json"`)
	var fc fleetConfig
	nodes := flag.String("nodes", "", "cluster mode (make bench-cluster): numbers of simulated nodes, each a real agent with its own fake lvmd, comma-separated, ascending; the foreign/burst flags above then do not apply")
	flag.IntVar(&fc.foreign, "fleet-foreign", 1000, "cluster mode: foreign PVCs (and PVs) of other nodes")
	flag.IntVar(&fc.transitions, "transitions", 2000, "cluster mode: create requests per row, spread over the nodes")
	flag.Float64Var(&fc.rate, "rate", 50, "cluster mode: their write rate per second")
	flag.DurationVar(&fc.idle, "idle", 10*time.Second, "cluster mode: how long the API server's idle cost is sampled before the transitions")
	flag.IntVar(&fc.burstNodes, "burst-nodes", 100, "cluster mode: at this N, the cluster-wide burst (0: none)")
	flag.IntVar(&fc.burstPerNode, "burst-per-node", 100, "cluster mode: creates per node in the burst")
	flag.DurationVar(&fc.burstLatency, "burst-lvmd-latency", time.Second, "cluster mode: the fake lvmd's latency per operation in the burst")
	flag.StringVar(&fc.profileDir, "apiserver-profile", "", "cluster mode: write a CPU profile of the API server over each row's transitions into this directory, <mode>-<N>.pprof")
	burstModes := flag.String("burst-modes", "labelled,all", "cluster mode: watch modes of the burst")
	flag.IntVar(&fc.restartNodes, "restart-nodes", 300, "cluster mode: at this N, restart the API server under the fleet (0: none)")
	flag.StringVar(&fc.restartMode, "restart-mode", "hybrid", "cluster mode: watch mode of the restart")
	flag.Float64Var(&fc.unlabelledRequests, "unlabelled-requests", 0.1, "cluster mode: fraction of a hybrid row's create requests written without the node label (answered once the labeller labels them)")
	flag.DurationVar(&fc.restartDown, "restart-down", 5*time.Second, "cluster mode: how long the API server stays down")
	leaderClaims := flag.String("leader-claims", "", "leader mode: numbers of bound claims (each with its PV), comma-separated, ascending: the provisioner's leader's memory at each; the other modes' flags then do not apply")
	leaderSettle := flag.Duration("leader-settle", 30*time.Second, "leader mode: how long the provisioner runs after its claims controller started before its memory is read")
	flag.Parse()
	var err error
	if *leaderClaims != "" {
		claims, err := ints(*leaderClaims)
		if err != nil {
			fatal("-leader-claims: %v", err)
		}
		rows, err := runLeader(context.Background(), cfg, claims, *leaderSettle, os.Stderr)
		if err != nil {
			fatal("%v", err)
		}
		printLeader(os.Stdout, *leaderSettle, rows)
		return
	}
	if *nodes != "" {
		if fc.nodes, err = ints(*nodes); err != nil {
			fatal("-nodes: %v", err)
		}
		fc.modes, fc.burstModes = split(*modes), split(*burstModes)
		cfg.agentArgs = strings.Fields(*extra)
		res, err := runFleet(context.Background(), cfg, fc, os.Stderr)
		if err != nil {
			fatal("%v", err)
		}
		printFleet(os.Stdout, cfg, fc, res)
		return
	}
	if cfg.foreign, err = ints(*foreign); err != nil {
		fatal("-foreign: %v", err)
	}
	cfg.modes = split(*modes)
	for _, s := range split(*latencies) {
		d, err := time.ParseDuration(s)
		if err != nil {
			fatal("-lvmd-latency: %v", err)
		}
		cfg.latencies = append(cfg.latencies, d)
	}
	cfg.agentArgs = strings.Fields(*extra)
	for _, v := range strings.Split(*variants, ";") {
		if strings.TrimSpace(v) == "" {
			continue
		}
		p := strings.SplitN(v, ":", 4)
		if len(p) != 4 {
			fatal("-sync-variants: %q is not name:mode:binary:args", v)
		}
		cfg.variants = append(cfg.variants, variant{name: p[0], mode: p[1], bin: p[2], args: strings.Fields(p[3])})
	}
	rows, lvmd, err := run(context.Background(), cfg, os.Stderr)
	if err != nil {
		fatal("%v", err)
	}
	printTable(os.Stdout, cfg, rows, lvmd)
	printVariants(os.Stdout, cfg, rows)
}

// progress returns a printf to log whose lines start with the seconds since
// it was made.
func progress(log io.Writer) func(format string, args ...any) {
	start := time.Now()
	return func(format string, args ...any) {
		fmt.Fprintf(log, "[%6.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
}

// run makes the cluster, then each row; progress goes to log.
func run(ctx context.Context, cfg config, log io.Writer) ([]*row, lvmdCosts, error) {
	var lvmd lvmdCosts
	tb := &harness.ProgramTB{Log: log}
	defer tb.Close()
	logf := progress(log)
	dir := tb.TempDir()
	var err error
	if lvmd, err = lvmdCalls(tb, cfg.burst); err != nil {
		return nil, lvmd, err
	}
	logf("lvmd calls per create (GetLVList + CreateLV, 0 ms, %d LVs): p50 %v, p99 %v; the fake's lists hold the VG lock %v in all",
		cfg.burst, lvmd.p50, lvmd.p99, lvmd.listLocked)
	bin := cfg.agentBin
	if bin == "" {
		bin = harness.AgentBinary(tb, dir)
	}
	logf("starting etcd + kube-apiserver")
	cp, err := harness.StartDevCluster("", dir, 5*time.Minute)
	if err != nil {
		return nil, lvmd, err
	}
	tb.Cleanup(func() { _ = cp.Env.Stop() })
	cl, err := newCluster(ctx, cp, cfg, logf)
	if err != nil {
		return nil, lvmd, err
	}
	defer cl.stopChurn()
	var rows []*row
	for _, f := range cfg.foreign {
		cl.stopChurn()
		if err := cl.grow(ctx, f); err != nil {
			return nil, lvmd, err
		}
		cl.startChurn(ctx)
		for _, mode := range cfg.modes {
			logf("row: mode %s, %d foreign PVCs + %d foreign PVs", mode, f, f)
			r, err := runRow(ctx, cl, tb, bin, mode, f, logf)
			if err != nil {
				return nil, lvmd, fmt.Errorf("row %s/%d: %w", mode, f, err)
			}
			rows = append(rows, r)
		}
	}
	for _, v := range cfg.variants {
		logf("variant %s: mode %s, %d foreign PVCs + %d foreign PVs, start only", v.name, v.mode, cl.have, cl.have)
		c := cfg
		c.agentArgs = append(append([]string(nil), cfg.agentArgs...), v.args...)
		b := bin
		if v.bin != "" {
			b = v.bin
		}
		r, err := syncOnly(ctx, cl, tb, b, v.mode, c)
		if err != nil {
			return nil, lvmd, fmt.Errorf("variant %s: %w", v.name, err)
		}
		r.mode = v.name
		rows = append(rows, r)
	}
	logf("done")
	return rows, lvmd, nil
}

func ints(s string) ([]int, error) {
	var out []int
	for _, p := range split(s) {
		p = strings.NewReplacer("k", "000", "K", "000").Replace(p)
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	if !sort.IntsAreSorted(out) {
		return nil, fmt.Errorf("%q is not ascending", s)
	}
	return out, nil
}

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func fatal(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "scale: "+format+"\n", args...)
	os.Exit(1)
}
