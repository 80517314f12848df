package kube

import (
	"bytes"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// answerClock times the agent's own part of each request: from its arrival
// (an informer event, or a sweep, showing an open request of this node) to
// the agent sending its answer (the patch that sets the lifecycle, when it
// succeeds). That is queueing and lvmd calls, and not the API server's
// part: the provisioner's write, the watch deliveries, the answer's own
// write (lvm_agent_kube_request_duration_seconds). It lives with the
// client's metrics because both ends are seen here: arrivals by the
// informers' handler, answers by the transport.
type answerClock struct {
	mu      sync.Mutex
	arrived map[string]arrival // resource/namespace/name
	hist    *prometheus.HistogramVec
}

type arrival struct {
	at   time.Time
	open bool
}

func newAnswerClock() *answerClock {
	return &answerClock{arrived: map[string]arrival{},
		hist: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "lvm_agent_request_answer_seconds",
			Help:    "Per request: from the agent seeing it (informer event or sweep) to the agent sending its answer: queueing and lvmd calls, not the API server's part.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 1.25, 56)}, []string{"resource"})}
}

func clockKey(resource, namespace, name string) string {
	return resource + "/" + namespace + "/" + name
}

// seen records the state of a request of this node: open starts the clock
// (unless it runs already), closed keeps it for the answer's write, whose
// response may come after the watch showed the answer.
func (c *answerClock) seen(resource, namespace, name string, open bool) {
	k := clockKey(resource, namespace, name)
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.arrived[k]
	switch {
	case open && (!ok || !a.open):
		c.arrived[k] = arrival{at: time.Now(), open: true}
	case !open && ok:
		a.open = false
		c.arrived[k] = a
	}
}

// gone forgets an object that was deleted or is not this node's.
func (c *answerClock) gone(resource, namespace, name string) {
	c.mu.Lock()
	delete(c.arrived, clockKey(resource, namespace, name))
	c.mu.Unlock()
}

// answered stops the clock of a request at sent, when its answer was sent.
func (c *answerClock) answered(resource, namespace, name string, sent time.Time) {
	k := clockKey(resource, namespace, name)
	c.mu.Lock()
	a, ok := c.arrived[k]
	delete(c.arrived, k)
	c.mu.Unlock()
	if ok {
		c.hist.WithLabelValues(resource).Observe(max(sent.Sub(a.at), 0).Seconds())
	}
}

// setsLifecycle reports whether a patch request writes the lifecycle
// annotation: an answer, not an error report (patch.go writes exactly the
// keys it is given).
func setsLifecycle(req *http.Request) bool {
	if req.GetBody == nil || req.ContentLength > 64<<10 {
		return false
	}
	body, err := req.GetBody()
	if err != nil {
		return false
	}
	defer body.Close()
	b, err := io.ReadAll(body)
	return err == nil && bytes.Contains(b, []byte(`"`+AnnLifecycle+`":"`))
}
