package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
)

// Exec runs cmd in the Pod's container, as kubectl exec does (websocket,
// then SPDY where the server has no websocket), and returns its output.
func (s *Story) Exec(ctx context.Context, pod string, cmd ...string) (string, error) {
	req := s.Kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(s.NS).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "sh", Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(s.Config, "GET", req.URL().String())
	if err != nil {
		return "", err
	}
	spdy, err := remotecommand.NewSPDYExecutor(s.Config, "POST", req.URL())
	if err != nil {
		return "", err
	}
	executor, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = executor.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		return stdout.String(), fmt.Errorf("kubectl exec %s -- %s: %w: %s", pod, strings.Join(cmd, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String() + stderr.String(), nil
}

// ExecShow runs cmd in the Pod and shows it as `kubectl exec`; a failure
// ends the story.
func (s *Story) ExecShow(ctx context.Context, pod string, cmd ...string) string {
	out, err := s.Exec(ctx, pod, cmd...)
	shown := strings.Join(cmd, " ")
	if len(cmd) == 3 && cmd[0] == "sh" && cmd[1] == "-c" {
		shown = "sh -c '" + cmd[2] + "'"
	}
	s.Show("kubectl exec "+pod+" -- "+shown, out)
	s.Must(err, "running a command in pod/%s", pod)
	return out
}

// ExecWithin runs cmd in the Pod each second until its output, trimmed,
// is want (a Pod's script may not have run yet when it is Ready).
func (s *Story) ExecWithin(ctx context.Context, pod, want string, cmd ...string) {
	s.Within(ctx, fmt.Sprintf("%q from %s in pod/%s", want, strings.Join(cmd, " "), pod), func(ctx context.Context) (bool, string, error) {
		out, err := s.Exec(ctx, pod, cmd...)
		if err != nil {
			return false, err.Error(), nil
		}
		return strings.TrimSpace(out) == want, strings.TrimSpace(out), nil
	})
	s.Show("kubectl exec "+pod+" -- "+strings.Join(cmd, " "), want)
}

// Kubectl runs kubectl as a user would type it and shows it with its
// output: what the story prints for the reader, never what it asserts on
// (client-go reads those). A failure ends the story.
func (s *Story) Kubectl(ctx context.Context, args ...string) string {
	return s.Run(ctx, "kubectl", args...)
}

// Run runs a command on the node and shows it; a failure ends the story.
func (s *Story) Run(ctx context.Context, name string, args ...string) string {
	out, err := s.RunMay(ctx, name, args...)
	s.Must(err, "%s %s", name, strings.Join(args, " "))
	return out
}

// RunMay runs a command on the node and shows it, and returns its failure
// (for a story that expects one).
func (s *Story) RunMay(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	s.Show(name+" "+strings.Join(args, " "), string(out))
	return string(out), err
}

// Kill9 sends SIGKILL to the node's processes whose executable is name and
// whose command line has an argument starting with arg (when not ""): the
// provisioner runs the agent's binary too, without --lvmd-socket. At least
// one must be killed, or the fault did not happen.
func (s *Story) Kill9(name, arg string) {
	killed := kill9(name, arg)
	s.Show(fmt.Sprintf("kill -9 $(pidof %s)", name), fmt.Sprintf("killed %d %s process(es)", killed, name))
	if killed == 0 {
		s.Fatalf("no %s process (with an argument %q) to kill", name, arg)
	}
}

// kill9 is Kill9 without a word: how many it killed. (/proc is how: the
// guest has no pgrep, and these processes are kubelet's or a service
// loop's, with no pidfile of ours.)
func kill9(name, arg string) int {
	killed := 0
	for _, pid := range nodeProcs(name, arg) {
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed++
		}
	}
	return killed
}

// nodeProcs are the node's processes whose executable is name and whose
// command line has an argument starting with arg (when not "").
func nodeProcs(name, arg string) []int {
	comms, _ := filepath.Glob("/proc/[0-9]*/comm")
	var pids []int
	for _, f := range comms {
		comm, err := os.ReadFile(f)
		if err != nil || strings.TrimSpace(string(comm)) != name {
			continue
		}
		dir := filepath.Dir(f)
		if arg != "" {
			cmdline, err := os.ReadFile(dir + "/cmdline")
			if err != nil || !hasArg(cmdline, arg) {
				continue
			}
		}
		pid, _ := strconv.Atoi(filepath.Base(dir))
		pids = append(pids, pid)
	}
	return pids
}

func hasArg(cmdline []byte, prefix string) bool {
	for _, a := range bytes.Split(cmdline, []byte{0}) {
		if bytes.HasPrefix(a, []byte(prefix)) {
			return true
		}
	}
	return false
}

// Get reads url (a Pod's metrics, kubelet's health) with a short deadline.
func Get(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(body), err
}
