package provisioner

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
)

func TestNodeLost(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	grace := 5 * time.Minute
	node := func(ready corev1.ConditionStatus, taints ...corev1.Taint) *corev1.Node {
		return &corev1.Node{Spec: corev1.NodeSpec{Taints: taints}, Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}}}
	}
	outOfService := corev1.Taint{Key: corev1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}
	unreachable := corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}
	for _, c := range []struct {
		name      string
		node      *corev1.Node
		goneSince time.Time
		reason    string
		lost      bool
		recheck   time.Duration
	}{
		{"ready", node(corev1.ConditionTrue), time.Time{}, "", false, 0},
		{"not ready for a day", node(corev1.ConditionFalse), time.Time{}, "", false, 0},
		{"unreachable, tainted so", node(corev1.ConditionUnknown, unreachable), time.Time{}, "", false, 0},
		{"out of service", node(corev1.ConditionFalse, unreachable, outOfService), time.Time{}, LostOutOfService, true, 0},
		{"out of service, even if Ready", node(corev1.ConditionTrue, outOfService), time.Time{}, LostOutOfService, true, 0},
		{"registered again (a Node object)", node(corev1.ConditionTrue), now.Add(-time.Hour), "", false, 0},
		{"deleted just now", nil, now, "", false, grace},
		{"deleted, inside the grace", nil, now.Add(-4 * time.Minute), "", false, time.Minute},
		{"deleted, grace passed", nil, now.Add(-grace), LostDeleted, true, 0},
		{"deleted long ago", nil, now.Add(-24 * time.Hour), LostDeleted, true, 0},
		{"no Node, not seen missing", nil, time.Time{}, "", false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			reason, lost, recheck := NodeLost(c.node, c.goneSince, now, grace)
			assert.Equal(t, c.reason, reason)
			assert.Equal(t, c.lost, lost)
			assert.Equal(t, c.recheck, recheck)
		})
	}
}
