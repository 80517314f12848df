package agent

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// concurrentCalls is a Backend that holds each call a while and records
// the most calls it had at once.
type concurrentCalls struct {
	lvmbackend.Backend
	mu      sync.Mutex
	now, hi int
}

func (c *concurrentCalls) hold() func() {
	c.mu.Lock()
	c.now++
	c.hi = max(c.hi, c.now)
	c.mu.Unlock()
	time.Sleep(20 * time.Millisecond)
	return func() { c.mu.Lock(); c.now--; c.mu.Unlock() }
}

func (c *concurrentCalls) most() int { c.mu.Lock(); defer c.mu.Unlock(); return c.hi }

func (c *concurrentCalls) ListVolumes(ctx context.Context, dc string) ([]lvmbackend.Volume, error) {
	defer c.hold()()
	return c.Backend.ListVolumes(ctx, dc)
}

func (c *concurrentCalls) Capacity(ctx context.Context) ([]lvmbackend.Capacity, error) {
	defer c.hold()()
	return c.Backend.Capacity(ctx)
}

func (c *concurrentCalls) CreateVolume(ctx context.Context, req lvmbackend.CreateRequest) (*lvmbackend.Volume, error) {
	defer c.hold()()
	return c.Backend.CreateVolume(ctx, req)
}

func (c *concurrentCalls) GetVolume(ctx context.Context, dc, name string) (*lvmbackend.Volume, error) {
	defer c.hold()()
	return c.Backend.GetVolume(ctx, dc, name)
}

// A burst of requests, more than the workers: the agent's calls into lvmd
// at once never pass LVMDCalls (bench-peers: lvm processes piled up in
// lvmd starved the node), and every request is answered.
func TestLVMDCallsBounded(t *testing.T) {
	for _, limit := range []int{1, DefaultLVMDCalls} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			f, backend := serveLVMD(t, thickAndThin...)
			calls := &concurrentCalls{Backend: backend}
			e := startOn(t, Config{LVMDCalls: limit}, f, calls) // 4 workers
			for i := range 8 {
				e.pvc(t, "default", fmt.Sprintf("pvc%d", i), node, spec(fmt.Sprintf(`{"volumeGroup":"thick","name":"lv%d","size":4194304}`, i)))
			}
			for i := range 8 {
				assert.Equal(t, kube.StateCreated, e.waitPVC(t, "default", fmt.Sprintf("pvc%d", i))[kube.AnnLifecycle])
			}
			assert.LessOrEqual(t, calls.most(), limit, "calls into lvmd at once")
			assert.Equal(t, limit, calls.most(), "calls at once: the bound is reached (the test's burst is big enough to fail without it)")
		})
	}
}

// slowCalls is a Backend whose calls each take d, or end early with their
// context's error, which it counts.
type slowCalls struct {
	lvmbackend.Backend
	d        time.Duration
	mu       sync.Mutex
	timedOut int
}

func (c *slowCalls) wait(ctx context.Context) error {
	select {
	case <-time.After(c.d):
		return nil
	case <-ctx.Done():
		c.mu.Lock()
		c.timedOut++
		c.mu.Unlock()
		return ctx.Err()
	}
}

func (c *slowCalls) cut() int { c.mu.Lock(); defer c.mu.Unlock(); return c.timedOut }

func (c *slowCalls) ListVolumes(ctx context.Context, dc string) ([]lvmbackend.Volume, error) {
	if err := c.wait(ctx); err != nil {
		return nil, err
	}
	return c.Backend.ListVolumes(ctx, dc)
}

func (c *slowCalls) GetVolume(ctx context.Context, dc, name string) (*lvmbackend.Volume, error) {
	if err := c.wait(ctx); err != nil {
		return nil, err
	}
	return c.Backend.GetVolume(ctx, dc, name)
}

func (c *slowCalls) CreateVolume(ctx context.Context, req lvmbackend.CreateRequest) (*lvmbackend.Volume, error) {
	if err := c.wait(ctx); err != nil {
		return nil, err
	}
	return c.Backend.CreateVolume(ctx, req)
}

// OpTimeout bounds an lvmd call from its turn: a burst queued behind one
// slot for longer than OpTimeout is answered without a call cut short (a
// recovering node: every request at once), and a call that itself runs
// longer than OpTimeout is cut.
func TestLVMDCallBoundedFromItsTurn(t *testing.T) {
	f, backend := serveLVMD(t, thickAndThin...)
	calls := &slowCalls{Backend: backend, d: 50 * time.Millisecond}
	e := startOn(t, Config{LVMDCalls: 1, OpTimeout: 200 * time.Millisecond, ReadMaxAge: -1}, f, calls)
	start := time.Now()
	for i := range 8 {
		e.pvc(t, "default", fmt.Sprintf("pvc%d", i), node, spec(fmt.Sprintf(`{"volumeGroup":"thick","name":"lv%d","size":4194304}`, i)))
	}
	for i := range 8 {
		assert.Equal(t, kube.StateCreated, e.waitPVC(t, "default", fmt.Sprintf("pvc%d", i))[kube.AnnLifecycle])
	}
	assert.Greater(t, time.Since(start), 4*200*time.Millisecond, "the burst queued for longer than OpTimeout (else the test proves nothing)")
	assert.Zero(t, calls.cut(), "lvmd calls cut short")

	slow := limitLVMDCalls(&slowCalls{Backend: backend, d: time.Second}, 1, 50*time.Millisecond)
	_, err := slow.ListVolumes(context.Background(), "thick")
	assert.ErrorIs(t, err, context.DeadlineExceeded, "a call longer than its bound")
}
