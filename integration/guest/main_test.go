//go:build guest

// Package guest is the integration suite that needs real LVM: it runs as root
// inside the test VM (scripts/vm/suite.sh boots one; scripts/guest/suite.sh
// runs it there, and in the Vagrant VM), against a real etcd +
// kube-apiserver, topolvm's real lvmd, google/lvmd, and the real lvm-agent
// binary, and checks every answer against `lvs` as ground truth.
//
// Built on the host, never by `go test ./...` (build tag guest):
//
//	CGO_ENABLED=0 go test -c -tags guest -o guest.test ./integration/guest
//
// It reads where things are from the environment (scripts/guest/suite.sh
// sets it):
//
//	KUBEBUILDER_ASSETS       etcd and kube-apiserver
//	LVM_AGENT_BIN            the lvm-agent binary under test
//	GOOGLE_LVMD_BIN          google/lvmd's server binary
//	LVM_AGENT_GUEST_SCRIPTS  scripts/guest (setup-lvm.sh, start-lvmd.sh)
//	LVMD_SOCKET              topolvm lvmd's socket (/run/topolvm/lvmd.sock)
package guest

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/lvm-agent/lvm-agent/integration/harness"
)

var (
	flagStartTimeout = flag.Duration("guest.start-timeout", 480*time.Second, "how long etcd + kube-apiserver may take to be ready (TCG: 70-110 s, 235 s seen on a busy host)")
	flagBenchN       = flag.Int("guest.bench-n", 9, "TestBench: samples per sequential measurement")
	flagBenchBurst   = flag.Int("guest.bench-burst", 50, "TestBench: creates in the burst")
)

// The test VG layout. setup-lvm.sh makes vg0 (thick class "thick", thin
// class "thin" on vg0/pool0) for topolvm's lvmd; google/lvmd gets a VG of its
// own without a thin pool, because it cannot list a VG that holds one.
const (
	topolvmVG  = "vg0"
	thinPool   = "pool0"
	googleVG   = "vg1"
	googleSize = "1G"
	googlePort = "127.0.0.1:18541"
)

// env is what TestMain set up, shared by every test.
var env struct {
	cp         *harness.ControlPlane
	agentBin   string
	scripts    string
	socket     string
	googleAddr string
	start      time.Time
}

// logf prints a progress line with the time since the binary started.
func logf(format string, a ...any) {
	fmt.Printf("guest [%6.1fs] %s\n", time.Since(env.start).Seconds(), fmt.Sprintf(format, a...))
}

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

// run starts etcd + kube-apiserver first, in the background (the slow part
// under TCG), sets up LVM and both lvmd daemons meanwhile, then runs the
// tests. A missing piece fails the run: inside the VM it is a broken setup,
// and a skip would read as a pass.
func run(m *testing.M) int {
	env.start = time.Now()
	// envtest logs through controller-runtime, which complains (with a stack) when no logger is set.
	ctrllog.SetLogger(klog.NewKlogr())
	env.agentBin = os.Getenv("LVM_AGENT_BIN")
	env.scripts = getenv("LVM_AGENT_GUEST_SCRIPTS", "/opt/lvm-agent/guest")
	env.socket = getenv("LVMD_SOCKET", "/run/topolvm/lvmd.sock")
	googleBin := getenv("GOOGLE_LVMD_BIN", "/opt/lvm-agent/google-lvmd")
	for _, f := range []string{env.agentBin, googleBin, filepath.Join(env.scripts, "setup-lvm.sh")} {
		if _, err := os.Stat(f); err != nil || f == "" {
			fmt.Fprintf(os.Stderr, "guest: missing %q (set LVM_AGENT_BIN, GOOGLE_LVMD_BIN, LVM_AGENT_GUEST_SCRIPTS; see scripts/guest/suite.sh)\n", f)
			return 1
		}
	}
	dir, err := os.MkdirTemp("", "lvm-agent-guest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "guest:", err)
		return 1
	}
	defer os.RemoveAll(dir)

	type started struct {
		cp  *harness.ControlPlane
		err error
	}
	cpc := make(chan started, 1)
	logf("starting etcd + kube-apiserver in the background (timeout %v)", *flagStartTimeout)
	go func() {
		cp, err := harness.StartDevCluster("", dir, *flagStartTimeout)
		cpc <- started{cp, err}
	}()

	setupErr := setupLVM()
	var google *daemon
	if setupErr == nil {
		google, setupErr = startGoogleLVMD(googleBin, filepath.Join(dir, "google-lvmd.log"))
	}
	if google != nil {
		defer google.stop()
	}
	defer func() { _ = script("start-lvmd.sh", "stop") }()
	if setupErr == nil {
		logf("LVM ready: %s (thick + thin pool %s) for topolvm lvmd, %s for google/lvmd; waiting for the API server", topolvmVG, thinPool, googleVG)
	}

	s := <-cpc
	if s.cp != nil {
		defer func() { _ = s.cp.Env.Stop() }()
	}
	switch {
	case setupErr != nil:
		fmt.Fprintln(os.Stderr, "guest: setting up LVM:", setupErr)
		return 1
	case s.err != nil:
		fmt.Fprintln(os.Stderr, "guest:", s.err)
		return 1
	}
	env.cp = s.cp
	logf("etcd + kube-apiserver ready (%s)", env.cp.Config.Host)
	return m.Run()
}

// setupLVM runs the same scripts as the Vagrant VM does, then gives
// google/lvmd its VG. Everything is safe to run again (Vagrant); leftovers of
// an earlier run (LVs named it-* or bench-*) are removed.
func setupLVM() error {
	if err := script("setup-lvm.sh"); err != nil {
		return err
	}
	if err := script("start-lvmd.sh", "start"); err != nil {
		return err
	}
	// google/lvmd's VG: no thin pool (the daemon cannot list a VG that has one).
	if err := scriptEnv([]string{"LVM_VG=" + googleVG, "LVM_LOOP_FILE=/var/lib/lvm-agent/" + googleVG + ".img",
		"LVM_LOOP_SIZE=" + googleSize, "LVM_THIN_POOL_SIZE=0"}, "setup-lvm.sh"); err != nil {
		return err
	}
	for _, vg := range []string{topolvmVG, googleVG} {
		if _, err := lvm("lvremove", "-y", "-S", `lv_name=~"^(it|bench)-"`, vg); err != nil {
			logf("removing leftovers of an earlier run: %v", err)
		}
	}
	return nil
}

// daemon is a background process the suite started.
type daemon struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func (d *daemon) stop() {
	_ = d.cmd.Process.Kill()
	<-d.done
}

// startGoogleLVMD runs google/lvmd on googlePort; it execs lvs, lvcreate...
// by bare name, which setup-lvm.sh put on $PATH.
func startGoogleLVMD(bin, logFile string) (*daemon, error) {
	f, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	d := &daemon{cmd: exec.Command(bin, "-listen", googlePort, "-logtostderr"), done: make(chan struct{})}
	d.cmd.Stdout, d.cmd.Stderr = f, f
	if err := d.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start google/lvmd: %w", err)
	}
	go func() { d.err = d.cmd.Wait(); f.Close(); close(d.done) }()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", googlePort, time.Second); err == nil {
			c.Close()
			env.googleAddr = googlePort
			return d, nil
		}
		select {
		case <-d.done:
			out, _ := os.ReadFile(logFile)
			return nil, fmt.Errorf("google/lvmd exited: %v\n%s", d.err, out)
		case <-time.After(100 * time.Millisecond):
		}
	}
	d.stop()
	return nil, errors.New("google/lvmd did not listen on " + googlePort + " within 60 s")
}

// script runs one of scripts/guest/*.sh.
func script(name string, args ...string) error { return scriptEnv(nil, name, args...) }

// scriptEnv runs a script with extra environment variables (NAME=VALUE).
func scriptEnv(extra []string, name string, args ...string) error {
	cmd := exec.Command("bash", append([]string{filepath.Join(env.scripts, name)}, args...)...)
	cmd.Env = append(append(os.Environ(), "LVMD_SOCKET="+env.socket), extra...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// lvm runs an lvm command: the tests' ground truth and fixtures. (The agent
// itself never forks lvm; only the test does.)
func lvm(args ...string) ([]byte, error) {
	out, err := exec.Command("lvm", args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return out, fmt.Errorf("lvm %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(ee.Stderr)))
		}
		return out, fmt.Errorf("lvm %s: %w", strings.Join(args, " "), err)
	}
	return out, nil
}

func getenv(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
