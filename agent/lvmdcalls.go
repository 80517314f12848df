package agent

import (
	"context"
	"time"

	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// DefaultLVMDCalls is how many of the agent's calls into lvmd run at once.
//
// topolvm's lvmd runs every call at once, each as lvm commands (a CreateLV
// is several), and lvm serializes the writes to a volume group on its lock
// anyway: calls beyond a couple add only lvm processes that scan the
// devices and wait. In bench-peers' bursts (runs 7 and 8: 20 claims, 8
// workers, each request a list of two classes and a create) the agent's
// calls timed out and lvmd's liveness probe (an exec) restarted it again
// and again on the loaded node. The workers
// stay many: a request also waits for the API server and, for a thick
// clone, copies data, none of which needs lvmd.
const DefaultLVMDCalls = 2

// lvmdCalls bounds the calls into a Backend at once (a buffered channel as
// the semaphore); a call waits for its turn within its own context, and
// from its turn on runs for at most timeout (0: no bound). The wait for a
// turn does not count against the call: on a node recovering from a crash
// every request queues for lvmd at once, and a bound that counted the
// queue cut calls short mid-lvcreate (lvmd kills the lvm command) only for
// them to be asked again.
// WatchCapacity (a stream) and Close are not bounded.
type lvmdCalls struct {
	lvmbackend.Backend
	turn    chan struct{}
	timeout time.Duration
}

func limitLVMDCalls(b lvmbackend.Backend, n int, timeout time.Duration) lvmbackend.Backend {
	return &lvmdCalls{Backend: b, turn: make(chan struct{}, n), timeout: timeout}
}

// call runs f once it is a call's turn, or returns ctx's error first.
func call[T any](l *lvmdCalls, ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	select {
	case l.turn <- struct{}{}:
		defer func() { <-l.turn }()
		if l.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, l.timeout)
			defer cancel()
		}
		return f(ctx)
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

func (l *lvmdCalls) GetVolume(ctx context.Context, deviceClass, name string) (*lvmbackend.Volume, error) {
	return call(l, ctx, func(ctx context.Context) (*lvmbackend.Volume, error) {
		return l.Backend.GetVolume(ctx, deviceClass, name)
	})
}

func (l *lvmdCalls) ListVolumes(ctx context.Context, deviceClass string) ([]lvmbackend.Volume, error) {
	return call(l, ctx, func(ctx context.Context) ([]lvmbackend.Volume, error) { return l.Backend.ListVolumes(ctx, deviceClass) })
}

func (l *lvmdCalls) CreateVolume(ctx context.Context, req lvmbackend.CreateRequest) (*lvmbackend.Volume, error) {
	return call(l, ctx, func(ctx context.Context) (*lvmbackend.Volume, error) { return l.Backend.CreateVolume(ctx, req) })
}

func (l *lvmdCalls) RemoveVolume(ctx context.Context, deviceClass, name string) error {
	_, err := call(l, ctx, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, l.Backend.RemoveVolume(ctx, deviceClass, name)
	})
	return err
}

func (l *lvmdCalls) ResizeVolume(ctx context.Context, deviceClass, name string, sizeBytes int64) (int64, error) {
	return call(l, ctx, func(ctx context.Context) (int64, error) {
		return l.Backend.ResizeVolume(ctx, deviceClass, name, sizeBytes)
	})
}

func (l *lvmdCalls) SnapshotVolume(ctx context.Context, req lvmbackend.SnapshotRequest) (*lvmbackend.Volume, error) {
	return call(l, ctx, func(ctx context.Context) (*lvmbackend.Volume, error) { return l.Backend.SnapshotVolume(ctx, req) })
}

func (l *lvmdCalls) Capacity(ctx context.Context) ([]lvmbackend.Capacity, error) {
	return call(l, ctx, func(ctx context.Context) ([]lvmbackend.Capacity, error) { return l.Backend.Capacity(ctx) })
}
