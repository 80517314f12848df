package agent

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
)

// Metrics are the agent's Prometheus metrics.
type Metrics struct {
	ops       *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	writes    *prometheus.CounterVec
	retries   prometheus.Counter
	synced    prometheus.Gauge
	queue     *prometheus.GaugeVec
	queueAdds *prometheus.CounterVec
	queueLat  *prometheus.HistogramVec
	queueWork *prometheus.HistogramVec
	// A stuck lvmd call shows here long before its OpTimeout.
	unfinished *prometheus.GaugeVec
	longest    *prometheus.GaugeVec
	// Requests labelled for this node but owned elsewhere.
	misdirected *prometheus.CounterVec
	answer      *prometheus.HistogramVec
	// Bytes of thick clones copied (verified or not).
	copied prometheus.Counter
	// The wipe (wipe.go): bytes still to be zeroed by the wipes in
	// progress, and bytes zeroed.
	wipeWaiting prometheus.Gauge
	wiped       prometheus.Counter
	// Encryption (crypt.go): mappings loaded, headers erased.
	cryptOpens, cryptErases prometheus.Counter
	// reg registers the collectors of the Backend's wrappers (nil: none).
	reg prometheus.Registerer
}

// NewMetrics registers the metrics with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_operations_total",
			Help: "Volume operations by kind (create, delete, grow) and result (created, deleted, expanded, failed, retry)."}, []string{"kind", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "lvm_agent_operation_duration_seconds",
			Help: "Time of one volume operation attempt, lvmd calls included.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}, []string{"kind", "result"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_api_writes_total",
			Help: "Annotation patches by object kind and result."}, []string{"object", "result"}),
		retries:   prometheus.NewCounter(prometheus.CounterOpts{Name: "lvm_agent_retries_total", Help: "Requests requeued with backoff."}),
		synced:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "lvm_agent_informers_synced", Help: "1 once the PVC and PV informers have synced."}),
		queue:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lvm_agent_workqueue_depth", Help: "Requests waiting in the work queue."}, []string{"name"}),
		queueAdds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_workqueue_adds_total", Help: "Requests added to the work queue."}, []string{"name"}),
		queueLat: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "lvm_agent_workqueue_wait_seconds",
			Help: "Time a request waits in the queue.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)}, []string{"name"}),
		queueWork: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "lvm_agent_workqueue_work_seconds",
			Help: "Time a request is being worked on.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)}, []string{"name"}),
		unfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lvm_agent_workqueue_unfinished_work_seconds",
			Help: "Seconds of work in progress not yet finished, summed over the workers."}, []string{"name"}),
		longest: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lvm_agent_workqueue_longest_running_processor_seconds",
			Help: "Seconds the longest running request has been worked on."}, []string{"name"}),
		misdirected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_misdirected_requests_total",
			Help: "Open requests labelled for this node but owned by another node or by none (ignored, with a Warning event), by object kind."}, []string{"object"}),
		answer: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "lvm_agent_request_answer_seconds",
			Help:    "Per request: from the agent seeing it (informer event or sweep) to the agent sending its answer: queueing and lvmd calls, not the API server's part.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 1.25, 56)}, []string{"resource"}),
		copied: prometheus.NewCounter(prometheus.CounterOpts{Name: "lvm_agent_clone_copied_bytes_total",
			Help: "Bytes the agent copied into thick clones (a copy started again counts again)."}),
		wipeWaiting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "lvm_agent_wipe_waiting_bytes",
			Help: "Bytes of deleted thick volumes (and of thick clones' tails) still to be zeroed by the wipes in progress; their LVs are not removed, nor their space free, until they are zero."}),
		wiped: prometheus.NewCounter(prometheus.CounterOpts{Name: "lvm_agent_wiped_bytes_total",
			Help: "Bytes the agent zeroed (a wipe started again counts again)."}),
		cryptOpens: prometheus.NewCounter(prometheus.CounterOpts{Name: "lvm_agent_crypt_opens_total",
			Help: "dm-crypt mappings of encrypted volumes the agent loaded (made, or opened again after a restart)."}),
		cryptErases: prometheus.NewCounter(prometheus.CounterOpts{Name: "lvm_agent_crypt_erases_total",
			Help: "Encrypted volumes whose LUKS2 keyslots and headers the agent destroyed (crypto-erase) before their removal."}),
		reg: reg,
	}
	if reg != nil {
		reg.MustRegister(m.ops, m.duration, m.writes, m.retries, m.synced, m.queue, m.queueAdds, m.queueLat, m.queueWork,
			m.unfinished, m.longest, m.misdirected, m.answer, m.copied, m.wipeWaiting, m.wiped, m.cryptOpens, m.cryptErases)
	}
	return m
}

func (m *Metrics) observe(kind, result string, start time.Time) {
	m.ops.WithLabelValues(kind, result).Inc()
	m.duration.WithLabelValues(kind, result).Observe(time.Since(start).Seconds())
}

// answered times a request's answer: from seen, when the agent first saw
// it open, to sent, when the patch that answered it was sent. That is the
// agent's own part (queueing and lvmd calls); the API server's part is
// lvm_agent_kube_request_duration_seconds. A zero seen (the request's
// clock was stopped by an answer already) is not timed.
func (m *Metrics) answered(k Kind, seen, sent time.Time) {
	if seen.IsZero() {
		return
	}
	resource := "persistentvolumeclaims"
	if k == KindPV {
		resource = "persistentvolumes"
	}
	m.answer.WithLabelValues(resource).Observe(max(sent.Sub(seen), 0).Seconds())
}

// wrote counts an annotation patch of an object kind (pvc, pv, node).
func (m *Metrics) wrote(object string, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.writes.WithLabelValues(object, result).Inc()
}

// The work queue reports through these (workqueue.MetricsProvider).

func (m *Metrics) NewDepthMetric(name string) workqueue.GaugeMetric {
	return m.queue.WithLabelValues(name)
}
func (m *Metrics) NewAddsMetric(name string) workqueue.CounterMetric {
	return m.queueAdds.WithLabelValues(name)
}
func (m *Metrics) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return m.queueLat.WithLabelValues(name)
}
func (m *Metrics) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return m.queueWork.WithLabelValues(name)
}
func (m *Metrics) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return m.unfinished.WithLabelValues(name)
}
func (m *Metrics) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return m.longest.WithLabelValues(name)
}

// NewRetriesMetric is a no-op: lvm_agent_retries_total counts the same requeues.
func (m *Metrics) NewRetriesMetric(string) workqueue.CounterMetric { return noop{} }

// NewOpenRequestsCollector reports the open requests the agent holds, which
// the queue depth does not show while a request waits for its backoff.
func NewOpenRequestsCollector(a *Agent) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lvm_agent_open_requests",
		Help: "Requests of this node still creating or deleting, including those waiting for a retry."},
		func() float64 { return float64(a.DSW.Len()) })
}

type noop struct{}

func (noop) Inc() {}
