package agent

import (
	"context"

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
// the semaphore); a call waits for its turn within its own context.
// WatchCapacity (a stream) and Close are not bounded.
type lvmdCalls struct {
	lvmbackend.Backend
	turn chan struct{}
}

func limitLVMDCalls(b lvmbackend.Backend, n int) lvmbackend.Backend {
	return &lvmdCalls{Backend: b, turn: make(chan struct{}, n)}
}

func (l *lvmdCalls) wait(ctx context.Context) (func(), error) {
	select {
	case l.turn <- struct{}{}:
		return func() { <-l.turn }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *lvmdCalls) GetVolume(ctx context.Context, deviceClass, name string) (*lvmbackend.Volume, error) {
	done, err := l.wait(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	return l.Backend.GetVolume(ctx, deviceClass, name)
}

func (l *lvmdCalls) ListVolumes(ctx context.Context, deviceClass string) ([]lvmbackend.Volume, error) {
	done, err := l.wait(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	return l.Backend.ListVolumes(ctx, deviceClass)
}

func (l *lvmdCalls) CreateVolume(ctx context.Context, req lvmbackend.CreateRequest) (*lvmbackend.Volume, error) {
	done, err := l.wait(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	return l.Backend.CreateVolume(ctx, req)
}

func (l *lvmdCalls) RemoveVolume(ctx context.Context, deviceClass, name string) error {
	done, err := l.wait(ctx)
	if err != nil {
		return err
	}
	defer done()
	return l.Backend.RemoveVolume(ctx, deviceClass, name)
}

func (l *lvmdCalls) ResizeVolume(ctx context.Context, deviceClass, name string, sizeBytes int64) (int64, error) {
	done, err := l.wait(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	return l.Backend.ResizeVolume(ctx, deviceClass, name, sizeBytes)
}

func (l *lvmdCalls) SnapshotVolume(ctx context.Context, req lvmbackend.SnapshotRequest) (*lvmbackend.Volume, error) {
	done, err := l.wait(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	return l.Backend.SnapshotVolume(ctx, req)
}

func (l *lvmdCalls) Capacity(ctx context.Context) ([]lvmbackend.Capacity, error) {
	done, err := l.wait(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	return l.Backend.Capacity(ctx)
}
