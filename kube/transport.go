package kube

import (
	"context"
	"encoding/binary"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// ClientMetrics counts, from inside the agent, what its API client receives
// and writes. These are the numbers that show whether an agent's cost grows
// with its node or with the whole cluster, so they are measured where the
// bytes arrive (the client's transport) rather than estimated.
type ClientMetrics struct {
	requests *prometheus.CounterVec
	received *prometheus.CounterVec
	sent     *prometheus.CounterVec
	events   *prometheus.CounterVec
	objects  *prometheus.CounterVec
	duration *prometheus.HistogramVec
	// throttled is the client-side rate limiter's wait, before a request
	// is sent (which duration does not include).
	throttled prometheus.Histogram
}

// Sources of received objects, for ObjectsReceived.
const (
	SourceInformer   = "informer"
	SourceUnlabelled = "unlabelled"
)

// NewClientMetrics makes the metrics; register them as one collector. (They
// exist before the client, which exists before the agent's registry.)
func NewClientMetrics() *ClientMetrics {
	m := &ClientMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_kube_requests_total",
			Help: "API requests by resource, verb (get, list, watch, create, update, patch, delete, …) and HTTP code; the write verbs are the agent's writes."},
			[]string{"resource", "verb", "code"}),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_kube_received_bytes_total",
			Help: "Response body bytes received from the API server (after transparent gzip decoding), by resource and verb."},
			[]string{"resource", "verb"}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_kube_sent_bytes_total",
			Help: "Request body bytes sent to the API server, by resource and verb."}, []string{"resource", "verb"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_kube_watch_events_total",
			Help: "Watch events received (streamed initial lists and bookmarks included), by resource."}, []string{"resource"}),
		objects: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_kube_objects_received_total",
			Help: "PVCs and PVs decoded by the agent, by resource, source (informer: its watches; unlabelled: the hybrid mode's list and watch of unlabelled objects) and whether they belong to another node (foreign: true, false, or unknown)."},
			[]string{"resource", "source", "foreign"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "lvm_agent_kube_request_duration_seconds",
			Help:    "Time from sending an API request to its response headers, by resource and verb (a watch: until it is established).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 1.25, 48)}, []string{"resource", "verb"}),
		throttled: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "lvm_agent_kube_rate_limiter_wait_seconds",
			Help:    "Time a request waited for the client-side rate limiter (--kube-api-qps, --kube-api-burst) before it was sent.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 20)}),
	}
	return m
}

func (m *ClientMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.received, m.sent, m.events, m.objects, m.duration, m.throttled}
}

// Describe implements prometheus.Collector.
func (m *ClientMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *ClientMetrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

// Instrument makes cfg's clients count through m, and asks the API server
// for protobuf, which for PVCs and PVs is about a third of the JSON bytes
// and much cheaper to decode (contentType "" keeps cfg's choice).
func (m *ClientMetrics) Instrument(cfg *rest.Config, contentType string) {
	if contentType != "" {
		cfg.ContentType = contentType
		cfg.AcceptContentTypes = contentType
		if contentType == runtime.ContentTypeProtobuf {
			// Types without a protobuf form (none the agent uses today) fall back to JSON.
			cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
		}
	}
	cfg.Wrap(m.Wrap)
	if cfg.RateLimiter == nil && cfg.QPS > 0 {
		// client-go's own limiter for cfg.QPS and cfg.Burst, timed: client-go
		// measures its wait only through a process-global hook
		// (tools/metrics), which the agent's registry does not hold.
		cfg.RateLimiter = timedLimiter{flowcontrol.NewTokenBucketRateLimiter(cfg.QPS, cfg.Burst), m.throttled}
	}
}

// timedLimiter observes each Wait, the call client-go makes before every request.
type timedLimiter struct {
	flowcontrol.RateLimiter
	wait prometheus.Histogram
}

func (l timedLimiter) Wait(ctx context.Context) error {
	start := time.Now()
	err := l.RateLimiter.Wait(ctx)
	l.wait.Observe(time.Since(start).Seconds())
	return err
}

// Wrap returns a RoundTripper that counts through m.
func (m *ClientMetrics) Wrap(rt http.RoundTripper) http.RoundTripper {
	return &countingTransport{m: m, next: rt}
}

// Values of the foreign label of ObjectsReceived.
const (
	Foreign        = "true"
	Own            = "false"
	ForeignUnknown = "unknown"
)

// ObjectsReceived counts n objects of resource decoded from source; foreign
// says whether they are another node's (Foreign, Own, ForeignUnknown).
func (m *ClientMetrics) ObjectsReceived(resource, source, foreign string, n int) {
	if m != nil && n > 0 {
		m.objects.WithLabelValues(resource, source, foreign).Add(float64(n))
	}
}

func foreignLabel(owned bool) string {
	if owned {
		return Own
	}
	return Foreign
}

type countingTransport struct {
	m    *ClientMetrics
	next http.RoundTripper
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	k := requestKind(req)
	resource, verb := k.resource, k.verb
	if req.ContentLength > 0 {
		t.m.sent.WithLabelValues(resource, verb).Add(float64(req.ContentLength))
	}
	sent := time.Now()
	resp, err := t.next.RoundTrip(req)
	t.m.duration.WithLabelValues(resource, verb).Observe(time.Since(sent).Seconds())
	if err != nil {
		t.m.requests.WithLabelValues(resource, verb, "error").Inc()
		return resp, err
	}
	t.m.requests.WithLabelValues(resource, verb, strconv.Itoa(resp.StatusCode)).Inc()
	if resp.Body != nil {
		b := &countingBody{ReadCloser: resp.Body, bytes: t.m.received.WithLabelValues(resource, verb)}
		if verb == "watch" && resp.StatusCode == http.StatusOK {
			b.events = t.m.events.WithLabelValues(resource)
			b.frames = framerFor(resp.Header.Get("Content-Type"))
		}
		resp.Body = b
	}
	return resp, nil
}

// kind of a request, named the way the API server's audit log does.
type kind struct {
	resource string // with its subresource, if any; "other" for paths that are not resources
	verb     string
}

func requestKind(req *http.Request) kind {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	var rest []string
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		rest = parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		rest = parts[3:]
	default:
		return kind{resource: "other", verb: strings.ToLower(req.Method)}
	}
	k := kind{}
	if len(rest) >= 3 && rest[0] == "namespaces" {
		rest = rest[2:] // a namespaced resource, not the namespace itself
	}
	k.resource = rest[0]
	named := len(rest) >= 2
	if len(rest) >= 3 {
		k.resource += "/" + rest[2]
	}
	var verb string
	switch req.Method {
	case http.MethodGet:
		switch {
		case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
		if !named {
			verb = "deletecollection"
		}
	default:
		verb = strings.ToLower(req.Method)
	}
	k.verb = verb
	return k
}

// countingBody counts the bytes read through it and, for a watch, the
// events, by following the stream's framing without decoding it.
type countingBody struct {
	io.ReadCloser
	bytes  prometheus.Counter
	events prometheus.Counter
	frames framer
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.bytes.Add(float64(n))
		if b.events != nil && b.frames != nil {
			if k := b.frames.count(p[:n]); k > 0 {
				b.events.Add(float64(k))
			}
		}
	}
	return n, err
}

// framer counts the frames that start in a chunk of a watch stream.
type framer interface{ count(p []byte) int }

// framerFor picks the framing of a watch response: protobuf streams are
// length-prefixed, JSON streams put one event per line. Other encodings are
// not counted.
func framerFor(contentType string) framer {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return nil
	}
	switch mt {
	case runtime.ContentTypeProtobuf:
		return &lengthFrames{}
	case runtime.ContentTypeJSON:
		return lineFrames{}
	}
	return nil
}

// lengthFrames follows 4-byte big-endian length prefixes.
type lengthFrames struct {
	hdr  [4]byte
	nhdr int
	left uint32
}

func (f *lengthFrames) count(p []byte) int {
	n := 0
	for len(p) > 0 {
		if f.left > 0 {
			k := min(uint32(len(p)), f.left)
			f.left -= k
			p = p[k:]
			continue
		}
		f.hdr[f.nhdr] = p[0]
		f.nhdr++
		p = p[1:]
		if f.nhdr == len(f.hdr) {
			f.left, f.nhdr = binary.BigEndian.Uint32(f.hdr[:]), 0
			n++
		}
	}
	return n
}

// lineFrames counts newline-terminated JSON events.
type lineFrames struct{}

func (lineFrames) count(p []byte) int {
	n := 0
	for _, c := range p {
		if c == '\n' {
			n++
		}
	}
	return n
}
