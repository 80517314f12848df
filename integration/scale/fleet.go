package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lvm-agent/lvm-agent/integration/harness"
)

// A fleet is N simulated nodes, each the real lvm-agent binary as a
// process of its own with a fake lvmd of its own (served from this
// process), against the one API server.
//
// Processes, not the agent library N times in this process: each agent
// then has its own client-go transport, so its own TCP connection (client-go
// shares one HTTP/2 connection among rest.Configs with equal TLS settings
// through its transport cache, which would hide exactly the connection and
// watch fan-out the API server carries), its own rate limiter and its own
// Go runtime, as on real nodes; and /proc gives each one's RSS and CPU,
// which one shared process could not split. The price is memory: an agent
// measured 52-78 MiB VmRSS here, of which only 10-33 MiB RssAnon (its own
// heap; the rest is the binary's pages, shared by all): 300 of them take
// 3-10 GiB, within this host's 24 GiB; fleetFits checks before each N.
type fleet struct {
	mode   string
	nodes  []string
	agents []*agentProc
}

func simNode(i int) string { return fmt.Sprintf("sim-%03d", i) }

// startFleet makes the Node objects and starts n agents at once (as after
// an upgrade of the DaemonSet), and returns when every one is ready.
func (cl *cluster) startFleet(ctx context.Context, tb harness.TB, bin, mode string, n int) (*fleet, error) {
	f := &fleet{mode: mode}
	for i := 0; i < n; i++ {
		f.nodes = append(f.nodes, simNode(i))
	}
	err := parallel(ctx, cl.cfg.createWorkers, 0, n, func(ctx context.Context, i int) error {
		_, err := cl.c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.nodes[i]}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, node := range f.nodes {
		f.agents = append(f.agents, startAgentOn(tb, bin, cl.cp.Kubeconfig, node, mode, cl.cfg))
	}
	if err := f.waitReady(ctx, 20*time.Minute); err != nil {
		f.stop()
		return nil, err
	}
	if hybrid(mode) {
		for _, a := range f.agents {
			// Readiness does not wait for the first list of the unlabelled objects; the figures do.
			if err := a.waitMetric(ctx, "lvm_agent_sweeps_total", 1, 10*time.Minute); err != nil {
				f.stop()
				return nil, err
			}
		}
	}
	return f, nil
}

// waitReady polls every agent's /readyz, a round at a time (not one poller
// per agent: 300 of them would load the host they measure).
func (f *fleet) waitReady(ctx context.Context, timeout time.Duration) error {
	c := http.Client{Timeout: 5 * time.Second}
	pending := append([]*agentProc(nil), f.agents...)
	deadline := time.Now().Add(timeout)
	for len(pending) > 0 {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%d of %d agents not ready after %v; one's output:\n%s", len(pending), len(f.agents), timeout, tail(pending[0].proc.Output(), 40))
		}
		var still []*agentProc
		for _, a := range pending {
			if a.proc.Cmd.ProcessState != nil {
				return fmt.Errorf("agent exited: %s", tail(a.proc.Output(), 40))
			}
			resp, err := c.Get("http://" + a.addr + "/readyz")
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					continue
				}
			}
			still = append(still, a)
		}
		pending = still
		time.Sleep(200 * time.Millisecond)
	}
	return nil
}

// fleetStats is the agents' RSS and CPU: the sum over the fleet and the
// largest one's.
type fleetStats struct {
	sumRSS, maxRSS   float64
	sumAnon, maxAnon float64 // RssAnon: what each agent adds (the binary's pages are shared)
	exited           int     // agents no longer running (crashed)
}

func (f *fleet) stats() (fleetStats, []procStats, error) {
	var s fleetStats
	per := make([]procStats, len(f.agents))
	for i, a := range f.agents {
		if a.proc.Cmd.ProcessState != nil {
			s.exited++
			continue
		}
		p, err := a.stats()
		if err != nil {
			return s, nil, err
		}
		per[i] = p
		s.sumRSS += p.rssMiB
		s.maxRSS = max(s.maxRSS, p.rssMiB)
		s.sumAnon += p.anonMiB
		s.maxAnon = max(s.maxAnon, p.anonMiB)
	}
	return s, per, nil
}

// cpuSince is the agents' CPU seconds since the stats per (sum and max).
func (f *fleet) cpuSince(per []procStats) (sum, most float64, err error) {
	for i, a := range f.agents {
		if a.proc.Cmd.ProcessState != nil {
			continue
		}
		p, err := a.stats()
		if err != nil {
			return 0, 0, err
		}
		d := p.cpuSeconds - per[i].cpuSeconds
		sum += d
		most = max(most, d)
	}
	return sum, most, nil
}

// running counts the agents still running.
func (f *fleet) running() int {
	n := 0
	for _, a := range f.agents {
		if a.proc.Cmd.ProcessState == nil {
			n++
		}
	}
	return n
}

func (f *fleet) setLatency(d time.Duration) {
	for _, a := range f.agents {
		a.lvm.SetLatency(d)
	}
}

// stop ends every agent (SIGTERM, in parallel) and its fake lvmd.
func (f *fleet) stop() {
	var wg sync.WaitGroup
	for _, a := range f.agents {
		wg.Add(1)
		go func() { defer wg.Done(); a.stop() }()
	}
	wg.Wait()
}

// requestsResult is what requests measured.
type requestsResult struct {
	lat           []time.Duration // per request: written -> answer seen
	total         time.Duration   // first write sent -> last answer seen
	failed        int
	sent, written []time.Time // per request: its write sent, its response received
}

// requests writes one create request for each of names (names[i] for the
// node node(i), labelled unless unlabelled(i); nil: all labelled) with
// workers writers, no faster than rate per second (0: as fast as they go),
// and waits for every answer.
func (cl *cluster) requests(ctx context.Context, obs *observer, names []string, node func(int) string, unlabelled func(int) bool, rate float64, workers int, timeout time.Duration) (requestsResult, error) {
	r := requestsResult{sent: make([]time.Time, len(names)), written: make([]time.Time, len(names))}
	var tick <-chan time.Time
	if rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer t.Stop()
		tick = t.C
	}
	start := time.Now()
	err := parallel(ctx, workers, 0, len(names), func(ctx context.Context, i int) error {
		if tick != nil {
			select {
			case <-tick:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		r.sent[i] = time.Now()
		err := cl.requestOn(ctx, names[i], node(i), unlabelled == nil || !unlabelled(i))
		r.written[i] = time.Now()
		return err
	})
	if err != nil {
		return r, err
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last time.Time
	for i, name := range names {
		t, err := obs.wait(wctx, name)
		if err != nil {
			return r, fmt.Errorf("%d of %d answered: %w", obs.count(), len(names), err)
		}
		r.lat = append(r.lat, max(t.Sub(r.written[i]), 0))
		if t.After(last) {
			last = t
		}
		if _, ok := obs.failure(name); ok {
			r.failed++
		}
	}
	r.total = last.Sub(start)
	return r, nil
}
