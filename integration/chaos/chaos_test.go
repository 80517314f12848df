// Package chaos is the fault-injection suite: a real etcd + kube-apiserver,
// the real lvm-agent binary and the fake lvmd (topolvm's wire protocol and
// error semantics), with volumes created and deleted in overlapping waves as
// a provisioner would, while the agent is SIGKILLed and restarted, lvmd goes
// away or slows down or fails, and the API server restarts on the same etcd.
// At the end it checks that nothing was lost, duplicated, touched that is
// not the agent's, or written after its final state, and prints a table.
//
// The regular integration tier runs a short run (40 volumes, seed 1);
// `make chaos` a long one, with a new seed each time unless SEED is given:
//
//	go test ./integration/chaos -run TestChaos -v -args -volumes 500 -seed N
//
// The seed fixes the plan (volumes, kinds, sizes, start times) and the fault
// schedule (kinds, durations, order); what the real processes then do, and
// so how many faults fit into the run, depends on timing, as in production.
package chaos

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

var (
	flagSeed     = flag.Int64("seed", 1, "seed of the plan and of the fault schedule (0: from the clock); printed, to replay a run")
	flagVolumes  = flag.Int("volumes", 40, "volumes to create and delete (make chaos: 500)")
	flagParallel = flag.Int("parallel", 48, "volumes in flight at most")
	flagFaults   = flag.Bool("faults", true, "inject faults (false: the same run without them, for comparison)")
)

const node = "chaos-node"

func TestChaos(t *testing.T) {
	seed := *flagSeed
	if seed == 0 {
		seed = time.Now().UnixNano()%1_000_000 + 1
	}
	n := *flagVolumes
	// Ten waves, two seconds apart: each overlaps the ones before it.
	const waveGap = 2 * time.Second
	replay := fmt.Sprintf("go test ./integration/chaos -run TestChaos -v -args -seed %d -volumes %d", seed, n)
	fmt.Printf("chaos: seed %d, %d volumes (replay: %s)\n", seed, n, replay)
	t.Logf("seed %d; replay: %s", seed, replay)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cp := harness.StartControlPlaneWith(t, 2*time.Minute, harness.Options{Restartable: true})
	client := newClient(t, cp.Config, "chaos-provisioner")
	for i := 0; i < 5; i++ {
		_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("chaos-%d", i)}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	// The tracker watches through an API server of its own on the same etcd,
	// which is never restarted: it sees every change, gaps included.
	tr := newTracker()
	require.NoError(t, tr.start(ctx, newClient(t, cp.StartObserver(t), "chaos-tracker")))

	// The node's LVM, with LVs that are not the agent's to touch.
	lvm := lvmdfake.NewLVM(classes()...)
	foreign, protected := seededLVs()
	before := append(append([]*seededLV(nil), foreign...), protected...)
	for _, s := range before {
		lv, err := lvm.Create(s.class, s.name, s.size, s.tags)
		require.NoError(t, err)
		s.size, s.tags = lv.SizeBytes, lv.Tags
	}
	lvmd, socket := harness.ServeLVMD(t, lvm)

	// Two agents for the one node (a rollout's old and new pod, say): the
	// fault injector kills and restarts the first; the second runs
	// throughout. Both delete untagged LVs of the original agent. The
	// collector's bound is the plan's size: a plan abandons about one claim
	// in ten, in a few seconds, so a larger run has more than the default
	// ten orphans due at once, which the collector refuses by design
	// (the agent's TestOrphanGCHeldAboveMax) and this suite would count as leaks.
	args := []string{
		"--node-name", node, "--kubeconfig", cp.Kubeconfig, "--lvmd-socket", socket, "--metrics-address", "",
		"--workers", "8", "--op-timeout", "20s", "--orphan-gc-interval", "1s", "--orphan-gc-max", strconv.Itoa(n),
		"--allow-untagged-delete", "--v", "1"}
	bin := harness.AgentBinary(t, t.TempDir())
	agentProc := &agentRunner{t: t, bin: bin, args: args}
	agentProc.start()
	second := &agentRunner{t: t, bin: bin, args: args}
	second.start()

	rng := rand.New(rand.NewSource(seed))
	vols := makePlan(rng, n, waveGap, foreign, protected)
	for _, v := range vols {
		if v.kind == kindLegacy {
			_, err := lvm.Create(v.class, v.lv, 4<<20, nil) // the original agent tagged nothing
			require.NoError(t, err)
		}
	}
	quiet := func(string, ...any) {}
	if testing.Verbose() {
		quiet = t.Logf
	}
	inj, err := newInjector(seed, cp, lvm, lvmd, socket, agentProc, quiet)
	require.NoError(t, err)

	// The run: volumes in waves, faults meanwhile.
	began := time.Now()
	stopFaults := make(chan struct{})
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		if *flagFaults {
			inj.run(ctx, stopFaults)
		}
	}()
	p := &provisioner{c: client, node: node, tracker: tr, deadline: 4 * time.Minute}
	sem := make(chan struct{}, *flagParallel)
	var wg sync.WaitGroup
	for _, v := range vols {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sleep(ctx, time.Until(began.Add(v.start)))
			sem <- struct{}{}
			defer func() { <-sem }()
			p.run(ctx, v)
		}()
	}
	wg.Wait()
	ran := time.Since(began)
	close(stopFaults)
	<-faultsDone
	inj.quiesce()

	// Orphans (of abandoned claims) are the collector's: two passes a
	// second apart, so they go within seconds once the faults stop. The
	// tracker must also have seen every object as it is now.
	var w *world
	collect := time.Now()
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		w, err = observe(ctx, client, lvm, vols, tr, before)
		return err == nil && len(w.orphans()) == 0 && len(w.lagging()) == 0, nil
	})
	if err != nil {
		t.Logf("orphans still there, or the tracker behind, after a minute: %v", err)
		w, err = observe(ctx, client, lvm, vols, tr, before)
		require.NoError(t, err)
	}
	w.removes = inj.removals()

	apiCheck := &check{name: "API server restarts: down, then back on the same etcd", checked: inj.etcdChecks, violations: inj.etcdBroken}
	if inj.etcdChecks > 0 && inj.downSeen != inj.etcdChecks {
		apiCheck.fail("the API server was seen down in %d of %d restarts", inj.downSeen, inj.etcdChecks)
	}
	checks := w.checks(apiCheck)
	if *flagFaults {
		// Each kind of fault happened at least once: a run without them
		// proves little.
		happened := &check{name: "every kind of fault injected", checked: int(numFaults)}
		for k, c := range inj.counts {
			if c == 0 {
				happened.fail("%s never happened", faultNames[k])
			}
		}
		checks = append(checks, happened)
	}
	report(os.Stdout, seed, vols, ran, time.Since(collect), inj, agentProc, tr)
	if violations := printTable(os.Stdout, checks); violations > 0 {
		t.Errorf("%d invariant violations; replay: %s", violations, replay)
	}
}

func newClient(t *testing.T, cfg *rest.Config, agent string) kubernetes.Interface {
	t.Helper()
	c := rest.CopyConfig(cfg)
	c.UserAgent, c.QPS, c.Burst = agent, 1000, 2000
	cs, err := kubernetes.NewForConfig(c)
	require.NoError(t, err)
	return cs
}

// report prints what the run did: the plan, the faults and their effect.
func report(out *os.File, seed int64, vols []*volume, ran, collect time.Duration, inj *injector, a *agentRunner, tr *tracker) {
	var kinds [numKinds]int
	abandoned, collected := 0, 0
	removes := inj.removals()
	for _, v := range vols {
		kinds[v.kind]++
		if v.kind == kindAbandon {
			abandoned++
			if len(removes[v.lv]) > 0 {
				collected++
			}
		}
	}
	fmt.Fprintf(out, "\nchaos seed %d: %d volumes in %v (orphans settled %v later)\n", seed, len(vols), ran.Round(100*time.Millisecond), collect.Round(100*time.Millisecond))
	fmt.Fprint(out, "  plan:")
	for k, c := range kinds {
		fmt.Fprintf(out, " %s %d", kind(k), c)
	}
	fmt.Fprint(out, "\n  faults:")
	for k, c := range inj.counts {
		fmt.Fprintf(out, " %s %d;", faultNames[k], c)
	}
	restarts := append([]time.Duration(nil), inj.restartsTaken...)
	sort.Slice(restarts, func(i, j int) bool { return restarts[i] < restarts[j] })
	fmt.Fprintf(out, "\n  agent processes: %d (and a second agent for the node throughout); lvm operations failed on purpose: %d; API server restarts (%d by SIGKILL) took %v\n",
		a.starts, inj.injected.Load(), inj.crashes, restarts)
	fmt.Fprintf(out, "  abandoned claims: %d, of which the orphan collector removed an LV for %d\n", abandoned, collected)
	modified := 0
	for _, r := range tr.all() {
		modified += r.modifiedAfterFinal
	}
	fmt.Fprintf(out, "  tracker: %d events; %d updates after a final state (claims being deleted by the provisioner; any other is a violation below)\n\n",
		tr.events, modified)
}
