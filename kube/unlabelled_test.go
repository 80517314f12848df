package kube

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
)

func heldLease(holder string, renewed time.Time, seconds int32) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "lvm-agent", Name: LabellerLeaseName, UID: "lease-uid"}}
	if holder != "" {
		l.Spec.HolderIdentity = &holder
	}
	l.Spec.LeaseDurationSeconds = &seconds
	t := metav1.NewMicroTime(renewed)
	l.Spec.RenewTime = &t
	return l
}

func TestLeaseExpiry(t *testing.T) {
	now := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	d := 40 * time.Second
	fresh := heldLease("p", now.Add(-5*time.Second), 40)
	for _, c := range []struct {
		name       string
		l, prev    *coordinationv1.Lease
		prevExpiry time.Time
		want       time.Time
	}{
		{name: "absent", want: now},
		{name: "released", l: heldLease("", now, 40), want: now},
		{name: "no duration", l: heldLease("p", now, 0), want: now},
		{name: "first sight: by its renewTime", l: fresh, want: now.Add(35 * time.Second)},
		{name: "first sight, long expired", l: heldLease("p", now.Add(-time.Hour), 40), want: now.Add(-time.Hour + d)},
		{name: "first sight, renewTime ahead of this clock: no later than a duration from now", l: heldLease("p", now.Add(time.Hour), 40), want: now.Add(d)},
		{name: "renewed since: a duration from now, whatever its clock", l: heldLease("p", now.Add(-time.Hour), 40),
			prev: heldLease("p", now.Add(-2*time.Hour), 40), prevExpiry: now.Add(-time.Second), want: now.Add(d)},
		{name: "not renewed since: unchanged", l: fresh, prev: fresh, prevExpiry: now.Add(time.Second), want: now.Add(time.Second)},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, leaseExpiry(c.l, c.prev, c.prevExpiry, now))
		})
	}
}

// lockedTarget is a SweepTarget for handlers called from informers.
type lockedTarget struct {
	mu sync.Mutex
	r  recorderTarget
}

func (l *lockedTarget) Swept(obj runtime.Object)     { l.mu.Lock(); l.r.Swept(obj); l.mu.Unlock() }
func (l *lockedTarget) SweptGone(obj runtime.Object) { l.mu.Lock(); l.r.SweptGone(obj); l.mu.Unlock() }
func (l *lockedTarget) swept() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.r.swept...)
}
func (l *lockedTarget) gone() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.r.gone...)
}

// The agent watches the unlabelled objects exactly while no labeller holds
// its Lease, and the watch hands over this node's objects only.
func TestLabellerPresence(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	me := Node{Name: "node-a", Drivers: []string{DefaultDriver}}
	c := fake.NewClientset(sweepPVC("mine", "node-a", StateCreating, nil), sweepPVC("theirs", "node-b", StateCreating, nil),
		sweepPVC("labelled", "node-a", StateCreating, map[string]string{LabelNode: "node-a"}))
	target := &lockedTarget{}
	w := NewUnlabelledWatch(clientset.Wrap(c), target, me, nil, nil)
	p := NewLabellerPresence(clientset.Wrap(c), LeaseRef{Namespace: "lvm-agent", Name: LabellerLeaseName}, w)
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	<-p.Synced()
	active := func(want bool) {
		t.Helper()
		require.Eventually(t, func() bool { return w.Active() == want }, 5*time.Second, 10*time.Millisecond, "watching: want %v", want)
	}
	active(true) // no Lease
	require.Eventually(t, func() bool { return len(target.swept()) > 0 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, []string{"ns/mine=creating"}, target.swept(), "this node's unlabelled request only")

	leases := c.CoordinationV1().Leases("lvm-agent")
	l, err := leases.Create(ctx, heldLease("provisioner-0", time.Now(), 1), metav1.CreateOptions{})
	require.NoError(t, err)
	active(false)
	// Not renewed: a second later the agent watches again.
	active(true)
	l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
	l.Spec.LeaseDurationSeconds = ptr.To(int32(40))
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	require.NoError(t, err)
	active(false)
	swept := len(target.swept())
	require.NoError(t, leases.Delete(ctx, l.Name, metav1.DeleteOptions{}))
	active(true)

	// A request that leaves the watch because it was deleted is forgotten
	// (once the watch started again has listed it).
	require.Eventually(t, func() bool { return len(target.swept()) > swept }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, c.CoreV1().PersistentVolumeClaims("ns").Delete(ctx, "mine", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return len(target.gone()) == 1 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, []string{"ns/mine"}, target.gone())

	cancel()
	<-done
	assert.False(t, w.Active(), "stopped with the presence")
}
