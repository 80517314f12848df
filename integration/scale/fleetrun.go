package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/lvm-agent/lvm-agent/integration/harness"
)

// fleetConfig is the cluster mode (-nodes): N agents against one API server.
type fleetConfig struct {
	nodes        []int
	modes        []string
	foreign      int     // foreign PVCs (and PVs) of nodes not simulated
	transitions  int     // create requests per row, spread over the nodes
	rate         float64 // their write rate, per second
	burstNodes   int     // the cluster-wide burst at this N (0: none)
	burstPerNode int
	burstLatency time.Duration
	burstModes   []string
	restartNodes int // the API server restart at this N (0: none)
	restartMode  string
	restartDown  time.Duration
	// unlabelledRequests is the fraction of a hybrid row's requests written
	// without the node label.
	unlabelledRequests float64
	idle               time.Duration // the API server's idle cost is sampled this long before the transitions
	// profileDir, when set, receives a CPU profile of the API server over
	// each row's transitions, <mode>-<N>.pprof.
	profileDir string
}

// fleetRow is one N in one watch mode.
type fleetRow struct {
	mode  string
	nodes int
	ready time.Duration // all agents started → all ready
	// start is the API server's cost of the fleet's start (process start →
	// all ready), and its lists.
	start      apiCost
	startLists listFigures
	// idle is its CPU per second with the fleet up and the foreign churn
	// on, before the transitions: the cost of N agents doing nothing.
	idle float64
	// work is its cost during the transitions (first write → last answer + 1 s).
	work                apiCost
	transitions, failed int
	p50, p99            time.Duration
	seconds             float64
	agents              fleetStats // RSS at the end of the work
	agentCPU, maxCPU    float64    // during the work
	// hybrid: the requests written without the label (answered, as every
	// one is), their latency, and who found them: the labeller (labelled
	// in all since its start) or the agents' sweeps (their
	// lvm_agent_unlabelled_requests_total).
	unlabelled          int
	unlP50, unlP99      time.Duration
	byLabeller, bySweep float64
}

// cpuPerTransition is the API server's CPU during the transitions less
// its idle rate over the same time, per transition: what a transition costs,
// whether one node or 300 share them, and however long they take (one
// node takes longer for the same work: its queue).
func (r fleetRow) cpuPerTransition() float64 {
	return max(r.work.cpuSeconds-r.idle*r.seconds, 0) / float64(max(r.transitions, 1))
}

// grossPerTransition is the API server's CPU during the transitions, idle
// rate included, per transition. Where the idle rate itself grows with N
// (`all` mode: the foreign churn goes to every agent) and the window
// stretches (the API server saturated), the net figure subtracts most of
// the cost; this one shows it.
func (r fleetRow) grossPerTransition() float64 {
	return r.work.cpuSeconds / float64(max(r.transitions, 1))
}

// fleetBurst is the cluster-wide burst: burstPerNode creates on each node at once.
type fleetBurst struct {
	mode         string
	nodes, n     int
	latency      time.Duration
	total        time.Duration
	slept        time.Duration
	p50, p99     time.Duration
	failed       int
	api          apiCost
	agentCPU     float64
	agentsMaxCPU float64
	why          burstWhy
}

func (b fleetBurst) floor() time.Duration { return time.Duration(b.n/b.nodes) * b.latency }
func (b fleetBurst) ratio() float64       { return b.total.Seconds() / b.floor().Seconds() }

// fleetRestart is the API server restart under a fleet.
type fleetRestart struct {
	mode              string
	nodes             int
	open, answered    int // requests open across the restart, answered
	after             int // requests written after it, all answered
	crashed           int // agents not running at the end
	down, back        time.Duration
	lists             listFigures // from the stop to a minute after it (or the last answer)
	listsStart        listFigures // the fleet's start, for comparison
	answeredIn        time.Duration
	apiCPU, agentsCPU float64
}

type fleetResult struct {
	rows     []fleetRow
	bursts   []fleetBurst
	restarts []fleetRestart
	stopped  []string // why a mode's largest N did not run
	loadavg  [2]string
}

// runFleet runs the cluster mode.
func runFleet(ctx context.Context, cfg config, fc fleetConfig, log io.Writer) (*fleetResult, error) {
	res := &fleetResult{}
	res.loadavg[0] = loadavg()
	tb := &harness.ProgramTB{Log: log}
	defer tb.Close()
	logf := progress(log)
	dir := tb.TempDir()
	bin := cfg.agentBin
	if bin == "" {
		bin = harness.AgentBinary(tb, dir)
	}
	audit := filepath.Join(dir, "audit.log")
	args, err := auditArgs(audit)
	if err != nil {
		return nil, err
	}
	logf("starting etcd + kube-apiserver (RBAC, priority and fairness on, audit of PVC/PV lists)")
	cp := harness.StartControlPlaneWith(tb, 5*time.Minute, harness.Options{Restartable: true, Args: args})
	cl, err := newCluster(ctx, cp, cfg, logf)
	if err != nil {
		return nil, err
	}
	defer cl.stopChurn()
	if err := cl.grow(ctx, fc.foreign); err != nil {
		return nil, err
	}
	cl.startChurn(ctx)
	// Mode by mode, N ascending: the API server's RSS, which rarely
	// shrinks, then grows with one mode's fleets only.
	perAgent := 0.0 // the largest agent RssAnon seen, MiB
	for _, mode := range fc.modes {
		for _, n := range fc.nodes {
			if why := fleetFits(n, perAgent); why != "" {
				res.stopped = append(res.stopped, fmt.Sprintf("%s N=%d not run: %s", mode, n, why))
				logf("%s", res.stopped[len(res.stopped)-1])
				break
			}
			logf("fleet: %d agents, mode %s", n, mode)
			if mode == "hybrid" {
				// One per cluster, as the provisioner's leader runs it.
				if cl.lab, err = cl.startLabeller(ctx); err != nil {
					return nil, err
				}
			}
			f, row, err := fleetRowRun(ctx, cl, tb, bin, mode, n, fc, audit, logf)
			if err != nil {
				return nil, fmt.Errorf("N=%d %s: %w", n, mode, err)
			}
			res.rows = append(res.rows, row)
			perAgent = max(perAgent, row.agents.maxAnon)
			if n == fc.burstNodes && slices.Contains(fc.burstModes, mode) {
				b, err := fleetBurstRun(ctx, cl, f, fc, logf)
				if err != nil {
					f.stop()
					return nil, fmt.Errorf("burst N=%d %s: %w", n, mode, err)
				}
				res.bursts = append(res.bursts, b)
			}
			if n == fc.restartNodes && mode == fc.restartMode {
				r, err := fleetRestartRun(ctx, cl, tb, f, fc, audit, row.startLists, logf)
				if err != nil {
					f.stop()
					return nil, fmt.Errorf("restart N=%d %s: %w", n, mode, err)
				}
				res.restarts = append(res.restarts, r)
			}
			f.stop()
			cl.lab.stop()
			cl.lab = nil
		}
	}
	res.loadavg[1] = loadavg()
	logf("done")
	return res, nil
}

// fleetRowRun starts the fleet, measures its start, then the transitions;
// it returns the fleet still running.
func fleetRowRun(ctx context.Context, cl *cluster, tb harness.TB, bin, mode string, n int, fc fleetConfig, audit string, logf func(string, ...any)) (*fleet, fleetRow, error) {
	r := fleetRow{mode: mode, nodes: n}
	s0, err := sampleAPIServer(ctx, cl.cp)
	if err != nil {
		return nil, r, err
	}
	f, err := cl.startFleet(ctx, tb, bin, mode, n)
	if err != nil {
		return nil, r, err
	}
	r.ready = time.Since(s0.at)
	time.Sleep(2 * time.Second) // the audit log's batch is written
	s1, err := sampleAPIServer(ctx, cl.cp)
	if err != nil {
		f.stop()
		return nil, r, err
	}
	r.start = apiCostBetween(s0, s1)
	if lists, err := readLists(audit); err == nil {
		r.startLists = figures(lists, s0.at, s1.at)
	} else {
		logf("  audit log: %v", err)
	}
	logf("  %d agents ready in %v; API server %.1f CPU s for the start, %d lists (peak %d/s)",
		n, r.ready.Round(time.Millisecond), r.start.cpuSeconds, r.startLists.n, r.startLists.peakPerSecond)

	err = func() error {
		obs, err := cl.observe(ctx)
		if err != nil {
			return err
		}
		defer obs.stop()
		node := func(i int) string { return f.nodes[i%n] }
		names, err := cl.prepareOn(ctx, fmt.Sprintf("t-%s-%d", mode[:3], n), fc.transitions, node)
		defer func() {
			if err := cl.deletePVCs(context.Background(), burstNS, names); err != nil {
				logf("cleanup: %v", err)
			}
		}()
		if err != nil {
			return err
		}
		_, per, err := f.stats()
		if err != nil {
			return err
		}
		i0, err := sampleAPIServer(ctx, cl.cp)
		if err != nil {
			return err
		}
		time.Sleep(fc.idle)
		a0, err := sampleAPIServer(ctx, cl.cp)
		if err != nil {
			return err
		}
		r.idle = (a0.proc.cpuSeconds - i0.proc.cpuSeconds) / a0.at.Sub(i0.at).Seconds()
		var profiled <-chan error
		if fc.profileDir != "" {
			// Over the writes (transitions / rate): the answers follow them closely.
			profiled = profileAPIServer(ctx, cl.cp, int(float64(fc.transitions)/fc.rate),
				filepath.Join(fc.profileDir, fmt.Sprintf("%s-%d.pprof", mode, n)))
		}
		var unl func(int) bool
		if hybrid(mode) {
			// A provisioner that does not label writes some of them.
			unl = func(i int) bool { return unlabelled(i, fc.unlabelledRequests) }
		}
		rr, err := cl.requests(ctx, obs, names, node, unl, fc.rate, cl.cfg.createWorkers, 30*time.Minute)
		if err != nil {
			return err
		}
		lat, failed := rr.lat, rr.failed
		if unl != nil {
			var ul []time.Duration
			for i, d := range lat {
				if unl(i) {
					ul = append(ul, d)
				}
			}
			r.unlabelled, r.unlP50, r.unlP99 = len(ul), percentile(ul, 0.5), percentile(ul, 0.99)
			r.byLabeller = cl.lab.labelled()
			for _, a := range f.agents {
				if m, err := a.scrape(); err == nil {
					r.bySweep += m.sum("lvm_agent_unlabelled_requests_total")
				}
			}
			logf("  %d of them unlabelled, all answered: p50 %v p99 %v; labelled by the labeller %.0f (since its start), found by the agents' sweeps %.0f",
				r.unlabelled, r.unlP50.Round(time.Millisecond), r.unlP99.Round(time.Millisecond), r.byLabeller, r.bySweep)
		}
		if profiled != nil {
			if err := <-profiled; err != nil {
				logf("  API server profile: %v", err)
			}
		}
		time.Sleep(time.Second) // the answers' Events and watch deliveries settle
		a1, err := sampleAPIServer(ctx, cl.cp)
		if err != nil {
			return err
		}
		r.work = apiCostBetween(a0, a1)
		r.seconds = a1.at.Sub(a0.at).Seconds()
		wd := a1.m.sub(a0.m)
		logf("  API server requests per transition, net of idle: %s; in all %.0f requests, %.0f authentications (idle %.1f/s)",
			requestsPer(wd, a0.m.sub(i0.m), r.seconds, a0.at.Sub(i0.at).Seconds(), len(lat)),
			wd.sum("apiserver_request_total"), wd.sum("authentication_attempts"), a0.m.sub(i0.m).sum("authentication_attempts")/a0.at.Sub(i0.at).Seconds())
		r.transitions, r.failed = len(lat), failed
		r.p50, r.p99 = percentile(lat, 0.5), percentile(lat, 0.99)
		if r.agents, _, err = f.stats(); err != nil {
			return err
		}
		r.agentCPU, r.maxCPU, err = f.cpuSince(per)
		return err
	}()
	if err != nil {
		f.stop()
		return nil, r, err
	}
	logf("  %d transitions in %.1f s: API server %.2f CPU s (idle %.3f CPU s/s; %.2f ms each net of it), RSS %.0f MiB, %.0f watch events (%.1f MB), %.0f watchers; p50 %v p99 %v; agents RSS sum %.0f max %.1f MiB (anon sum %.0f max %.1f), CPU sum %.1f max %.2f s",
		r.transitions, r.seconds, r.work.cpuSeconds, r.idle, 1000*r.cpuPerTransition(), r.work.rssMiB, r.work.watchEvents, r.work.watchMB, r.work.watchers,
		r.p50.Round(time.Millisecond), r.p99.Round(time.Millisecond), r.agents.sumRSS, r.agents.maxRSS, r.agents.sumAnon, r.agents.maxAnon, r.agentCPU, r.maxCPU)
	return f, r, nil
}

// fleetBurstRun writes burstPerNode creates for every node of the running
// fleet at once, interleaved (every node's first request goes out first),
// with lvmd at burstLatency per operation.
func fleetBurstRun(ctx context.Context, cl *cluster, f *fleet, fc fleetConfig, logf func(string, ...any)) (fleetBurst, error) {
	n := len(f.nodes)
	b := fleetBurst{mode: f.mode, nodes: n, n: n * fc.burstPerNode, latency: fc.burstLatency}
	obs, err := cl.observe(ctx)
	if err != nil {
		return b, err
	}
	defer obs.stop()
	node := func(i int) string { return f.nodes[i%n] }
	names, err := cl.prepareOn(ctx, fmt.Sprintf("c-%s-%d", f.mode[:3], n), b.n, node)
	defer func() {
		f.setLatency(0)
		if err := cl.deletePVCs(context.Background(), burstNS, names); err != nil {
			logf("cleanup: %v", err)
		}
	}()
	if err != nil {
		return b, err
	}
	_, per, err := f.stats()
	if err != nil {
		return b, err
	}
	a0, err := sampleAPIServer(ctx, cl.cp)
	if err != nil {
		return b, err
	}
	s0, err := sampleBurst(a0, cl.cp, f)
	if err != nil {
		return b, err
	}
	f.setLatency(fc.burstLatency)
	stopProbe := sleepProbe(fc.burstLatency, &b.slept)
	defer stopProbe()
	// Writers enough that the writing is not what the burst waits for.
	rr, err := cl.requests(ctx, obs, names, node, nil, 0, 4*cl.cfg.createWorkers, 10*time.Minute+10*b.floor())
	stopProbe()
	if err != nil {
		return b, err
	}
	a1, err := sampleAPIServer(ctx, cl.cp)
	if err != nil {
		return b, err
	}
	s1, err := sampleBurst(a1, cl.cp, f)
	if err != nil {
		return b, err
	}
	b.total, b.failed = rr.total, rr.failed
	b.p50, b.p99 = percentile(rr.lat, 0.5), percentile(rr.lat, 0.99)
	b.api = apiCostBetween(a0, a1)
	if b.agentCPU, b.agentsMaxCPU, err = f.cpuSince(per); err != nil {
		return b, err
	}
	b.why = attribute(b, s0, s1, rr, obs, names, node)
	logf("  burst: %d creates (%d per node, lvmd %v): %v = %.3f x the %v floor (sleeps took %v); p50 %v p99 %v; %d failed; API server %.1f CPU s",
		b.n, fc.burstPerNode, b.latency, b.total.Round(time.Millisecond), b.ratio(), b.floor(), b.slept, b.p50.Round(time.Millisecond), b.p99.Round(time.Millisecond), b.failed, b.api.cpuSeconds)
	b.why.lines(logf, "    ")
	return b, nil
}

// fleetRestartRun restarts the API server (SIGTERM, as a rolling update
// does) with a request open on every node, writes one more per node when it
// is back, and waits for every answer. The bench watches the answers
// through a second API server on the same etcd that does not restart.
func fleetRestartRun(ctx context.Context, cl *cluster, tb harness.TB, f *fleet, fc fleetConfig, audit string, startLists listFigures, logf func(string, ...any)) (fleetRestart, error) {
	n := len(f.nodes)
	r := fleetRestart{mode: f.mode, nodes: n, listsStart: startLists}
	oc, err := kubernetes.NewForConfig(cl.cp.StartObserver(tb))
	if err != nil {
		return r, err
	}
	obs, err := observeWith(ctx, oc)
	if err != nil {
		return r, err
	}
	defer obs.stop()
	node := func(i int) string { return f.nodes[i%n] }
	names, err := cl.prepareOn(ctx, fmt.Sprintf("r-%s-%d", f.mode[:3], n), 2*n, node)
	defer func() {
		f.setLatency(0)
		if err := cl.deletePVCs(context.Background(), burstNS, names); err != nil {
			logf("cleanup: %v", err)
		}
	}()
	if err != nil {
		return r, err
	}
	_, per, err := f.stats()
	if err != nil {
		return r, err
	}
	// Open across the restart: lvmd takes longer than the API server's
	// stop, so the answers are written to the restarted one.
	f.setLatency(fc.restartDown + 10*time.Second)
	cl.stopChurn()
	err = parallel(ctx, cl.cfg.createWorkers, 0, n, func(ctx context.Context, i int) error {
		return cl.requestOn(ctx, names[i], node(i), true)
	})
	if err != nil {
		return r, err
	}
	r.open = n
	stopped := time.Now()
	if err := cl.cp.RestartAPIServer(ctx, fc.restartDown, false); err != nil {
		return r, err
	}
	r.back = time.Since(stopped)
	logf("  API server restarted (down %v, back after %v)", fc.restartDown, r.back.Round(time.Millisecond))
	cl.startChurn(ctx)
	f.setLatency(0)
	err = parallel(ctx, cl.cfg.createWorkers, n, 2*n, func(ctx context.Context, i int) error {
		return cl.requestOn(ctx, names[i], node(i), true)
	})
	if err != nil {
		return r, err
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	for i, name := range names {
		if _, err := obs.wait(wctx, name); err != nil {
			break
		}
		if i < n {
			r.answered++
		} else {
			r.after++
		}
	}
	r.answeredIn = time.Since(stopped)
	// Re-lists may come after the answers (a watch that resumes fine first, a 410 later).
	time.Sleep(max(0, time.Minute-r.answeredIn))
	r.crashed = n - f.running()
	s1, err := sampleAPIServer(ctx, cl.cp)
	if err != nil {
		return r, err
	}
	r.apiCPU = s1.proc.cpuSeconds // the new process: all of its life
	if r.agentsCPU, _, err = f.cpuSince(per); err != nil {
		return r, err
	}
	lists, err := readLists(audit)
	if err != nil {
		return r, err
	}
	r.lists = figures(lists, stopped, time.Now())
	logf("  restart: %d/%d open requests answered, %d/%d written after; %d agents crashed; %d re-lists (%d streamed) over %v, peak %d/s, peak %d plain lists at once",
		r.answered, r.open, r.after, n, r.crashed, r.lists.n, r.lists.streamed, r.lists.span.Round(time.Millisecond), r.lists.peakPerSecond, r.lists.peakConcurrent)
	return r, nil
}

// fleetFits tells why n agents of perAgent MiB (0: not measured yet) would
// not fit in the memory available now, or "" when they would.
func fleetFits(n int, perAgent float64) string {
	if perAgent == 0 {
		perAgent = 30 // a guess until the first row
	}
	avail := memAvailableMiB()
	need := float64(n)*perAgent*1.25 + 3072 // the agents' peaks; the binary's pages, the API server's growth
	if avail > 0 && need > avail {
		return fmt.Sprintf("needs ~%.0f MiB (%.0f MiB RssAnon per agent x 1.25 + 3 GiB), %.0f MiB available", need, perAgent, avail)
	}
	return ""
}

func memAvailableMiB() float64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}
