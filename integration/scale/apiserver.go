package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/lvm-agent/lvm-agent/integration/harness"
)

// apiSample is one look at the kube-apiserver process and its /metrics.
type apiSample struct {
	at   time.Time
	pid  int
	proc procStats
	m    metrics
}

// sampleAPIServer reads /proc of the kube-apiserver and scrapes its /metrics.
func sampleAPIServer(ctx context.Context, cp *harness.ControlPlane) (apiSample, error) {
	s := apiSample{at: time.Now()}
	var err error
	if s.pid, err = cp.APIServerPID(); err != nil {
		return s, err
	}
	if s.proc, err = pidStats(s.pid); err != nil {
		return s, err
	}
	raw, err := cp.Client.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return s, fmt.Errorf("kube-apiserver /metrics: %w", err)
	}
	m, err := harness.ParseMetrics(bytes.NewReader(raw))
	s.m = metrics(m)
	return s, err
}

// apiCost is what the API server spent between two samples (of the same process).
type apiCost struct {
	cpuSeconds  float64
	rssMiB      float64 // at the end
	watchEvents float64 // apiserver_watch_events_total: events sent to watchers, all kinds
	watchMB     float64 // apiserver_watch_events_sizes_sum: their encoded bytes
	// watches open at the end, all resources: apiserver_longrunning_requests
	// of the WATCH verbs (1.37 no longer serves apiserver_registered_watchers).
	watchers  float64
	pvcEvents float64 // of them, PersistentVolumeClaim events
}

func apiCostBetween(a, b apiSample) apiCost {
	d := b.m.sub(a.m)
	return apiCost{
		cpuSeconds:  b.proc.cpuSeconds - a.proc.cpuSeconds,
		rssMiB:      b.proc.rssMiB,
		watchEvents: d.sum("apiserver_watch_events_total"),
		watchMB:     d.sum("apiserver_watch_events_sizes_sum") / 1e6,
		watchers:    b.m.sum("apiserver_longrunning_requests", `verb="WATCH`),
		pvcEvents:   d.sum("apiserver_watch_events_total", `kind="PersistentVolumeClaim"`),
	}
}

// The audit log records the PVC/PV lists and watches (metadata only), so
// that the bench can count the agents' lists and see when they ran: the API
// server's own metrics count requests but do not say when, and a scrape
// misses the peaks of its in-flight gauges.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  verbs: ["list", "watch"]
  resources:
  - group: ""
    resources: ["persistentvolumeclaims", "persistentvolumes"]
- level: None
`

// auditArgs are the kube-apiserver flags that write the audit log at path
// (its policy next to it).
func auditArgs(path string) (map[string]string, error) {
	policy := path + ".policy.yaml"
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		return nil, err
	}
	return map[string]string{"audit-policy-file": policy, "audit-log-path": path, "audit-log-maxsize": "0",
		"audit-log-format": "json", "audit-log-mode": "batch", "audit-log-batch-max-wait": "1s"}, nil
}

// list is one list of PVCs or PVs the API server served: a plain list
// (received → response complete), or an informer's streamed list, a watch
// with sendInitialEvents=true (client-go's WatchListClient, on by default),
// whose list part ends inside the watch's stream, which an audit log does
// not see: it has a start only.
type list struct {
	user     string
	resource string
	start    time.Time
	end      time.Time // zero for a streamed list
}

type auditEvent struct {
	AuditID    string `json:"auditID"`
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef struct {
		Resource string `json:"resource"`
	} `json:"objectRef"`
	Received time.Time `json:"requestReceivedTimestamp"`
	At       time.Time `json:"stageTimestamp"`
}

// readLists parses an audit log (JSON lines) into the lists it records.
func readLists(path string) ([]list, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseLists(bufio.NewScanner(f))
}

func parseLists(sc *bufio.Scanner) ([]list, error) {
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	seen := map[string]bool{}
	var out []list
	for sc.Scan() {
		var e auditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("audit line %q: %w", sc.Text(), err)
		}
		l := list{user: e.User.Username, resource: e.ObjectRef.Resource, start: e.Received}
		switch {
		case e.Verb == "list" && e.Stage == "ResponseComplete":
			l.end = e.At
		case e.Verb == "watch" && strings.Contains(e.RequestURI, "sendInitialEvents=true") && !seen[e.AuditID]:
			// ResponseStarted, then ResponseComplete when the watch ends: one list.
		default:
			continue
		}
		seen[e.AuditID] = true
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start.Before(out[j].start) })
	return out, sc.Err()
}

// listFigures sums up the lists that started in [from, to).
type listFigures struct {
	n, streamed int
	span        time.Duration // first start to last start
	// peakPerSecond is the most lists started within one second.
	peakPerSecond int
	// peakConcurrent is the most plain lists in flight at once (streamed
	// lists have no end in the log; they count in peakPerSecond only).
	peakConcurrent int
}

func figures(ls []list, from, to time.Time) listFigures {
	var f listFigures
	var in []list
	for _, l := range ls {
		if !l.start.Before(from) && l.start.Before(to) {
			in = append(in, l)
		}
	}
	f.n = len(in)
	if f.n == 0 {
		return f
	}
	f.span = in[len(in)-1].start.Sub(in[0].start)
	type edge struct {
		t time.Time
		d int
	}
	var edges []edge
	j := 0
	for i, l := range in {
		for l.start.Sub(in[j].start) >= time.Second {
			j++
		}
		f.peakPerSecond = max(f.peakPerSecond, i-j+1)
		if l.end.IsZero() {
			f.streamed++
			continue
		}
		edges = append(edges, edge{l.start, 1}, edge{l.end, -1})
	}
	// Ends before starts at the same instant: touching is not overlapping.
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].t.Equal(edges[j].t) {
			return edges[i].d < edges[j].d
		}
		return edges[i].t.Before(edges[j].t)
	})
	cur := 0
	for _, e := range edges {
		cur += e.d
		f.peakConcurrent = max(f.peakConcurrent, cur)
	}
	return f
}
