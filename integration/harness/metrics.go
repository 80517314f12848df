package harness

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// ReadMetrics scrapes the agent's /metrics at addr into series → value. A
// series is written as the text format prints it, name{label="value",...}
// with the labels sorted. A line that does not parse is an error.
func ReadMetrics(addr string) (map[string]float64, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return ParseMetrics(resp.Body)
}

// ParseMetrics reads the Prometheus text format (an agent's or a
// kube-apiserver's /metrics) into series → value, as ReadMetrics.
func ParseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i <= 0 {
			return nil, fmt.Errorf("metrics line %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// ProcMemory reads the memory lines of /proc/PID/status (VmRSS, VmHWM,
// RssAnon, RssFile, ...) into name → MiB, the name without its colon.
func ProcMemory(pid int) (map[string]float64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	m := map[string]float64{}
	for _, line := range strings.Split(string(status), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[2] == "kB" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			m[strings.TrimSuffix(f[0], ":")] = kb / 1024
		}
	}
	return m, nil
}

// WaitAgentReady polls an agent's /readyz at addr (its informers synced and
// lvmd reachable) until it answers 200, the process exits or timeout.
func WaitAgentReady(ctx context.Context, p *Process, addr string, timeout time.Duration) error {
	c := http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(10 * time.Millisecond) {
		if resp, err := c.Get("http://" + addr + "/readyz"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if p.Cmd.ProcessState != nil {
			return fmt.Errorf("lvm-agent exited:\n%s", p.Output())
		}
	}
	return fmt.Errorf("lvm-agent not ready after %v:\n%s", timeout, p.Output())
}
