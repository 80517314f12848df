package provisioner

import (
	"context"
	"errors"
	"sync"

	"github.com/lvm-agent/lvm-agent/kube"
)

// ErrNodeLost ends a wait for the answer of a node's agent once the node is
// lost: nobody will answer.
var ErrNodeLost = errors.New("the node is lost")

// LostNodes is what the node-loss controller decided, for Provision and
// Delete to read: the nodes lost now, by their volume.node label value
// (what a PV carries), and the waits to end when a node is lost. A nil
// *LostNodes (node loss off) knows no lost node.
type LostNodes struct {
	mu      sync.Mutex
	lost    map[string]string // label value → reason
	waiters map[string]map[*context.CancelCauseFunc]struct{}
}

// NewLostNodes makes an empty LostNodes.
func NewLostNodes() *LostNodes {
	return &LostNodes{lost: map[string]string{}, waiters: map[string]map[*context.CancelCauseFunc]struct{}{}}
}

// Lost says whether the node of label value v (kube.NodeLabelValue) is lost, and why.
func (l *LostNodes) Lost(v string) (string, bool) {
	if l == nil {
		return "", false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	reason, ok := l.lost[v]
	return reason, ok
}

// Watch returns a context that ends, with cause ErrNodeLost, when the node
// of label value v is lost (at once if it is).
func (l *LostNodes) Watch(ctx context.Context, v string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	if l == nil {
		return ctx, func() { cancel(nil) }
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, lost := l.lost[v]; lost {
		cancel(ErrNodeLost)
		return ctx, func() {}
	}
	key := &cancel
	if l.waiters[v] == nil {
		l.waiters[v] = map[*context.CancelCauseFunc]struct{}{}
	}
	l.waiters[v][key] = struct{}{}
	return ctx, func() {
		l.mu.Lock()
		delete(l.waiters[v], key)
		l.mu.Unlock()
		cancel(nil)
	}
}

// set records the node lost (reason) or not (""), and ends the waits on it.
func (l *LostNodes) set(node, reason string) {
	v := kube.NodeLabelValue(node)
	l.mu.Lock()
	defer l.mu.Unlock()
	if reason == "" {
		delete(l.lost, v)
		return
	}
	l.lost[v] = reason
	for w := range l.waiters[v] {
		(*w)(ErrNodeLost)
	}
	delete(l.waiters, v)
}
