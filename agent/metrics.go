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
}

// NewMetrics registers the metrics with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_operations_total",
			Help: "Volume operations by kind (create, delete) and result (created, deleted, failed, retry)."}, []string{"kind", "result"}),
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
	}
	if reg != nil {
		reg.MustRegister(m.ops, m.duration, m.writes, m.retries, m.synced, m.queue, m.queueAdds, m.queueLat, m.queueWork)
	}
	return m
}

func (m *Metrics) observe(kind, result string, start time.Time) {
	m.ops.WithLabelValues(kind, result).Inc()
	m.duration.WithLabelValues(kind, result).Observe(time.Since(start).Seconds())
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
func (m *Metrics) NewUnfinishedWorkSecondsMetric(string) workqueue.SettableGaugeMetric {
	return noop{}
}
func (m *Metrics) NewLongestRunningProcessorSecondsMetric(string) workqueue.SettableGaugeMetric {
	return noop{}
}
func (m *Metrics) NewRetriesMetric(string) workqueue.CounterMetric { return noop{} }

type noop struct{}

func (noop) Inc()        {}
func (noop) Set(float64) {}
