package agent

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// CapacityWatcher follows lvmd's capacity stream: it is how the agent knows
// that lvmd is reachable (for /readyz) and what each device class holds.
type CapacityWatcher struct {
	backend   lvmbackend.Backend
	size      *prometheus.GaugeVec
	free      *prometheus.GaugeVec
	reachable prometheus.Gauge
	// thinData and thinMeta are the thin pools' fill from lvmd, nil unless
	// ExportThinPools was called.
	thinData, thinMeta *prometheus.GaugeVec

	mu  sync.Mutex
	err error
	// Hooks, each optional and set before Run: OnChange is called with
	// every capacity report; OnLost at each failure to reach lvmd (about
	// every 10 s while it is away); OnBack before the first report after a
	// failure, and before the first report of all.
	OnChange func([]lvmbackend.Capacity)
	OnLost   func()
	OnBack   func()
}

// NewCapacityWatcher registers its metrics with reg (nil: not registered).
func NewCapacityWatcher(b lvmbackend.Backend, reg prometheus.Registerer) *CapacityWatcher {
	w := &CapacityWatcher{backend: b, err: errors.New("lvmd not contacted yet"),
		size: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lvm_agent_device_class_size_bytes",
			Help: "Size of each lvmd device class (VG, or thin pool)."}, []string{"device_class"}),
		free: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lvm_agent_device_class_free_bytes",
			Help: "Free bytes of each lvmd device class (thin: with overprovisioning)."}, []string{"device_class"}),
		reachable: prometheus.NewGauge(prometheus.GaugeOpts{Name: "lvm_agent_lvmd_reachable",
			Help: "1 while the agent holds a working capacity stream from lvmd."}),
	}
	if reg != nil {
		reg.MustRegister(w.size, w.free, w.reachable)
	}
	return w
}

// ExportThinPools registers lvm_agent_thin_pool_data_used_ratio and
// lvm_agent_thin_pool_metadata_used_ratio with reg, from the fill that
// lvmd's capacity stream reports for each thin device class (label
// device_class). It is for agents that cannot read device-mapper, whose own
// series of these names (label device) are fresher: call it only when that
// source is off, as the two label sets cannot share a registry.
func (w *CapacityWatcher) ExportThinPools(reg prometheus.Registerer) {
	data := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lvm_agent_thin_pool_data_used_ratio",
		Help: "Used fraction of each thin pool's data space, as lvmd last reported it."}, []string{"device_class"})
	meta := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lvm_agent_thin_pool_metadata_used_ratio",
		Help: "Used fraction of each thin pool's metadata space, as lvmd last reported it."}, []string{"device_class"})
	reg.MustRegister(data, meta)
	w.mu.Lock()
	w.thinData, w.thinMeta = data, meta
	w.mu.Unlock()
}

// Run follows the stream until ctx ends, reconnecting with a jittered
// exponential backoff (200 ms doubling to 10 s, +0-20%), reset by each
// report: agents of a cluster whose lvmd came back together do not
// reconnect in step.
func (w *CapacityWatcher) Run(ctx context.Context) {
	newBackoff := func() wait.Backoff {
		return wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: math.MaxInt32, Cap: 10 * time.Second}
	}
	backoff := newBackoff()
	for ctx.Err() == nil {
		err := w.backend.WatchCapacity(ctx, func(caps []lvmbackend.Capacity) {
			backoff = newBackoff()
			w.report(caps, nil)
		})
		if ctx.Err() != nil {
			return
		}
		w.report(nil, err)
		delay := backoff.Step()
		klog.V(2).InfoS("lvmd capacity stream ended; reconnecting", "err", err, "after", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

func (w *CapacityWatcher) report(caps []lvmbackend.Capacity, err error) {
	w.mu.Lock()
	wasDown := w.err != nil
	w.err = err
	onChange, onLost, onBack := w.OnChange, w.OnLost, w.OnBack
	thinData, thinMeta := w.thinData, w.thinMeta
	w.mu.Unlock()
	if err != nil {
		w.reachable.Set(0)
		if !wasDown {
			klog.ErrorS(err, "lvmd is unreachable")
		}
		if onLost != nil {
			onLost()
		}
		return
	}
	w.reachable.Set(1)
	if wasDown {
		klog.InfoS("lvmd is reachable")
		if onBack != nil {
			onBack()
		}
	}
	if thinData != nil {
		// Each report lists every device class: a pool no longer reported
		// loses its series.
		thinData.Reset()
		thinMeta.Reset()
	}
	for _, c := range caps {
		w.size.WithLabelValues(c.DeviceClass).Set(float64(c.SizeBytes))
		w.free.WithLabelValues(c.DeviceClass).Set(float64(c.FreeBytes))
		if thinData != nil && c.ThinPool != nil {
			thinData.WithLabelValues(c.DeviceClass).Set(c.ThinPool.DataPercent / 100)
			thinMeta.WithLabelValues(c.DeviceClass).Set(c.ThinPool.MetadataPercent / 100)
		}
	}
	if onChange != nil {
		onChange(caps)
	}
}

// Reachable is nil while lvmd answers.
func (w *CapacityWatcher) Reachable() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}
