package integration

import (
	"bufio"
	"context"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestTmpSample(t *testing.T) {
	createNode(t, "node-"+sanitize(t.Name()))
	addr := freeAddr(t)
	n := startNode(t, "--metrics-address", addr)
	waitHTTP(t, addr, "/readyz", http.StatusOK)
	require.NoError(t, n.create(t, "default", "sample", spec("lv-sample", "10Mi")))
	waitMetric(t, addr, `lvm_agent_operation_duration_seconds_count{kind="create",result="created"}`, 1)
	waitTopology(t, n.name, wantTopology(1<<30-12<<20, 2<<30))
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	f, _ := os.Create("/tmp/ops-sample-metrics.txt")
	defer f.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "lvm_agent_") && !strings.Contains(sc.Text(), "_bucket") {
			f.WriteString(sc.Text() + "\n")
		}
	}
	node, _ := cp.Client.CoreV1().Nodes().Get(context.Background(), n.name, metav1.GetOptions{})
	os.WriteFile("/tmp/ops-sample-node.txt", []byte(node.Annotations["csi.alibabacloud.com/storage-topology"]), 0o644)
	_, out, _ := runCLI(t, "status", "--node", n.name, "--lvmd-socket", n.socket)
	os.WriteFile("/tmp/ops-sample-status.txt", []byte(out), 0o644)
}
