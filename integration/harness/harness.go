// Package harness starts the real parts the integration tests run against: a
// real etcd + kube-apiserver (controller-runtime's envtest, binaries built by
// scripts/kube-assets.sh) and the real lvm-agent binary as a child process.
package harness

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

// TB is the part of testing.TB the harness needs, so that TestMain and
// non-test programs can use it too.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Cleanup(func())
	TempDir() string
	Failed() bool
}

// ProgramTB is a TB for code outside a test, a TestMain or a program: a
// failure panics, Logf writes to Log, and the cleanups and temporary
// directories wait for Close.
type ProgramTB struct {
	Log      io.Writer
	cleanups []func()
	dirs     []string
}

func (p *ProgramTB) Helper()                   {}
func (p *ProgramTB) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (p *ProgramTB) Logf(f string, a ...any)   { fmt.Fprintf(p.Log, f+"\n", a...) }
func (p *ProgramTB) Cleanup(f func())          { p.cleanups = append(p.cleanups, f) }
func (p *ProgramTB) Failed() bool              { return false }

func (p *ProgramTB) TempDir() string {
	d, err := os.MkdirTemp("", "lvm-agent")
	if err != nil {
		panic(err)
	}
	p.dirs = append(p.dirs, d)
	return d
}

// Close runs the cleanups, last first, and removes the temporary directories.
func (p *ProgramTB) Close() {
	for i := len(p.cleanups) - 1; i >= 0; i-- {
		p.cleanups[i]()
	}
	for _, d := range p.dirs {
		os.RemoveAll(d)
	}
}

// ControlPlane is a running etcd + kube-apiserver.
type ControlPlane struct {
	Env        *envtest.Environment
	Config     *rest.Config
	Client     kubernetes.Interface
	Kubeconfig string // an admin kubeconfig file for child processes
}

// StartControlPlane starts etcd and kube-apiserver from $KUBEBUILDER_ASSETS
// for a test. A missing asset is a test failure, never a skip: `make test`
// builds them.
func StartControlPlane(t TB, startTimeout time.Duration) *ControlPlane {
	t.Helper()
	cp, err := StartDevCluster("", t.TempDir(), startTimeout)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { _ = cp.Env.Stop() })
	return cp
}

// Process is a running lvm-agent.
type Process struct {
	Cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
	err  error
}

// AgentBinary is the lvm-agent binary under test: $LVM_AGENT_BIN, or built
// once from the module into dir as `make build` builds it: the node agent's
// build (-tags nodeagent), lvm-agent-provisioner beside it, both with
// grpcnotrace and stamped with scripts/version.sh's linker flags.
func AgentBinary(t TB, dir string) string {
	t.Helper()
	if bin := os.Getenv("LVM_AGENT_BIN"); bin != "" {
		return bin
	}
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	ldflags, err := exec.Command(filepath.Join(filepath.Dir(strings.TrimSpace(string(gomod))), "scripts", "version.sh")).Output()
	if err != nil {
		t.Fatalf("scripts/version.sh: %v", err)
	}
	for name, tags := range map[string]string{"lvm-agent": "nodeagent,grpcnotrace", "lvm-agent-provisioner": "grpcnotrace"} {
		cmd := exec.Command("go", "build", "-tags", tags, "-ldflags", strings.TrimSpace(string(ldflags)),
			"-o", filepath.Join(dir, name), "github.com/lvm-agent/lvm-agent/cmd/lvm-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", name, err, out)
		}
	}
	return filepath.Join(dir, "lvm-agent")
}

// StartAgent runs bin with args; its output is kept for Output and shown when the test fails.
func StartAgent(t TB, bin string, args ...string) *Process {
	t.Helper()
	p := &Process{Cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.Cmd.Stdout, p.Cmd.Stderr = (*lockedWriter)(p), (*lockedWriter)(p)
	if err := p.Cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() { p.err = p.Cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("lvm-agent %v output:\n%s", args, p.Output())
		}
	})
	return p
}

type lockedWriter Process

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.Write(b)
}

// Output is what the process printed so far.
func (p *Process) Output() string { p.mu.Lock(); defer p.mu.Unlock(); return p.out.String() }

// Kill sends SIGKILL and waits.
func (p *Process) Kill() {
	_ = p.Cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Signal sends sig and waits up to timeout for the exit code.
func (p *Process) Signal(sig syscall.Signal, timeout time.Duration) (int, error) {
	_ = p.Cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(timeout):
		return -1, fmt.Errorf("no exit %v after %v", sig, timeout)
	}
	if p.Cmd.ProcessState == nil {
		return -1, p.err
	}
	return p.Cmd.ProcessState.ExitCode(), nil
}

// ServeLVMD serves lvm as topolvm's lvmd (the fake) on a unix socket until
// the test ends, and returns the server and the socket's path. The socket
// is in a directory of its own under $TMPDIR: a test's TempDir, named after
// the test, can make a path longer than a unix socket's 108 bytes.
func ServeLVMD(t TB, lvm *lvmdfake.LVM) (*lvmdfake.Topolvm, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "lvmd")
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	srv := lvmdfake.NewTopolvm(lvm)
	socket := filepath.Join(dir, "lvmd.sock")
	if err := srv.Serve(socket); err != nil {
		t.Fatalf("serve the fake lvmd: %v", err)
	}
	t.Cleanup(srv.Stop)
	return srv, socket
}

// FreeAddr is a loopback address with a port free at the time of the call,
// for a child process to listen on. The port is drawn at random below the
// kernel's ephemeral range (net.ipv4.ip_local_port_range): a port that
// Listen(":0") returned, once closed, can be handed out again as the local
// port of an outgoing connection before the child binds it (seen with 300
// agents dialling one API server), while ports below that range are only
// ever bound on purpose. A port is never handed out twice by one process.
func FreeAddr(t TB) string {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 11000 {
				low = n
			}
		}
	}
	handedMu.Lock()
	defer handedMu.Unlock()
	for range 1000 {
		port := 10000 + rand.IntN(low-10000)
		if handed[port] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		handed[port] = true
		return l.Addr().String()
	}
	t.Fatalf("no free port in 127.0.0.1:10000-%d after 1000 tries", low-1)
	return ""
}

var (
	handedMu sync.Mutex
	handed   = map[int]bool{}
)
