package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

type fault int

const (
	faultKillAgent  fault = iota // SIGKILL, then a new agent after a pause
	faultLvmdDown                // lvmd's socket and connections closed, then served again
	faultLvmdSlow                // every mutating lvm operation slow (serialized per VG), for a while
	faultLvmdErrors              // a share of lvm operations fail as lvm does (Internal), for a while
	faultAPIRestart              // kube-apiserver stopped (SIGTERM or SIGKILL) and started again on the same etcd
	numFaults
)

var faultNames = [numFaults]string{"agent SIGKILL + restart", "lvmd unavailable", "lvmd slow", "lvm errors", "API server restart"}

// weights of the faults after the first of each, in percent.
var faultWeights = [numFaults]int{30, 20, 17, 18, 15}

// minAPIGap spaces API server restarts: each takes seconds, and the run
// should mostly be about everything else.
const minAPIGap = 10 * time.Second

// agentRunner starts and kills the real agent binary.
type agentRunner struct {
	t      harness.TB
	bin    string
	args   []string
	mu     sync.Mutex
	proc   *harness.Process
	starts int
}

func (a *agentRunner) start() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.proc = harness.StartAgent(a.t, a.bin, a.args...)
	a.starts++
}

func (a *agentRunner) kill() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.proc.Kill()
}

// injector makes faults at moments and of kinds drawn from its own seeded
// generator: the same seed gives the same schedule (what then happens
// depends on the timing of real processes, as it would in production).
type injector struct {
	rng    *rand.Rand
	cp     *harness.ControlPlane
	lvm    *lvmdfake.LVM
	lvmd   *lvmdfake.Topolvm
	socket string
	agent  *agentRunner
	logf   func(string, ...any)

	counts  [numFaults]int
	lastAPI time.Time
	windows sync.WaitGroup
	// windowCtx ends the windows' waits at quiesce.
	windowCtx  context.Context
	endWindows context.CancelFunc
	slowGen    atomic.Int64
	errGen     atomic.Int64
	errPct     atomic.Int32
	hookMu     sync.Mutex
	hookRng    *rand.Rand
	injected   atomic.Int64

	removesMu sync.Mutex
	removes   map[string][]time.Time // LV name → remove calls that reached the model

	sentinel      *corev1.ConfigMap
	etcdChecks    int
	etcdBroken    []string
	downSeen      int
	crashes       int
	restartsTaken []time.Duration
}

func newInjector(seed int64, cp *harness.ControlPlane, lvm *lvmdfake.LVM, lvmd *lvmdfake.Topolvm, socket string, a *agentRunner, logf func(string, ...any)) (*injector, error) {
	f := &injector{rng: rand.New(rand.NewSource(seed)), hookRng: rand.New(rand.NewSource(seed + 1)),
		cp: cp, lvm: lvm, lvmd: lvmd, socket: socket, agent: a, logf: logf, removes: map[string][]time.Time{}}
	f.windowCtx, f.endWindows = context.WithCancel(context.Background())
	// What the API server serves from etcd: after each restart it must still
	// be this object, unchanged.
	var err error
	f.sentinel, err = cp.Client.CoreV1().ConfigMaps("default").Create(context.Background(),
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "chaos-sentinel"}, Data: map[string]string{"seed": fmt.Sprint(seed)}}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	lvm.SetHook(f.hook)
	return f, nil
}

// hook runs at the start of every lvm operation of the fake lvmd.
func (f *injector) hook(op, class, name string) error {
	if pct := f.errPct.Load(); pct > 0 {
		f.hookMu.Lock()
		fail := f.hookRng.Int31n(100) < pct
		f.hookMu.Unlock()
		if fail {
			f.injected.Add(1)
			return errors.New("chaos: lvm command failed: Internal error (injected)")
		}
	}
	if op == "remove" {
		f.removesMu.Lock()
		f.removes[name] = append(f.removes[name], time.Now())
		f.removesMu.Unlock()
	}
	return nil
}

// run injects faults until stop is closed, and at least one of each kind
// (the first ones, in a seeded order).
func (f *injector) run(ctx context.Context, stop <-chan struct{}) {
	first := f.rng.Perm(int(numFaults))
	for i := 0; ; i++ {
		gap := 300*time.Millisecond + time.Duration(f.rng.Int63n(int64(1700*time.Millisecond)))
		if i < len(first) {
			sleep(ctx, gap)
		} else {
			select {
			case <-stop:
				return
			case <-time.After(gap):
			}
		}
		k := f.draw()
		if i < len(first) {
			k = fault(first[i])
		}
		if k == faultAPIRestart && i >= len(first) && time.Since(f.lastAPI) < minAPIGap {
			k = faultKillAgent
		}
		f.inject(ctx, k)
	}
}

func (f *injector) draw() fault {
	n := f.rng.Intn(100)
	for k, w := range faultWeights {
		if n < w {
			return fault(k)
		}
		n -= w
	}
	return faultKillAgent
}

func (f *injector) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(f.rng.Int63n(int64(hi-lo)+1))
}

func (f *injector) inject(ctx context.Context, k fault) {
	f.counts[k]++
	switch k {
	case faultKillAgent:
		pause := f.between(0, time.Second)
		f.logf("fault: SIGKILL the agent, restart after %v", pause)
		f.agent.kill()
		sleep(ctx, pause)
		f.agent.start()
	case faultLvmdDown:
		down := f.between(200*time.Millisecond, 3*time.Second)
		f.logf("fault: lvmd unavailable for %v", down)
		f.lvmd.Stop()
		sleep(ctx, down)
		if err := f.lvmd.Serve(f.socket); err != nil {
			f.logf("lvmd serve: %v", err)
		}
	case faultLvmdSlow:
		latency, d := f.between(20*time.Millisecond, 250*time.Millisecond), f.between(time.Second, 4*time.Second)
		f.logf("fault: lvmd latency %v for %v", latency, d)
		gen := f.slowGen.Add(1)
		f.lvm.SetLatency(latency)
		f.window(d, func() {
			if f.slowGen.Load() == gen {
				f.lvm.SetLatency(0)
			}
		})
	case faultLvmdErrors:
		pct, d := int32(10+f.rng.Intn(41)), f.between(time.Second, 3*time.Second)
		f.logf("fault: %d%% of lvm operations fail for %v", pct, d)
		gen := f.errGen.Add(1)
		f.errPct.Store(pct)
		f.window(d, func() {
			if f.errGen.Load() == gen {
				f.errPct.Store(0)
			}
		})
	case faultAPIRestart:
		// By turns a crash (the first, so that a short run has one) and a
		// graceful stop.
		down, crash := f.between(0, 2*time.Second), f.counts[k]%2 == 1
		f.logf("fault: API server restart (crash: %v), down for %v after it stops", crash, down)
		if crash {
			f.crashes++
		}
		f.restartAPI(ctx, down, crash)
		f.lastAPI = time.Now()
	}
}

// window ends a fault after d, without holding up the next one: windows
// overlap the other faults.
func (f *injector) window(d time.Duration, end func()) {
	f.windows.Add(1)
	go func() {
		defer f.windows.Done()
		sleep(f.windowCtx, d)
		end()
	}()
}

// restartAPI restarts kube-apiserver and checks that it came back on the
// same etcd: the sentinel is the same object at the same version. A probe
// meanwhile checks that it really was down.
func (f *injector) restartAPI(ctx context.Context, down time.Duration, crash bool) {
	probeCtx, stopProbe := context.WithCancel(ctx)
	var failures atomic.Int32
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for probeCtx.Err() == nil {
			c, cancel := context.WithTimeout(probeCtx, time.Second)
			if _, err := f.cp.Client.CoreV1().Namespaces().Get(c, "default", metav1.GetOptions{}); err != nil && probeCtx.Err() == nil {
				failures.Add(1)
			}
			cancel()
			sleep(probeCtx, 50*time.Millisecond)
		}
	}()
	start := time.Now()
	err := f.cp.RestartAPIServer(ctx, down, crash)
	f.restartsTaken = append(f.restartsTaken, time.Since(start))
	stopProbe()
	wg.Wait()
	f.etcdChecks++
	if err != nil {
		f.etcdBroken = append(f.etcdBroken, fmt.Sprintf("restart %d: %v", f.etcdChecks, err))
		return
	}
	if failures.Load() > 0 {
		f.downSeen++
	}
	got, err := f.cp.Client.CoreV1().ConfigMaps("default").Get(ctx, f.sentinel.Name, metav1.GetOptions{})
	switch {
	case err != nil:
		f.etcdBroken = append(f.etcdBroken, fmt.Sprintf("restart %d: sentinel: %v", f.etcdChecks, err))
	case got.UID != f.sentinel.UID || got.ResourceVersion != f.sentinel.ResourceVersion:
		f.etcdBroken = append(f.etcdBroken, fmt.Sprintf("restart %d: sentinel is uid %s rv %s, was uid %s rv %s",
			f.etcdChecks, got.UID, got.ResourceVersion, f.sentinel.UID, f.sentinel.ResourceVersion))
	}
}

// quiesce ends every fault: lvmd serving at full speed without errors, the
// agent running, the API server up (each fault restores what it broke
// before the next; windows are ended here).
func (f *injector) quiesce() {
	f.slowGen.Add(1)
	f.errGen.Add(1)
	f.lvm.SetLatency(0)
	f.errPct.Store(0)
	f.endWindows()
	f.windows.Wait()
}

// removals returns when remove calls for each LV name reached lvmd.
func (f *injector) removals() map[string][]time.Time {
	f.removesMu.Lock()
	defer f.removesMu.Unlock()
	out := make(map[string][]time.Time, len(f.removes))
	for k, v := range f.removes {
		out[k] = append([]time.Time(nil), v...)
	}
	return out
}
