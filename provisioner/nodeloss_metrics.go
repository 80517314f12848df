package provisioner

import "github.com/prometheus/client_golang/prometheus"

// NodeLossMetrics are the node-loss controller's counters.
type NodeLossMetrics struct {
	nodes  *prometheus.CounterVec
	claims *prometheus.CounterVec
}

// NewNodeLossMetrics makes the counters and registers them with reg (nil: not served).
func NewNodeLossMetrics(reg prometheus.Registerer) *NodeLossMetrics {
	m := &NodeLossMetrics{
		nodes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_provisioner_nodes_lost_total",
			Help: "Nodes the provisioner counted lost for good, by reason (out-of-service taint, deleted)."}, []string{"reason"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_provisioner_node_loss_claims_total",
			Help: "Claims and volumes of lost nodes, by what was done: recreated (a StatefulSet's claim deleted), kept (with a NodeLost event), " +
				"rescheduled (a claim still being created sent back to the scheduler), volume-released (a PV removed without its node's agent)."},
			[]string{"action"}),
	}
	if reg != nil {
		reg.MustRegister(m.nodes, m.claims)
	}
	return m
}
