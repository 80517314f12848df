package main

import (
	"context"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/lvm-agent/lvm-agent/kube"
)

// The hybrid rows run the provisioner's labeller beside the agents: hybrid
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
	lab := kube.NewLabeller(c, l.reg)
	l.wg.Add(1)
	go func() { defer l.wg.Done(); lab.Run(ctx, 2) }()
	return l, nil
}

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
