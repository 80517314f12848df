package kube

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

func TestRequestKind(t *testing.T) {
	for _, c := range []struct {
		method, path, query string
		resource, verb      string
	}{
		{"GET", "/api/v1/persistentvolumeclaims", "labelSelector=x", "persistentvolumeclaims", "list"},
		{"GET", "/api/v1/persistentvolumeclaims", "watch=true&resourceVersion=5", "persistentvolumeclaims", "watch"},
		{"GET", "/api/v1/namespaces/ns/persistentvolumeclaims", "", "persistentvolumeclaims", "list"},
		{"GET", "/api/v1/namespaces/ns/persistentvolumeclaims/data", "", "persistentvolumeclaims", "get"},
		{"PATCH", "/api/v1/namespaces/ns/persistentvolumeclaims/data", "", "persistentvolumeclaims", "patch"},
		{"PATCH", "/api/v1/persistentvolumes/pv-1", "", "persistentvolumes", "patch"},
		{"PUT", "/api/v1/namespaces/ns/persistentvolumeclaims/data/status", "", "persistentvolumeclaims/status", "update"},
		{"POST", "/api/v1/namespaces/ns/events", "", "events", "create"},
		{"PATCH", "/api/v1/namespaces/ns/events/e.1", "", "events", "patch"},
		{"GET", "/api/v1/namespaces/ns", "", "namespaces", "get"},
		{"GET", "/api/v1/namespaces", "", "namespaces", "list"},
		{"PATCH", "/api/v1/nodes/n1", "", "nodes", "patch"},
		{"DELETE", "/api/v1/persistentvolumes/pv-1", "", "persistentvolumes", "delete"},
		{"DELETE", "/api/v1/persistentvolumes", "", "persistentvolumes", "deletecollection"},
		{"GET", "/apis/events.k8s.io/v1/namespaces/ns/events", "watch=1", "events", "watch"},
		{"GET", "/readyz", "", "other", "get"},
		{"GET", "/api", "", "other", "get"},
	} {
		req := &http.Request{Method: c.method, URL: &url.URL{Path: c.path, RawQuery: c.query}}
		k := requestKind(req)
		assert.Equal(t, c.resource, k.resource, "%s %s?%s", c.method, c.path, c.query)
		assert.Equal(t, c.verb, k.verb, "%s %s?%s", c.method, c.path, c.query)
	}
}

// protoFrames is a protobuf watch stream of frames with the given payload sizes.
func protoFrames(sizes ...int) []byte {
	var b bytes.Buffer
	for _, n := range sizes {
		_ = binary.Write(&b, binary.BigEndian, uint32(n))
		b.Write(bytes.Repeat([]byte{0xAB}, n))
	}
	return b.Bytes()
}

func TestFramesAcrossChunks(t *testing.T) {
	stream := protoFrames(0, 1, 300, 70000, 5)
	for _, chunk := range []int{1, 2, 3, 4, 5, 7, 64, 4096, len(stream)} {
		f := &lengthFrames{}
		n := 0
		for p := stream; len(p) > 0; {
			k := min(chunk, len(p))
			n += f.count(p[:k])
			p = p[k:]
		}
		assert.Equal(t, 5, n, "chunk %d", chunk)
		assert.Zero(t, f.left, "chunk %d", chunk)
		assert.Zero(t, f.nhdr, "chunk %d", chunk)
	}
	assert.Equal(t, 3, lineFrames{}.count([]byte("{\"type\":\"ADDED\"}\n{}\n{}\n{\"partial")))
	assert.IsType(t, &lengthFrames{}, framerFor("application/vnd.kubernetes.protobuf;stream=watch"))
	assert.IsType(t, lineFrames{}, framerFor("application/json"))
	assert.Nil(t, framerFor("application/cbor-seq"))
	assert.Nil(t, framerFor(""))
}

type fakeRT struct {
	status      int
	contentType string
	body        []byte
	err         error
}

func (f fakeRT) RoundTrip(req *http.Request) (*http.Response, error) {
	if f.err != nil {
		return nil, f.err
	}
	h := http.Header{}
	h.Set("Content-Type", f.contentType)
	return &http.Response{StatusCode: f.status, Header: h, Body: io.NopCloser(bytes.NewReader(f.body)), Request: req}, nil
}

func TestCountingTransport(t *testing.T) {
	stream := protoFrames(10, 20, 30)
	for _, c := range []struct {
		name                  string
		rt                    fakeRT
		method, path, query   string
		body                  string
		wantBytes, wantEvents float64
		resource, verb, code  string
	}{
		{"protobuf watch", fakeRT{status: 200, contentType: "application/vnd.kubernetes.protobuf;stream=watch", body: stream},
			"GET", "/api/v1/persistentvolumes", "watch=true", "", float64(len(stream)), 3, "persistentvolumes", "watch", "200"},
		{"json watch", fakeRT{status: 200, contentType: "application/json", body: []byte("{}\n{}\n")},
			"GET", "/api/v1/persistentvolumeclaims", "watch=true", "", 6, 2, "persistentvolumeclaims", "watch", "200"},
		{"list", fakeRT{status: 200, contentType: "application/json", body: []byte("{\"items\":[]}\n")},
			"GET", "/api/v1/persistentvolumeclaims", "", "", 13, 0, "persistentvolumeclaims", "list", "200"},
		{"patch conflict", fakeRT{status: 409, contentType: "application/json", body: []byte("{}")},
			"PATCH", "/api/v1/namespaces/a/persistentvolumeclaims/b", "", `{"metadata":{}}`, 2, 0, "persistentvolumeclaims", "patch", "409"},
		{"transport error", fakeRT{err: io.ErrUnexpectedEOF},
			"PATCH", "/api/v1/persistentvolumes/p", "", "{}", 0, 0, "persistentvolumes", "patch", "error"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := NewClientMetrics()
			rt := m.Wrap(c.rt)
			req, err := http.NewRequest(c.method, "https://api.example"+c.path+"?"+c.query, strings.NewReader(c.body))
			require.NoError(t, err)
			resp, err := rt.RoundTrip(req)
			if c.rt.err != nil {
				require.ErrorIs(t, err, c.rt.err)
			} else {
				require.NoError(t, err)
				_, err = io.Copy(io.Discard, resp.Body)
				require.NoError(t, err)
				require.NoError(t, resp.Body.Close())
			}
			v := gather(t, m)
			assert.Equal(t, 1.0, v[key("lvm_agent_kube_requests_total", "resource", c.resource, "verb", c.verb, "code", c.code)])
			assert.Equal(t, c.wantBytes, v[key("lvm_agent_kube_received_bytes_total", "resource", c.resource, "verb", c.verb)])
			assert.Equal(t, c.wantEvents, v[key("lvm_agent_kube_watch_events_total", "resource", c.resource)])
			assert.Equal(t, float64(len(c.body)), v[key("lvm_agent_kube_sent_bytes_total", "resource", c.resource, "verb", c.verb)])
		})
	}
}

func TestInstrumentConfig(t *testing.T) {
	m := NewClientMetrics()
	cfg := &rest.Config{ContentConfig: rest.ContentConfig{ContentType: "application/json"}}
	m.Instrument(cfg, "application/vnd.kubernetes.protobuf")
	assert.Equal(t, "application/vnd.kubernetes.protobuf", cfg.ContentType)
	assert.Equal(t, "application/vnd.kubernetes.protobuf,application/json", cfg.AcceptContentTypes)
	require.NotNil(t, cfg.WrapTransport)
	assert.IsType(t, &countingTransport{}, cfg.WrapTransport(http.DefaultTransport))

	cfg = &rest.Config{ContentConfig: rest.ContentConfig{ContentType: "application/json"}}
	m.Instrument(cfg, "")
	assert.Equal(t, "application/json", cfg.ContentType, "empty keeps the config's choice")
}

func TestInstrumentTimesTheRateLimiter(t *testing.T) {
	m := NewClientMetrics()
	cfg := &rest.Config{QPS: 1000, Burst: 1}
	m.Instrument(cfg, "")
	require.NotNil(t, cfg.RateLimiter, "the config's QPS and burst, as client-go's own limiter")
	assert.InDelta(t, 1000, cfg.RateLimiter.QPS(), 0.001)
	for i := 0; i < 3; i++ {
		require.NoError(t, cfg.RateLimiter.Wait(context.Background()))
	}
	h := histogram(t, m, "lvm_agent_kube_rate_limiter_wait_seconds")
	assert.Equal(t, uint64(3), h.GetSampleCount())
	assert.Positive(t, h.GetSampleSum(), "burst 1: the later waits wait for tokens")

	lim := flowcontrol.NewFakeAlwaysRateLimiter()
	own := &rest.Config{QPS: 5, RateLimiter: lim}
	m.Instrument(own, "")
	assert.Same(t, lim, own.RateLimiter, "a limiter set already is kept")
}

// histogram is the one histogram named name that c collects.
func histogram(t *testing.T, c prometheus.Collector, name string) *dto.Histogram {
	t.Helper()
	for _, mf := range families(t, c) {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram()
		}
	}
	t.Fatalf("no %s", name)
	return nil
}

func TestObjectsReceivedNil(t *testing.T) {
	var m *ClientMetrics
	m.ObjectsReceived("persistentvolumes", SourceUnlabelled, Foreign, 3) // no metrics: no panic
}

// families is what c collects.
func families(t *testing.T, c prometheus.Collector) []*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	return mfs
}

// gather reads every sample of c, by key.
func gather(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, mf := range families(t, c) {
		for _, m := range mf.GetMetric() {
			var pairs []string
			for _, l := range m.GetLabel() {
				pairs = append(pairs, l.GetName(), l.GetValue())
			}
			out[key(mf.GetName(), pairs...)] = value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetHistogram() != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return 0
}

// key names a sample: name{label=value,...} with the labels sorted.
func key(name string, pairs ...string) string {
	var kv []string
	for i := 0; i+1 < len(pairs); i += 2 {
		kv = append(kv, pairs[i]+"="+pairs[i+1])
	}
	sort.Strings(kv)
	return name + "{" + strings.Join(kv, ",") + "}"
}
