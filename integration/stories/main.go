// Command lvm-stories tells the guest's stories. It runs inside the QEMU
// test guest (scripts/guest/node.sh starts it) against the guest's one-node
// cluster: client-go for the objects, the node's `lvm` for the rows. Each
// step says what it shows and prints what a user would type and see, and
// each assertion is about the object or row the story is about. Shell boots
// the guest and builds the assets; the stories live here.
//
//	lvm-stories [-namespace NS] [-vg VG] [-wait DURATION] [-clock SECONDS] STORY...
//
// STORY is a story's name (wipe/thick) or what comes before its slash
// (wipe: every wipe/... story). Each story runs to its end or its first
// failed assertion, then its cleanups run; the next story runs either way.
// The exit code is 1 when a story failed. KUBECONFIG names the cluster.
//
// A new story is a func(context.Context, *Story) in a file of its own and
// one row in stories below.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

var stories = []struct {
	name string
	run  func(context.Context, *Story)
}{
	{"cluster/emptydir", emptyDir}, // before lvm-agent is installed
	{"demo/filesystem", demoFilesystem},
	{"demo/block", demoBlock},
	{"grow/ext4", growExt4},
	{"grow/xfs", growXFS},
	{"clone/thin-and-thick", clones},
	{"wipe/thick", wipeThick},
	{"wipe/thin", wipeThin},
	{"wipe/clone", wipeClone},
	{"crypt/volumes", cryptVolumes},
	{"bench-crypt/rounds", benchCrypt},
	{"full/too-large", tooLarge},
	{"full/kills", killsBurst},
	{"full/retain", retain},
	{"faults/rounds", faultRounds}, // make test-faults
}

// tools are commands of their own, named by the first argument; each is a
// func(args) exit code in a file of its own.
var tools = map[string]func(args []string) int{}

func main() {
	// Tools beside the stories, for the guest's shell: `lvm-stories timeline ...`.
	if len(os.Args) > 1 {
		if tool, ok := tools[os.Args[1]]; ok {
			os.Exit(tool(os.Args[2:]))
		}
	}
	ns := flag.String("namespace", "default", "the namespace of the stories' PVCs and Pods")
	vg := flag.String("vg", "vg1", "the volume group the classes use")
	deadline := flag.Duration("wait", 10*time.Minute, "the deadline of each wait (a Pod started, a PV gone...)")
	deploy := flag.String("deploy", "/opt/lvm-agent/deploy", "deploy/ (its examples' classes are applied as a user would)")
	install := flag.String("install", "kustomize", "how lvm-agent was installed: kustomize, helm, host-lvmd or systemd")
	faults := flag.String("faults", "agent,lvmd,lvmd-away,kubelet,containerd,kube-apiserver,vg-full", "faults/rounds' faults, in order")
	clock := flag.Int("clock", 0, "seconds already on the headings' clock (node.sh passes its own)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: lvm-stories [flags] STORY...   (STORY: a name, or its part before the slash)")
		flag.PrintDefaults()
		fmt.Fprintln(os.Stderr, "stories:")
		for _, st := range stories {
			fmt.Fprintln(os.Stderr, "  "+st.name)
		}
	}
	flag.Parse()
	var picked []int
	for _, arg := range flag.Args() {
		n := len(picked)
		for i, st := range stories {
			if st.name == arg || strings.HasPrefix(st.name, arg+"/") {
				picked = append(picked, i)
			}
		}
		if len(picked) == n {
			fmt.Fprintf(os.Stderr, "lvm-stories: no story %q\n", arg)
			flag.Usage()
			os.Exit(2)
		}
	}
	if len(picked) == 0 {
		flag.Usage()
		os.Exit(2)
	}
	cfg, kube, err := connect()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lvm-stories:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	t0 := time.Now().Add(-time.Duration(*clock) * time.Second)
	var failed []string
	for _, i := range picked {
		s := &Story{Name: stories[i].name, Kube: kube, Config: cfg, Deploy: *deploy, Install: *install, Faults: strings.Split(*faults, ","), NS: *ns, VG: *vg, Wait: *deadline,
			out: os.Stdout, t0: t0, times: os.Getenv("LVM_AGENT_GUEST_TIMES")}
		if !s.run(ctx, stories[i].run) {
			failed = append(failed, s.Name)
		}
	}
	if len(failed) > 0 {
		fmt.Printf("lvm-stories: FAILED: %s\n", strings.Join(failed, ", "))
		os.Exit(1)
	}
	fmt.Printf("lvm-stories: OK (%d stories)\n", len(picked))
}

// connect reads $KUBECONFIG: the cluster's client.
func connect() (*rest.Config, kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		return nil, nil, fmt.Errorf("the cluster ($KUBECONFIG): %w", err)
	}
	cfg.UserAgent = "lvm-stories"
	// Each request ends: a wait asks again (an API server killed by a
	// story may leave a connection that never answers).
	cfg.Timeout = 30 * time.Second
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("the cluster ($KUBECONFIG): %w", err)
	}
	return cfg, kube, nil
}

// Story is what a story is told with: its steps, what it shows, its
// assertions and its cleanups, and the cluster and volume group.
type Story struct {
	Name    string
	Kube    kubernetes.Interface
	Config  *rest.Config // for exec
	Deploy  string       // deploy/ as the guest has it (examples, overlays)
	Install string       // how lvm-agent was installed: kustomize, helm, host-lvmd or systemd
	Faults  []string     // the faults' rounds, in order (faults/rounds)
	NodeLVs []string     // LVs of the node's own (its state), never a claim's: the audit leaves them out
	NS      string       // the namespace of its objects
	VG      string
	Wait    time.Duration // the deadline of each wait

	out      io.Writer
	t0       time.Time // the headings' clock
	times    string    // $LVM_AGENT_GUEST_TIMES
	title    string    // the step under way
	at       time.Time // and its start
	cleanups []func(context.Context)
}

// failure ends a story: Fatalf panics with it, run recovers it (as
// testing's FailNow ends a test).
type failure struct{ msg string }

func (f failure) Error() string { return f.msg }

// Fatalf ends the story: the message names the object or row and the values.
func (s *Story) Fatalf(format string, args ...any) { panic(failure{fmt.Sprintf(format, args...)}) }

// Must ends the story when err is not nil, saying what was being done.
func (s *Story) Must(err error, doing string, args ...any) {
	if err != nil {
		s.Fatalf("%s: %v", fmt.Sprintf(doing, args...), err)
	}
}

// Cleanup registers f to run when the story ends, failed or not, after the
// cleanups registered later.
func (s *Story) Cleanup(f func(context.Context)) { s.cleanups = append(s.cleanups, f) }

// Step starts a step: a heading with the time so far (node.sh's step), and
// why it matters, a line each. The step before it ends there.
func (s *Story) Step(title string, why ...string) {
	s.endStep()
	s.title, s.at = s.Name+": "+title, time.Now()
	fmt.Fprintf(s.out, "\n==> [%3d s] %s\n", int(time.Since(s.t0).Seconds()), s.title)
	for _, w := range why {
		fmt.Fprintf(s.out, "    %s\n", w)
	}
}

// endStep prints the step's wall time and, when $LVM_AGENT_GUEST_TIMES is
// set, appends it there as node.sh's step_time does (make test's table).
func (s *Story) endStep() {
	if s.title == "" {
		return
	}
	secs := int(time.Since(s.at).Round(time.Second).Seconds())
	fmt.Fprintf(s.out, "    (step: %d s)\n", secs)
	if s.times != "" {
		f, err := os.OpenFile(s.times, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			_, err = fmt.Fprintf(f, "node: %s\t%d\n", s.title, secs)
			err = errors.Join(err, f.Close())
		}
		if err != nil {
			fmt.Fprintln(s.out, "    (the step's time was not recorded:", err, ")")
		}
	}
	s.title = ""
}

// Show prints a command as a user would type it and its result.
func (s *Story) Show(cmd, result string) {
	fmt.Fprintf(s.out, "$ %s\n", cmd)
	if result != "" {
		fmt.Fprint(s.out, strings.TrimRight(result, "\n")+"\n")
	}
}

// Say prints a line of the story's own (a count, a finding).
func (s *Story) Say(format string, args ...any) { fmt.Fprintf(s.out, "    "+format+"\n", args...) }

// run tells the story, then runs its cleanups; false when either failed.
func (s *Story) run(ctx context.Context, story func(context.Context, *Story)) bool {
	ok := s.try(func() { story(ctx, s) })
	if len(s.cleanups) > 0 {
		s.Step("cleanup", "What the story made goes: its Pods and PVCs, then their PVs and LVs.")
		for i := len(s.cleanups) - 1; i >= 0; i-- {
			ok = s.try(func() { s.cleanups[i](ctx) }) && ok
		}
	}
	s.endStep()
	return ok
}

// try runs f; a failure is printed (FAILED: make test's summary finds it)
// and is false.
func (s *Story) try(f func()) (ok bool) {
	defer func() {
		if v := recover(); v != nil {
			fl, isFailure := v.(failure)
			if !isFailure {
				panic(v)
			}
			fmt.Fprintf(s.out, "%s: FAILED: %s\n", s.Name, fl.msg)
			ok = false
		}
	}()
	f()
	return true
}
