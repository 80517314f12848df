package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/lvm-agent/lvm-agent/integration/harness"
)

// profileAPIServer takes a CPU profile of the kube-apiserver (its
// /debug/pprof, served with --profiling, the default) over the next seconds
// and writes it to path; the channel gets the outcome.
func profileAPIServer(ctx context.Context, cp *harness.ControlPlane, seconds int, path string) <-chan error {
	done := make(chan error, 1)
	go func() {
		raw, err := cp.Client.Discovery().RESTClient().Get().AbsPath("/debug/pprof/profile").
			Param("seconds", strconv.Itoa(max(seconds, 1))).DoRaw(ctx)
		if err == nil {
			err = os.WriteFile(path, raw, 0o644)
		}
		done <- err
	}()
	return done
}

// requestsPer is the API server's requests (apiserver_request_total) per
// transition by verb and resource, net of its idle rate: work is the
// difference of two scrapes over workSeconds, idle over idleSeconds. It
// leaves out what rounds to less than 0.01 per transition.
func requestsPer(work, idle metrics, workSeconds, idleSeconds float64, transitions int) string {
	byKey := func(m metrics) map[string]float64 {
		out := map[string]float64{}
		for series, v := range m {
			if strings.HasPrefix(series, "apiserver_request_total{") {
				k := label(series, "verb") + " " + label(series, "resource")
				if sub := label(series, "subresource"); sub != "" {
					k += "/" + sub
				}
				out[k] += v
			}
		}
		return out
	}
	w, i := byKey(work), byKey(idle)
	var keys []string
	per := map[string]float64{}
	for k, v := range w {
		if idleSeconds > 0 {
			v -= i[k] * workSeconds / idleSeconds
		}
		if p := v / float64(max(transitions, 1)); p >= 0.01 || p <= -0.01 {
			per[k] = p
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(a, b int) bool { return per[keys[a]] > per[keys[b]] })
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s %.2f; ", k, per[k])
	}
	return strings.TrimSuffix(b.String(), "; ")
}

// label is the value of the label key in a series name{k="v",...}, or "".
func label(series, key string) string {
	i := strings.Index(series, key+`="`)
	if i < 0 || (i > 0 && series[i-1] != '{' && series[i-1] != ',') {
		return ""
	}
	v := series[i+len(key)+2:]
	return v[:strings.IndexByte(v, '"')]
}
