package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
)

// The agent's /metrics after real requests, and /readyz following lvmd.
func TestMetricsAndReadiness(t *testing.T) {
	addr := harness.FreeAddr(t)
	n := startNode(t, "--metrics-address", addr)
	waitHTTP(t, addr, "/readyz", http.StatusOK)
	assert.Equal(t, http.StatusOK, httpStatus(addr, "/healthz"))

	// Every series is polled for: the API server shows an answer a moment
	// before the agent has counted it, the capacity stream runs on its own,
	// and a scrape gathers the collectors in parallel, so it can see one
	// of them updated and not yet another.
	waitMetric(t, addr, `lvm_agent_informers_synced`, 1)
	waitMetric(t, addr, `lvm_agent_lvmd_reachable`, 1)
	waitMetric(t, addr, `lvm_agent_device_class_size_bytes{device_class="vg1"}`, float64(1<<30))
	waitMetric(t, addr, `lvm_agent_device_class_free_bytes{device_class="vg1"}`, float64(1<<30))
	waitMetric(t, addr, `lvm_agent_device_class_free_bytes{device_class="thin"}`, float64(2<<30)) // overprovisioned x2

	require.NoError(t, n.create(t, "default", "metrics", spec("lv-metrics", "10Mi")))
	waitMetric(t, addr, `lvm_agent_operation_duration_seconds_count{kind="create",result="created"}`, 1)
	waitMetric(t, addr, `lvm_agent_operations_total{kind="create",result="created"}`, 1)
	waitMetric(t, addr, `lvm_agent_api_writes_total{object="pvc",result="ok"}`, 1)
	// The capacity stream reports the new LV (rounded up to 12 MiB).
	waitMetric(t, addr, `lvm_agent_device_class_free_bytes{device_class="vg1"}`, float64(1<<30-12<<20))

	pvc, err := cp.Client.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), "metrics", metav1.GetOptions{})
	require.NoError(t, err)
	harness.PV(t, cp.Client, "pv-metrics", n.name, kube.DefaultDriver, pvc)
	harness.DeleteClaim(t, cp.Client, pvc)
	require.NoError(t, deleteVolume(t, "pv-metrics", "vg1", "lv-metrics"))
	waitMetric(t, addr, `lvm_agent_operation_duration_seconds_count{kind="delete",result="deleted"}`, 1)
	waitMetric(t, addr, `lvm_agent_operations_total{kind="delete",result="deleted"}`, 1)
	waitMetric(t, addr, `lvm_agent_api_writes_total{object="pv",result="ok"}`, 1)
	waitMetric(t, addr, `lvm_agent_device_class_free_bytes{device_class="vg1"}`, float64(1<<30))
	m := waitMetric(t, addr, `lvm_agent_open_requests`, 0)
	assert.Equal(t, 0.0, m[`lvm_agent_retries_total`])
	assert.Equal(t, 0.0, m[`lvm_agent_workqueue_depth{name="lvm-agent"}`])
	assert.GreaterOrEqual(t, m[`lvm_agent_workqueue_adds_total{name="lvm-agent"}`], 2.0)
	assert.Contains(t, m, `lvm_agent_workqueue_longest_running_processor_seconds{name="lvm-agent"}`)

	// lvmd goes away: not ready, and a request waits with retries.
	n.lvmd.Stop()
	waitHTTP(t, addr, "/readyz", http.StatusServiceUnavailable)
	assert.Equal(t, http.StatusOK, httpStatus(addr, "/healthz"), "alive while lvmd is down")
	waitMetric(t, addr, `lvm_agent_lvmd_reachable`, 0)
	harness.PVC(t, cp.Client, "default", "metrics-waits", n.name)
	done := make(chan error, 1)
	go func() { done <- n.request(t, "default", "metrics-waits", spec("lv-metrics-waits", "4Mi")) }()
	waitMetric(t, addr, `lvm_agent_open_requests`, 1)
	atLeastOne := func(v float64) bool { return v >= 1 }
	waitMetricFunc(t, addr, `lvm_agent_retries_total`, atLeastOne)
	waitMetricFunc(t, addr, `lvm_agent_operations_total{kind="create",result="retry"}`, atLeastOne)

	// lvmd is back: ready again, and the waiting request is done.
	require.NoError(t, n.lvmd.Serve(n.socket))
	waitHTTP(t, addr, "/readyz", http.StatusOK)
	require.NoError(t, <-done)
	waitMetric(t, addr, `lvm_agent_operation_duration_seconds_count{kind="create",result="created"}`, 2)
	waitMetric(t, addr, `lvm_agent_operations_total{kind="create",result="created"}`, 2)
	waitMetric(t, addr, `lvm_agent_lvmd_reachable`, 1)
	waitMetric(t, addr, `lvm_agent_open_requests`, 0)
}

func httpStatus(addr, path string) int {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func waitHTTP(t *testing.T, addr, path string, want int) {
	t.Helper()
	require.Eventually(t, func() bool { return httpStatus(addr, path) == want }, 30*time.Second, 50*time.Millisecond,
		"GET %s never answered %d", path, want)
}

// scrape reads /metrics into series → value; a series is written as the
// text format prints it: name{label="value",...} with labels sorted.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	m, err := harness.ReadMetrics(addr)
	require.NoError(t, err)
	return m
}

func waitMetric(t *testing.T, addr, series string, want float64) map[string]float64 {
	t.Helper()
	return waitMetricFunc(t, addr, series, func(v float64) bool { return v == want })
}

// waitMetricFunc polls /metrics until series exists with a value ok accepts.
func waitMetricFunc(t *testing.T, addr, series string, ok func(float64) bool) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		m, err := harness.ReadMetrics(addr)
		if err == nil {
			if v, found := m[series]; found && ok(v) {
				return m
			}
		}
		if time.Now().After(deadline) {
			require.FailNow(t, fmt.Sprintf("%s never reached the expected value; last scrape: value %v, error %v", series, m[series], err))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
