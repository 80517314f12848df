package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
	"github.com/lvm-agent/lvm-agent/provisioner"
)

// The hybrid rows run the provisioner's labeller beside the agents (the
// hybrid-alone rows do not: their agents watch the unlabelled objects): hybrid
// agents watch only their labelled objects, and the requests written
// without the label reach them once the labeller has labelled them (their
// sweep lists only at start and every --sweep-interval). It is the library
// the provisioner's leader runs (kube.NewLabeller(...).Run), in this
// process with a client of its own, not the provisioner binary: that would
// also run the claim controller, capacity publishing and leader election,
// none of which the bench measures (the API server sees the same one
// list+watch of the unlabelled objects and one patch per unlabelled
// request either way; the labeller's own CPU is the bench's then, not an
// agent's).
type labeller struct {
	reg    *prometheus.Registry
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startLabeller runs a labeller until stop.
func (cl *cluster) startLabeller(ctx context.Context) (*labeller, error) {
	rc := *cl.cp.Config
	rc.QPS, rc.Burst = 50, 100 // the provisioner's defaults
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	c, err := kubernetes.NewForConfig(&rc)
	if err != nil {
		return nil, err
	}
	l := &labeller{reg: prometheus.NewRegistry()}
	ctx, l.cancel = context.WithCancel(ctx)
	lab := kube.NewLabeller(clientset.Wrap(c), l.reg).WithLease(provisioner.LabellerLease(c, benchLease, "bench"))
	l.wg.Add(1)
	go func() { defer l.wg.Done(); lab.Run(ctx, 2) }()
	// The agents rely on it once its Lease is there (they start after).
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		if _, err := c.CoordinationV1().Leases(benchLease.Namespace).Get(ctx, benchLease.Name, metav1.GetOptions{}); err == nil {
			return l, nil
		} else if time.Since(start) > 2*time.Minute {
			l.stop()
			return nil, fmt.Errorf("the labeller's Lease: %w", err)
		}
	}
}

// benchLease is the labeller's Lease, which the agents follow
// (--labeller-lease).
var benchLease = kube.LeaseRef{Namespace: "default", Name: kube.LabellerLeaseName}

// watchMode is the agent's --watch-mode of a row's mode: "hybrid-alone" is
// hybrid with no labeller running (the agents watch the unlabelled objects
// themselves).
func watchMode(mode string) string { return strings.TrimSuffix(mode, "-alone") }

func hybrid(mode string) bool { return watchMode(mode) == string(kube.WatchHybrid) }

// labelled is how many requests it has labelled.
func (l *labeller) labelled() float64 {
	if l == nil {
		return 0
	}
	families, err := l.reg.Gather()
	if err != nil {
		return 0
	}
	n := 0.0
	for _, f := range families {
		for _, m := range f.GetMetric() {
			n += m.GetCounter().GetValue()
		}
	}
	return n
}

func (l *labeller) stop() {
	if l != nil {
		l.cancel()
		l.wg.Wait()
	}
}
