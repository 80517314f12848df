package agent

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// The done line attributes a create's time to its steps, in order: the
// request's wait, lvmd's listing, the checks, the claim read again, lvmd's
// create, the claim read after it, the device.
func TestCreateSteps(t *testing.T) {
	e := start(t, Config{})
	// The spec without "creating": the running agent leaves the claim alone.
	pvc := e.pvc(t, "default", "pvc", node, map[string]string{kube.AnnSpec: `{"volumeGroup":"thick","name":"lv1","size":4096}`})
	spec, target, err := e.agent.createTarget(pvc)
	require.NoError(t, err)
	ctx, st := withSteps(context.Background(), 3*time.Second)
	out := e.agent.create(ctx, pvc, spec, target)
	require.Equal(t, kube.StateCreated, out.state, "%v", out.err)
	var names []string
	for i := 0; i < len(st.kvs()); i += 2 {
		names = append(names, st.kvs()[i].(string))
		require.IsType(t, time.Duration(0), st.kvs()[i+1])
	}
	require.Equal(t, []string{"queued", "lvmdList", "checks", "claimCheck", "lvmdCreate", "device"}, names)
	require.Equal(t, 3*time.Second, st.kvs()[1])
}

// pathUnreadable is a Backend whose first GetVolume fails as an lvmd away
// does.
type pathUnreadable struct {
	lvmbackend.Backend
	failed atomic.Bool
}

func (p *pathUnreadable) GetVolume(ctx context.Context, dc, name string) (*lvmbackend.Volume, error) {
	if p.failed.CompareAndSwap(false, true) {
		return nil, &lvmbackend.Error{Op: "list", Kind: lvmbackend.ErrUnavailable, Cause: errors.New("lvmd away")}
	}
	return p.Backend.GetVolume(ctx, dc, name)
}

// An LV made whose path cannot be read yet (lvmd went away after the
// create) is not answered "created" without a device, which a provisioner
// cannot use: the request is retried and answered with the device.
func TestCreatedAlwaysCarriesTheDevice(t *testing.T) {
	f, backend := serveLVMD(t, thickAndThin...)
	b := &pathUnreadable{Backend: backend}
	// Reads not shared: the path of the new LV is read by GetVolume.
	e := startOn(t, Config{ReadMaxAge: -1}, f, b)
	e.pvc(t, "default", "pvc", node, spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`))
	ann := e.waitPVC(t, "default", "pvc")
	require.True(t, b.failed.Load(), "the path's first read failed")
	assert.Equal(t, kube.StateCreated, ann[kube.AnnLifecycle])
	assert.Equal(t, "/dev/vg0/lv1", ann[kube.AnnDevice])
}

// A create reads its device class and the other classes (a claim owns one
// LV on the node) at once, not one after the other.
func TestCreateListsClassesAtOnce(t *testing.T) {
	e := start(t, Config{ReadMaxAge: -1})
	var now, most atomic.Int32
	e.lvm.SetHook(func(op, _, _ string) error {
		if op == "list" {
			n := now.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(100 * time.Millisecond)
			now.Add(-1)
		}
		return nil
	})
	e.pvc(t, "default", "pvc", node, spec(`{"volumeGroup":"thick","name":"lv1","size":4096}`))
	assert.Equal(t, kube.StateCreated, e.waitPVC(t, "default", "pvc")[kube.AnnLifecycle])
	assert.EqualValues(t, 2, most.Load(), "the thick and the thin class listed at once")
}
