package main

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
)

// A kube-apiserver's /metrics as it prints them (shortened).
const apiMetrics0 = `# HELP apiserver_watch_events_total [ALPHA] Number of events sent in watch clients
# TYPE apiserver_watch_events_total counter
apiserver_watch_events_total{group="",kind="PersistentVolumeClaim",version="v1"} 100
apiserver_watch_events_total{group="",kind="Event",version="v1"} 10
apiserver_watch_events_sizes_sum{group="",kind="PersistentVolumeClaim",version="v1"} 50000
apiserver_watch_events_sizes_count{group="",kind="PersistentVolumeClaim",version="v1"} 100
apiserver_longrunning_requests{component="apiserver",group="",resource="persistentvolumeclaims",scope="cluster",subresource="",verb="WATCH",version="v1"} 3
`

const apiMetrics1 = `apiserver_watch_events_total{group="",kind="PersistentVolumeClaim",version="v1"} 400
apiserver_watch_events_total{group="",kind="Event",version="v1"} 30
apiserver_watch_events_sizes_sum{group="",kind="PersistentVolumeClaim",version="v1"} 2.05e+06
apiserver_longrunning_requests{component="apiserver",group="",resource="persistentvolumeclaims",scope="cluster",subresource="",verb="WATCH",version="v1"} 7
apiserver_longrunning_requests{component="apiserver",group="",resource="persistentvolumes",scope="cluster",subresource="",verb="WATCH",version="v1"} 5
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="namespace",subresource="log",verb="CONNECT",version="v1"} 9
`

func TestAPICostBetween(t *testing.T) {
	m0, err := harness.ParseMetrics(strings.NewReader(apiMetrics0))
	require.NoError(t, err)
	m1, err := harness.ParseMetrics(strings.NewReader(apiMetrics1))
	require.NoError(t, err)
	a := apiSample{m: m0, proc: procStats{cpuSeconds: 10, rssMiB: 300}}
	b := apiSample{m: m1, proc: procStats{cpuSeconds: 12.5, rssMiB: 320}}
	c := apiCostBetween(a, b)
	assert.InDelta(t, 2.5, c.cpuSeconds, 1e-9)
	assert.Equal(t, 320.0, c.rssMiB)
	assert.Equal(t, 320.0, c.watchEvents, "every kind")
	assert.Equal(t, 300.0, c.pvcEvents)
	assert.InDelta(t, 2.0, c.watchMB, 1e-9)
	assert.Equal(t, 12.0, c.watchers, "WATCH requests only, at the end")

	_, err = harness.ParseMetrics(strings.NewReader("no_value_here\n"))
	assert.Error(t, err)
}

func auditLine(id, stage, verb, uri string, received, at time.Time) string {
	return `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"` + id + `","stage":"` + stage +
		`","requestURI":"` + uri + `","verb":"` + verb + `","user":{"username":"lvm-agent-test"},"objectRef":{"resource":"persistentvolumeclaims","apiVersion":"v1"},` +
		`"requestReceivedTimestamp":"` + received.Format(time.RFC3339Nano) + `","stageTimestamp":"` + at.Format(time.RFC3339Nano) + `"}`
}

func TestListsFromTheAuditLog(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	lines := []string{
		// Three plain lists: a and b overlap, c starts as b ends.
		auditLine("a", "ResponseComplete", "list", "/api/v1/persistentvolumeclaims?labelSelector=%21x&limit=500", at(0), at(300)),
		auditLine("b", "ResponseComplete", "list", "/api/v1/persistentvolumeclaims?limit=500", at(100), at(400)),
		auditLine("c", "ResponseComplete", "list", "/api/v1/persistentvolumes?limit=500", at(400), at(450)),
		// A streamed list: its ResponseStarted and, when the watch ends, its ResponseComplete: one list.
		auditLine("d", "ResponseStarted", "watch", "/api/v1/persistentvolumeclaims?allowWatchBookmarks=true&sendInitialEvents=true&watch=true", at(200), at(201)),
		auditLine("d", "ResponseComplete", "watch", "/api/v1/persistentvolumeclaims?allowWatchBookmarks=true&sendInitialEvents=true&watch=true", at(200), at(60000)),
		// A watch that resumes from a resourceVersion is not a list.
		auditLine("e", "ResponseStarted", "watch", "/api/v1/persistentvolumes?resourceVersion=5&watch=true", at(300), at(301)),
		// Not the list's ResponseComplete: skipped.
		auditLine("f", "ResponseStarted", "list", "/api/v1/persistentvolumes", at(500), at(501)),
		// Two seconds later.
		auditLine("g", "ResponseComplete", "list", "/api/v1/persistentvolumes", at(2500), at(2600)),
	}
	ls, err := parseLists(bufio.NewScanner(strings.NewReader(strings.Join(lines, "\n"))))
	require.NoError(t, err)
	require.Len(t, ls, 5)
	assert.Equal(t, "lvm-agent-test", ls[0].user)
	assert.True(t, ls[2].end.IsZero(), "d is streamed, sorted by its start")

	f := figures(ls, t0, at(10000))
	assert.Equal(t, 5, f.n)
	assert.Equal(t, 1, f.streamed)
	assert.Equal(t, 2500*time.Millisecond, f.span)
	assert.Equal(t, 4, f.peakPerSecond, "a, b, d, c within a second")
	assert.Equal(t, 2, f.peakConcurrent, "a+b; c starts as b ends")

	f = figures(ls, at(1000), at(10000))
	assert.Equal(t, listFigures{n: 1, peakPerSecond: 1, peakConcurrent: 1}, f)
	assert.Equal(t, listFigures{}, figures(ls, at(3000), at(4000)))

	_, err = parseLists(bufio.NewScanner(strings.NewReader("{")))
	assert.Error(t, err)
}

func TestHeadlines(t *testing.T) {
	row := func(mode string, n int, cpu float64, rss float64) fleetRow {
		return fleetRow{mode: mode, nodes: n, transitions: 2000, work: apiCost{cpuSeconds: cpu + 2, rssMiB: rss}, idle: 0.1, seconds: 20}
	}
	rows := []fleetRow{row("labelled", 1, 10, 300), row("all", 1, 10, 300), row("labelled", 300, 11, 330), row("all", 300, 40, 900), row("hybrid", 1, 10, 300)}
	h := headlines(rows)
	require.Len(t, h, 2, "hybrid ran at one N only")
	assert.Contains(t, h[0], "labelled: API server CPU per transition at N=300 / N=1: 5.50 / 5.00 ms = 1.10 (goal <= 1.2); gross (idle not subtracted) 6.50 / 6.00 ms = 1.08; RSS 330 / 300 MiB = 1.10")
	assert.Contains(t, h[1], "all: API server CPU per transition at N=300 / N=1: 20.00 / 5.00 ms = 4.00 (the original design); gross (idle not subtracted) 21.00 / 6.00 ms = 3.50")

	var out bytes.Buffer
	b := fleetBurst{mode: "labelled", nodes: 100, n: 10000, latency: time.Second, total: 105 * time.Second}
	assert.Equal(t, 100*time.Second, b.floor())
	assert.InDelta(t, 1.05, b.ratio(), 1e-9)
	printFleet(&out, config{}, fleetConfig{}, &fleetResult{rows: rows, bursts: []fleetBurst{b}})
	assert.Contains(t, out.String(), "burst, labelled, N=100: 1.050 x one node's floor (goal <= 1.10)")
}

func TestRequestsPer(t *testing.T) {
	work := metrics{
		`apiserver_request_total{code="200",resource="persistentvolumeclaims",verb="PATCH"}`:     2000,
		`apiserver_request_total{code="409",resource="persistentvolumeclaims",verb="PATCH"}`:     100,
		`apiserver_request_total{code="201",resource="events",verb="POST"}`:                      1000,
		`apiserver_request_total{code="200",resource="nodes",subresource="status",verb="PATCH"}`: 5,
		`apiserver_request_total{code="200",resource="leases",verb="PUT"}`:                       40,
		`apiserver_watch_events_total{kind="Node"}`:                                              7,
	}
	idle := metrics{`apiserver_request_total{code="200",resource="leases",verb="PUT"}`: 20}
	// 20 s of work, 10 s of idle: the leases are all idle (40 - 20 x 2).
	got := requestsPer(work, idle, 20, 10, 1000)
	assert.Equal(t, "PATCH persistentvolumeclaims 2.10; POST events 1.00", got)
	assert.Equal(t, "status", label(`x{resource="nodes",subresource="status"}`, "subresource"))
	assert.Equal(t, "", label(`x{subresource="status"}`, "resource"), "a key that only ends another")
}

func TestBurstAttribution(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	// Node a: its two requests seen at 1 s and 2 s, answered at 3 s and 5 s:
	// nothing open for its first second only. Node b: seen at 0.5 s,
	// answered at 2 s, the next seen at 4 s, answered at 6 s: nothing open
	// for 0.5 s + 2 s.
	names := []string{"a0", "b0", "a1", "b1"}
	node := func(i int) string { return names[i][:1] }
	obs := &observer{requested: map[string]time.Time{"a0": at(1), "b0": at(0.5), "a1": at(2), "b1": at(4)},
		answered: map[string]time.Time{"a0": at(3), "b0": at(2), "a1": at(5), "b1": at(6)}}
	rr := requestsResult{total: 6 * time.Second,
		sent:    []time.Time{at(0), at(0), at(0.4), at(3.5)},
		written: []time.Time{at(0.2), at(0.3), at(0.5), at(3.9)}}
	b := fleetBurst{nodes: 2, n: 4, latency: time.Second, slept: 1100 * time.Millisecond, agentCPU: 2}
	b0 := burstSample{at: at(0), host: 10, apiCPU: 1, etcd: procStats{cpuSeconds: 1}, bench: procStats{cpuSeconds: 1}, agents: metrics{}}
	b1 := burstSample{at: at(10), host: 16, apiCPU: 3, etcd: procStats{cpuSeconds: 1.5}, bench: procStats{cpuSeconds: 1.5}, agents: metrics{}}
	w := attribute(b, b0, b1, rr, obs, names, node)

	assert.Equal(t, 3900*time.Millisecond, w.writeSpan, "first sent -> last written")
	assert.Equal(t, 1750*time.Millisecond, w.starved, "mean of 1 s and 2.5 s")
	assert.Equal(t, 2500*time.Millisecond, w.starvedMax)
	assert.Equal(t, 5500*time.Millisecond, w.nodeSpan, "mean of 5 s and 6 s")
	assert.InDelta(t, 5.0, w.ours(), 1e-9, "2 + 0.5 + 0.5 + 2")
	assert.InDelta(t, 1.0, w.hostCPU-w.ours(), 1e-9, "the host's other jobs")
	assert.InDelta(t, 6.0/(float64(w.cores)*10), w.share(w.hostCPU), 1e-9, "over the 10 s between the samples")
	late, starved, rest := w.over()
	assert.Equal(t, 200*time.Millisecond, late, "two sleeps 100 ms late")
	assert.Equal(t, w.starved, starved)
	assert.Equal(t, 5500*time.Millisecond-2*time.Second-late-starved, rest)
}

func TestObserverRecord(t *testing.T) {
	o := &observer{answered: map[string]time.Time{}, requested: map[string]time.Time{}, failed: map[string]string{}, waiters: map[string]chan struct{}{}}
	pvc := func(name, state string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name,
			Annotations: map[string]string{kube.AnnLifecycle: state, kube.AnnReason: "NoSpace", kube.AnnError: "full"}}}
	}
	t1, t2 := time.Unix(1, 0), time.Unix(2, 0)
	wait := make(chan struct{})
	o.waiters["a"] = wait
	o.record(pvc("a", kube.StateCreating), t1)
	o.record(pvc("a", kube.StateCreating), t2) // the first sighting counts
	got, ok := o.request("a")
	require.True(t, ok)
	assert.Equal(t, t1, got)
	_, ok = o.answer("a")
	assert.False(t, ok)

	o.record(pvc("a", kube.StateCreated), t2)
	<-wait // closed by the answer
	got, _ = o.answer("a")
	assert.Equal(t, t2, got)
	o.record(pvc("a", kube.StateCreated), time.Unix(3, 0)) // a re-list's sighting does not move it
	got, _ = o.answer("a")
	assert.Equal(t, t2, got)
	_, failed := o.failure("a")
	assert.False(t, failed)

	o.record(pvc("b", kube.StateFailed), t2)
	f, failed := o.failure("b")
	assert.True(t, failed)
	assert.Equal(t, "NoSpace: full", f)
}
