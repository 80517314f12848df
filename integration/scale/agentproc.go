package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

// agentProc is one agent under measurement with its fake lvmd.
type agentProc struct {
	proc    *harness.Process
	lvm     *lvmdfake.LVM
	lvmd    *lvmdfake.Topolvm
	addr    string // its metrics address
	started time.Time
}

// startAgent starts a fake lvmd (one thick device class "vg1" of 64 TiB:
// every LV of a row fits) and the agent for benchNode.
func startAgent(tb harness.TB, bin, kubeconfig, mode string, cfg config) *agentProc {
	return startAgentOn(tb, bin, kubeconfig, benchNode, mode, cfg)
}

// startAgentOn is startAgent for the node named node.
func startAgentOn(tb harness.TB, bin, kubeconfig, node, mode string, cfg config) *agentProc {
	a := &agentProc{lvm: lvmdfake.NewLVM(lvmdfake.Class{Name: "vg1", SizeBytes: 64 << 40}), addr: harness.FreeAddr(tb)}
	var socket string
	a.lvmd, socket = harness.ServeLVMD(tb, a.lvm)
	args := append([]string{"--node-name", node, "--kubeconfig", kubeconfig, "--lvmd-socket", socket,
		"--metrics-address", a.addr, "--watch-mode", watchMode(mode), "--labeller-lease", benchLease.String(),
		"--sweep-interval", cfg.sweepInterval.String()}, cfg.agentArgs...)
	a.started = time.Now()
	a.proc = harness.StartAgent(tb, bin, args...)
	return a
}

// waitReady waits for the agent's /readyz and returns the time from the
// process start.
func (a *agentProc) waitReady(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	if err := harness.WaitAgentReady(ctx, a.proc, a.addr, timeout); err != nil {
		return 0, err
	}
	return time.Since(a.started), nil
}

func (a *agentProc) stop() {
	_, _ = a.proc.Signal(syscall.SIGTERM, 30*time.Second)
	a.proc.Kill()
	a.lvmd.Stop()
}

// procStats is what /proc says about the agent.
type procStats struct {
	rssMiB, hwmMiB float64 // VmRSS, VmHWM
	// anonMiB is RssAnon: VmRSS less the pages of files (the binary's text,
	// which processes of one binary share) and of shared memory.
	anonMiB    float64
	cpuSeconds float64 // utime + stime
}

func (a *agentProc) stats() (procStats, error) { return pidStats(a.proc.Cmd.Process.Pid) }

// pidStats is what /proc says about the process pid.
func pidStats(pid int) (procStats, error) {
	var s procStats
	mem, err := harness.ProcMemory(pid)
	if err != nil {
		return s, err
	}
	s.rssMiB, s.hwmMiB, s.anonMiB = mem["VmRSS"], mem["VmHWM"], mem["RssAnon"]
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// The command may contain spaces: fields count from after its ")".
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(f) < 13 {
		return s, fmt.Errorf("short /proc/%d/stat", pid)
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	s.cpuSeconds = (utime + stime) / 100 // USER_HZ, always 100 in /proc
	return s, nil
}

// metrics is one scrape of the agent's /metrics: series → value, with the
// series written as the text format prints it (labels sorted).
type metrics map[string]float64

func (a *agentProc) scrape() (metrics, error) {
	m, err := harness.ReadMetrics(a.addr)
	return metrics(m), err
}

// waitMetric polls /metrics until the sum of name reaches want.
func (a *agentProc) waitMetric(ctx context.Context, name string, want float64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if m, err := a.scrape(); err == nil && m.sum(name) >= want {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s did not reach %v in %v", name, want, timeout)
}

// sum adds the series of name whose labels contain every one of match
// (each `key="value"`).
func (m metrics) sum(name string, match ...string) float64 {
	total := 0.0
	for series, v := range m {
		if (series == name || strings.HasPrefix(series, name+"{")) && hasLabels(series, match) {
			total += v
		}
	}
	return total
}

// hasLabels tells whether series has every one of match (each `key="value"`).
func hasLabels(series string, match []string) bool {
	for _, want := range match {
		if !strings.Contains(series, want) {
			return false
		}
	}
	return true
}

// sub is m - base, series by series.
func (m metrics) sub(base metrics) metrics {
	out := metrics{}
	for k, v := range m {
		out[k] = v - base[k]
	}
	return out
}

func tail(s string, lines int) string {
	parts := strings.Split(s, "\n")
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return strings.Join(parts, "\n")
}

// quantile estimates the q-quantile of a histogram from its buckets (in a
// difference of two scrapes: what was observed between them), interpolating
// within the bucket, as Prometheus' histogram_quantile does.
func (m metrics) quantile(name string, q float64, match ...string) time.Duration {
	type bucket struct{ le, n float64 }
	var bs []bucket
	for series, v := range m {
		i := strings.Index(series, `le="`)
		if !strings.HasPrefix(series, name+"_bucket{") || !hasLabels(series, match) || i < 0 {
			continue
		}
		le := series[i+4:]
		le = le[:strings.IndexByte(le, '"')]
		f, err := strconv.ParseFloat(le, 64)
		if err != nil {
			continue
		}
		bs = append(bs, bucket{f, v})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	if len(bs) == 0 || bs[len(bs)-1].n == 0 {
		return 0
	}
	rank := q * bs[len(bs)-1].n
	lower, below := 0.0, 0.0
	for _, b := range bs {
		if b.n >= rank {
			if math.IsInf(b.le, 1) {
				return time.Duration(lower * float64(time.Second))
			}
			frac := 0.0
			if b.n > below {
				frac = (rank - below) / (b.n - below)
			}
			return time.Duration((lower + (b.le-lower)*frac) * float64(time.Second))
		}
		lower, below = b.le, b.n
	}
	return time.Duration(lower * float64(time.Second))
}

// lvmdCosts is what lvmd costs a create with the fake at 0 ms.
type lvmdCosts struct {
	p50, p99 time.Duration // GetLVList + CreateLV over the socket, from this process
	// listLocked is the sum, over a burst, of the time the fake's
	// GetLVList holds the VG lock (copying and sorting the LVs), which a
	// burst's creates wait for: the agent looks before each create.
	listLocked time.Duration
}

// lvmdCalls measures n creates one after the other, the VG holding up to n
// LVs, as in a burst: the GetLVList the agent looks first with, then CreateLV.
func lvmdCalls(tb harness.TB, n int) (lvmdCosts, error) {
	var c lvmdCosts
	lvm := lvmdfake.NewLVM(lvmdfake.Class{Name: "vg1", SizeBytes: 64 << 40})
	srv, socket := harness.ServeLVMD(tb, lvm)
	defer srv.Stop()
	b, err := lvmbackend.NewTopolvm(socket)
	if err != nil {
		return c, err
	}
	defer b.Close()
	ctx := context.Background()
	d := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("lv-%05d", i)
		start := time.Now()
		if _, err := b.GetVolume(ctx, "vg1", name); !errors.Is(err, lvmbackend.ErrNotFound) {
			return c, fmt.Errorf("get %s: %v", name, err)
		}
		if _, err := b.CreateVolume(ctx, lvmbackend.CreateRequest{DeviceClass: "vg1", Name: name, SizeBytes: 4 << 20}); err != nil {
			return c, err
		}
		d = append(d, time.Since(start))
		start = time.Now()
		if _, err := lvm.List("vg1"); err != nil {
			return c, err
		}
		c.listLocked += time.Since(start)
	}
	c.p50, c.p99 = percentile(d, 0.5), percentile(d, 0.99)
	return c, nil
}
