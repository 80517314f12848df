// Command memory measures the lvm-agent's memory: the real agent binary, as
// a child process, against a real etcd + kube-apiserver (integration/harness)
// and the fake lvmd (topolvm's wire protocol, in this process on a unix
// socket), with every feature the install turns on (deploy/base's
// arguments, the provisioner's labeller holding its Lease, the Node
// capacity annotation) and the orphan collector. It prints the process's
// RSS (/proc/PID/status) and the Go runtime's heap (the agent's own
// /metrics) at rest, and after N volumes made through the protocol with
// their local PVs, as a provisioner makes them.
//
// A thick copy needs device-mapper (the source's open count) and block
// devices, which a host without device-mapper lacks: the agent package's
// BenchmarkThickCloneMemory measures it with regular files, as its tests do
// (make bench-memory runs both).
//
//	KUBEBUILDER_ASSETS=$(scripts/kube-assets.sh) go run ./integration/memory [flags]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
	"github.com/lvm-agent/lvm-agent/provisioner"
)

const (
	benchNode = "memory-node"
	benchNS   = "memory"
)

// lease is the labeller's Lease, which the agent follows (--labeller-lease).
var lease = kube.LeaseRef{Namespace: "default", Name: kube.LabellerLeaseName}

type config struct {
	bin       string
	volumes   int
	parallel  int
	settle    time.Duration
	agentArgs []string
	verbose   bool
}

func main() {
	var cfg config
	flag.StringVar(&cfg.bin, "agent-bin", "", "agent binary (default: $LVM_AGENT_BIN, or built from this module)")
	flag.IntVar(&cfg.volumes, "volumes", 500, "volumes made through the protocol before the second sample")
	flag.IntVar(&cfg.parallel, "parallel", 16, "requests written at once")
	flag.DurationVar(&cfg.settle, "settle", 30*time.Second, "how long the agent rests before each sample")
	extra := flag.String("agent-args", "", "extra agent flags, space-separated")
	flag.BoolVar(&cfg.verbose, "v", false, "print the agent's output at the end")
	flag.Parse()
	cfg.agentArgs = strings.Fields(*extra)
	samples, err := run(context.Background(), cfg, os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "memory: %v\n", err)
		os.Exit(1)
	}
	printTable(os.Stdout, samples)
}

// sample is the agent's memory at one point.
type sample struct {
	point string
	// From /proc/PID/status: VmRSS, its anonymous part (the heap, stacks,
	// the runtime's own) and its file part (the binary's pages touched:
	// shared by processes of one binary, and reclaimable), and VmHWM.
	rss, anon, file, hwm float64
	// From the agent's /metrics (client_golang's Go collector).
	heapInuse, heapAlloc, stack, goSys, nextGC float64
	goroutines                                 float64
}

func run(ctx context.Context, cfg config, log io.Writer) ([]sample, error) {
	tb := &harness.ProgramTB{Log: log}
	defer tb.Close()
	start := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(log, "[%6.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	dir := tb.TempDir()
	bin := cfg.bin
	if bin == "" {
		logf("building lvm-agent")
		bin = harness.AgentBinary(tb, dir)
	}
	logf("starting etcd + kube-apiserver")
	cp, err := harness.StartDevCluster("", dir, 5*time.Minute)
	if err != nil {
		return nil, err
	}
	tb.Cleanup(func() { _ = cp.Env.Stop() })
	harness.ReadyNode(tb, cp, benchNode, "4", "8Gi")
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNS}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	stopLabeller, err := startLabeller(ctx, cp)
	if err != nil {
		return nil, err
	}
	defer stopLabeller()

	// One thick and one thin class, as lvmd.yaml's example has.
	lvm := lvmdfake.NewLVM(lvmdfake.Class{Name: "vg1", SizeBytes: 64 << 40},
		lvmdfake.Class{Name: "thin", VG: "vg1", SizeBytes: 64 << 40, Thin: true, Overprovision: 2})
	_, socket := harness.ServeLVMD(tb, lvm)
	addr := harness.FreeAddr(tb)
	// deploy/base/daemonset.yaml's arguments, with this host's paths; the
	// defaults do the rest (hybrid watch, the sweep, the Node capacity
	// annotation, shared lvmd listings; device-mapper and the direct
	// metadata reader are off there too: the container is unprivileged).
	// The orphan collector is off by default; on here, every minute.
	args := append([]string{"--node-name=" + benchNode, "--kubeconfig=" + cp.Kubeconfig,
		"--backend=topolvm", "--lvmd-socket=" + socket, "--device-class-map=",
		"--provisioner-name=" + kube.DefaultProvisioner, "--metrics-address=" + addr,
		"--labeller-lease=" + lease.String(), "--orphan-gc-interval=1m"}, cfg.agentArgs...)
	logf("starting lvm-agent %s", strings.Join(args, " "))
	agent := harness.StartAgent(tb, bin, args...)
	defer func() {
		_, _ = agent.Signal(syscall.SIGTERM, 40*time.Second)
		if cfg.verbose {
			fmt.Fprintf(log, "lvm-agent output:\n%s\n", agent.Output())
		}
	}()
	if err := harness.WaitAgentReady(ctx, agent, addr, 2*time.Minute); err != nil {
		return nil, err
	}
	var samples []sample
	take := func(point string) error {
		logf("resting %v, then sampling %q", cfg.settle, point)
		time.Sleep(cfg.settle)
		s, err := measure(agent.Cmd.Process.Pid, addr)
		if err != nil {
			return err
		}
		s.point = point
		samples = append(samples, s)
		logf("%s: VmRSS %.1f MiB, heap in use %.1f MiB", point, s.rss, s.heapInuse)
		return nil
	}
	if err := take("at rest"); err != nil {
		return samples, err
	}
	logf("making %d volumes, %d at a time", cfg.volumes, cfg.parallel)
	t0 := time.Now()
	if err := makeVolumes(ctx, cp.Client, cfg.volumes, cfg.parallel); err != nil {
		return samples, err
	}
	logf("%d volumes created with their PVs in %v", cfg.volumes, time.Since(t0).Round(time.Millisecond))
	if err := take(fmt.Sprintf("after %d volumes", cfg.volumes)); err != nil {
		return samples, err
	}
	return samples, nil
}

// startLabeller runs the provisioner leader's labeller, which holds the
// Lease that tells the agents that unlabelled requests get labelled (so
// they do not watch those themselves), as in an install.
func startLabeller(ctx context.Context, cp *harness.ControlPlane) (stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		kube.NewLabeller(clientset.Wrap(cp.Client), prometheus.NewRegistry()).WithLease(provisioner.LabellerLease(cp.Client, lease, "bench")).Run(ctx, 2)
	})
	stop = func() { cancel(); wg.Wait() }
	for t0 := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		_, err := cp.Client.CoordinationV1().Leases(lease.Namespace).Get(ctx, lease.Name, metav1.GetOptions{})
		if err == nil {
			return stop, nil
		}
		if time.Since(t0) > 2*time.Minute {
			stop()
			return nil, fmt.Errorf("the labeller's Lease: %w", err)
		}
	}
}

// makeVolumes asks for n volumes as lvm-agent's provisioner does: a claim
// whose selected node is the agent's, the request through
// kube.CreateVolume (which waits for the answer), then the claim's local PV
// with the same labels and annotations as the provisioner's, bound to it.
func makeVolumes(ctx context.Context, c kubernetes.Interface, n, parallel int) error {
	sem := make(chan struct{}, parallel)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs <- makeVolume(ctx, c, fmt.Sprintf("pvc-%04d", i))
		})
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

func makeVolume(ctx context.Context, c kubernetes.Interface, name string) error {
	pvc, err := c.CoreV1().PersistentVolumeClaims(benchNS).Create(ctx, harness.NewPVC(benchNS, name, benchNode), metav1.CreateOptions{})
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	lv := "pv-" + string(pvc.UID)
	got, err := kube.CreateVolume(wctx, clientset.Wrap(c), benchNS, name, kube.CreateSpec{VolumeGroup: "vg1", Name: lv, Size: 1 << 30}, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	annotations, labels := kube.PVRequestMeta(benchNode, "vg1", lv)
	annotations[kube.AnnProvisionedBy] = kube.DefaultProvisioner
	fs := "ext4"
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: lv, Annotations: annotations, Labels: labels},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: got.Annotations[kube.AnnDevice], FSType: &fs}},
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: benchNS, Name: name, UID: pvc.UID},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{benchNode}}},
			}}}},
		},
	}
	if _, err := c.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("PV of %s: %w", name, err)
	}
	return nil
}

// measure reads the agent's /proc/PID/status and its /metrics.
func measure(pid int, addr string) (sample, error) {
	var s sample
	mem, err := harness.ProcMemory(pid)
	if err != nil {
		return s, err
	}
	s.rss, s.anon, s.file, s.hwm = mem["VmRSS"], mem["RssAnon"], mem["RssFile"], mem["VmHWM"]
	m, err := harness.ReadMetrics(addr)
	if err != nil {
		return s, err
	}
	for name, dst := range map[string]*float64{
		"go_memstats_heap_inuse_bytes":  &s.heapInuse,
		"go_memstats_heap_alloc_bytes":  &s.heapAlloc,
		"go_memstats_stack_inuse_bytes": &s.stack,
		"go_memstats_sys_bytes":         &s.goSys,
		"go_memstats_next_gc_bytes":     &s.nextGC,
	} {
		v, ok := m[name]
		if !ok {
			return s, fmt.Errorf("no %s in the agent's /metrics", name)
		}
		*dst = v / (1 << 20)
	}
	s.goroutines = m["go_goroutines"]
	return s, nil
}

func printTable(w io.Writer, samples []sample) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "point\tVmRSS MiB\tRssAnon\tRssFile\tVmHWM\theap in use\theap alloc\tstacks\tGo sys\tnext GC\tgoroutines\t")
	for _, s := range samples {
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.0f\t\n",
			s.point, s.rss, s.anon, s.file, s.hwm, s.heapInuse, s.heapAlloc, s.stack, s.goSys, s.nextGC, s.goroutines)
	}
	_ = tw.Flush()
}
