package lvmbackend_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/lvm-agent/lvm-agent/lvmbackend"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

// sharedLVMD is a fake topolvm lvmd whose listings are counted and can be
// held open (gate), behind a Shared that reads the time from clock.
type sharedLVMD struct {
	m      *lvmdfake.LVM
	shared *lvmbackend.Shared
	maxAge time.Duration
	clock  *testingclock.FakeClock
	lists  atomic.Int32
	gate   chan struct{} // while not nil, each listing waits for a receive
	mu     sync.Mutex
}

func newSharedLVMD(t *testing.T, maxAge time.Duration) *sharedLVMD {
	t.Helper()
	s := &sharedLVMD{m: lvmdfake.NewLVM(lvmdfake.Class{Name: "vg1", VG: "vg1", SizeBytes: 1 << 30}),
		maxAge: maxAge, clock: testingclock.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	s.m.SetHook(func(op, _, _ string) error {
		if op != "list" {
			return nil
		}
		s.lists.Add(1)
		s.mu.Lock()
		gate := s.gate
		s.mu.Unlock()
		if gate != nil {
			<-gate
		}
		return nil
	})
	srv := lvmdfake.NewTopolvm(s.m)
	sock := filepath.Join(t.TempDir(), "lvmd.sock")
	require.NoError(t, srv.Serve(sock))
	t.Cleanup(srv.Stop)
	b, err := lvmbackend.NewTopolvm(sock)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	s.shared = s.wrap(b)
	return s
}

// wrap is a Shared over b with this fake's maxAge and clock.
func (s *sharedLVMD) wrap(b lvmbackend.Backend) *lvmbackend.Shared {
	shared := lvmbackend.NewShared(b, s.maxAge)
	lvmbackend.SetClock(shared, s.clock)
	return shared
}

// within is a create's read of vg1: a listing up to maxAge old.
func (s *sharedLVMD) within(ctx context.Context) ([]lvmbackend.Volume, error) {
	return s.shared.ListVolumesWithin(ctx, "vg1", s.maxAge)
}

func (s *sharedLVMD) hold() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gate = make(chan struct{})
	return s.gate
}

func (s *sharedLVMD) release() {
	s.mu.Lock()
	gate := s.gate
	s.gate = nil
	s.mu.Unlock()
	close(gate)
}

// waitLists waits until lvmd has been asked for n listings.
func (s *sharedLVMD) waitLists(t *testing.T, n int32) {
	t.Helper()
	require.Eventually(t, func() bool { return s.lists.Load() >= n }, 5*time.Second, time.Millisecond)
}

// heldListing starts a create's listing that lvmd holds until release;
// its answer comes on the channel.
func (s *sharedLVMD) heldListing(t *testing.T) chan []lvmbackend.Volume {
	t.Helper()
	s.hold()
	listed := make(chan []lvmbackend.Volume)
	go func() {
		vols, err := s.within(context.Background())
		assert.NoError(t, err)
		listed <- vols
	}()
	s.waitLists(t, 1)
	return listed
}

// sharedReads is lvm_agent_lvmd_lists_total{read="shared"}: the reads
// answered by a listing they did not ask lvmd for.
func sharedReads(t *testing.T, s *lvmbackend.Shared) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(s))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "read" && l.GetValue() == "shared" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// waiting is a context that says when a read first waits on it: Shared
// calls Done only to wait for a call in progress (one it shares, or an
// older one it must outlast) before anything else does.
type waiting struct {
	context.Context
	once sync.Once
	c    chan struct{}
}

func newWaiting() *waiting { return &waiting{Context: context.Background(), c: make(chan struct{})} }

func (w *waiting) Done() <-chan struct{} {
	w.once.Do(func() { close(w.c) })
	return w.Context.Done()
}

// await fails t unless c is closed (or receives) within a few seconds.
func await[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(5 * time.Second):
		require.FailNow(t, "timed out: "+what)
	}
	var zero T
	return zero
}

func names(vols []lvmbackend.Volume) []string {
	var out []string
	for _, v := range vols {
		out = append(out, v.Name)
	}
	return out
}

func TestSharedConcurrentListingsShareOne(t *testing.T) {
	s := newSharedLVMD(t, time.Minute)
	ctx := context.Background()
	listed := s.heldListing(t)
	var wg sync.WaitGroup
	got := make([][]lvmbackend.Volume, 19)
	for i := range got {
		wg.Go(func() {
			vols, err := s.within(ctx)
			assert.NoError(t, err)
			got[i] = vols
		})
	}
	// The others join the listing in flight, each counted as it does.
	require.Eventually(t, func() bool { return sharedReads(t, s.shared) == float64(len(got)) }, 5*time.Second, time.Millisecond)
	s.release()
	wg.Wait()
	assert.NotNil(t, await(t, listed, "the first listing"))
	assert.EqualValues(t, 1, s.lists.Load(), "twenty concurrent reads, one listing")
	for _, g := range got {
		assert.NotNil(t, g)
	}
}

// GetVolume and ListVolumes never share a listing that began before their
// call: they wait for it to end, then read their own.
func TestSharedGetVolumeReadsAfterItsCall(t *testing.T) {
	for _, tc := range []struct {
		name string
		read func(*lvmbackend.Shared, context.Context) error
	}{
		{"GetVolume", func(s *lvmbackend.Shared, ctx context.Context) error {
			_, err := s.GetVolume(ctx, "vg1", "foreign")
			return err
		}},
		{"ListVolumes", func(s *lvmbackend.Shared, ctx context.Context) error {
			vols, err := s.ListVolumes(ctx, "vg1")
			if err == nil && !slices.Contains(names(vols), "foreign") {
				err = errors.New("foreign not listed")
			}
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSharedLVMD(t, time.Minute)
			listed := s.heldListing(t)
			// An LV made by someone else after that listing began: a read
			// asked now must see it, so it may not share the listing in flight.
			s.clock.Step(time.Second)
			_, err := s.m.Create("vg1", "foreign", 4096, nil)
			require.NoError(t, err)
			ctx := newWaiting()
			got := make(chan error)
			go func() { got <- tc.read(s.shared, ctx) }()
			await(t, ctx.c, "the read waits for the listing in flight")
			s.release()
			await(t, listed, "the first listing")
			require.NoError(t, await(t, got, "the read"))
			// (The fake reads its model when released, so both listings see the
			// LV; what must differ is that the read asked for its own.)
			assert.EqualValues(t, 2, s.lists.Load(), "the read did not share the listing that began before it")
			assert.Zero(t, sharedReads(t, s.shared))
		})
	}
}

func TestSharedOwnWritesKeepTheListing(t *testing.T) {
	s := newSharedLVMD(t, time.Minute)
	ctx := context.Background()
	_, err := s.m.Create("vg1", "first", 4096, nil)
	require.NoError(t, err)
	_, err = s.within(ctx)
	require.NoError(t, err)

	v, err := s.shared.CreateVolume(ctx, lvmbackend.CreateRequest{DeviceClass: "vg1", Name: "mine", SizeBytes: 8192, Tags: []string{"t"}})
	require.NoError(t, err)
	assert.Equal(t, "/dev/vg1/mine", v.Path, "the path filled in is the one lvmd lists")

	vols, err := s.within(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"first", "mine"}, names(vols))
	assert.Equal(t, []string{"t"}, vols[1].Tags)

	size, err := s.shared.ResizeVolume(ctx, "vg1", "mine", 1<<20)
	require.NoError(t, err)
	require.NoError(t, s.shared.RemoveVolume(ctx, "vg1", "first"))
	vols, err = s.within(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"mine"}, names(vols))
	assert.Equal(t, size, vols[0].SizeBytes)
	assert.EqualValues(t, 1, s.lists.Load(), "one listing for all of it")
}

func TestSharedWriteDuringAListingIsApplied(t *testing.T) {
	s := newSharedLVMD(t, time.Minute)
	ctx := context.Background()
	_, err := s.m.Create("vg1", "old", 4096, nil)
	require.NoError(t, err)
	listed := s.heldListing(t)
	// Whether lvmd's listing sees these writes or not (the fake's sees
	// them: it reads its model once released), the answer is the same.
	_, err = s.shared.CreateVolume(ctx, lvmbackend.CreateRequest{DeviceClass: "vg1", Name: "new", SizeBytes: 4096})
	require.NoError(t, err)
	require.NoError(t, s.shared.RemoveVolume(ctx, "vg1", "old"))
	s.release()
	assert.Equal(t, []string{"new"}, names(<-listed))
	vols, err := s.within(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"new"}, names(vols))
	assert.EqualValues(t, 1, s.lists.Load())
}

func TestSharedUnknownOutcomeDropsTheListing(t *testing.T) {
	s := newSharedLVMD(t, time.Minute)
	ctx := context.Background()
	_, err := s.within(ctx)
	require.NoError(t, err)
	s.m.SetHook(func(op, _, _ string) error {
		if op == "list" {
			s.lists.Add(1)
		}
		if op == "create" {
			return errors.New("lvm died")
		}
		return nil
	})
	_, err = s.shared.CreateVolume(ctx, lvmbackend.CreateRequest{DeviceClass: "vg1", Name: "x", SizeBytes: 4096})
	require.Error(t, err)
	_, err = s.within(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 2, s.lists.Load(), "a failed create: the next read asks lvmd")
}

func TestSharedMaxAge(t *testing.T) {
	const maxAge = time.Minute
	s := newSharedLVMD(t, maxAge)
	ctx := context.Background()
	_, err := s.within(ctx)
	require.NoError(t, err)
	_, err = s.m.Create("vg1", "foreign", 4096, nil)
	require.NoError(t, err)
	vols, err := s.within(ctx)
	require.NoError(t, err)
	assert.Empty(t, vols, "within the age: the kept listing")
	// ListVolumes (the orphan collector, a claim asked again): a listing
	// begun after the call, whatever the kept one's age.
	vols, err = s.shared.ListVolumes(ctx, "vg1")
	require.NoError(t, err)
	assert.Equal(t, []string{"foreign"}, names(vols), "ListVolumes: lvmd's")
	s.clock.Step(maxAge - time.Nanosecond)
	_, err = s.within(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 2, s.lists.Load(), "just under the age: the kept listing")
	s.clock.Step(time.Nanosecond)
	_, err = s.m.Create("vg1", "later", 4096, nil)
	require.NoError(t, err)
	vols, err = s.within(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"foreign", "later"}, names(vols), "at the age: lvmd's")
	assert.EqualValues(t, 3, s.lists.Load())
}

// A new LV's path comes from the class's listings also once the class is
// empty again and its listing is no longer kept (one-at-a-time creates
// and deletes): no listing is spent on the answer's device. A class never
// listed with an LV leaves the path empty, for the caller to read.
func TestSharedPathOfANewLVInAnEmptyClass(t *testing.T) {
	s := newSharedLVMD(t, time.Minute)
	ctx := context.Background()
	v, err := s.shared.CreateVolume(ctx, lvmbackend.CreateRequest{DeviceClass: "vg1", Name: "first", SizeBytes: 4096})
	require.NoError(t, err)
	assert.Empty(t, v.Path, "no listing has shown the class's directory yet")
	got, err := s.shared.GetVolume(ctx, "vg1", "first")
	require.NoError(t, err)
	assert.Equal(t, "/dev/vg1/first", got.Path)
	require.NoError(t, s.shared.RemoveVolume(ctx, "vg1", "first"))
	// An outcome not known drops the kept listing; the directory stays.
	_, err = s.shared.ResizeVolume(ctx, "vg1", "nope", 1<<20)
	require.Error(t, err)
	lists := s.lists.Load()

	v, err = s.shared.CreateVolume(ctx, lvmbackend.CreateRequest{DeviceClass: "vg1", Name: "second", SizeBytes: 4096})
	require.NoError(t, err)
	assert.Equal(t, "/dev/vg1/second", v.Path)
	assert.Equal(t, lists, s.lists.Load(), "no listing for the path")
}

// heldCapacity is a Backend whose Capacity calls are counted, each
// entering said on entered and, while gate is not nil, held until it is
// closed.
type heldCapacity struct {
	lvmbackend.Backend
	calls   atomic.Int32
	entered chan struct{}
	gate    chan struct{}
}

func (c *heldCapacity) Capacity(ctx context.Context) ([]lvmbackend.Capacity, error) {
	c.calls.Add(1)
	if c.gate != nil {
		c.entered <- struct{}{}
		<-c.gate
	}
	return c.Backend.Capacity(ctx)
}

// Requests reading the capacity at once (a burst's creates, each checking
// the other device classes) share one call into lvmd.
func TestSharedCapacityInFlight(t *testing.T) {
	s := newSharedLVMD(t, time.Minute)
	b := &heldCapacity{Backend: s.shared.Backend, entered: make(chan struct{}, 8), gate: make(chan struct{})}
	shared := s.wrap(b)
	var wg sync.WaitGroup
	read := func(ctx context.Context) {
		wg.Go(func() {
			caps, err := shared.CapacityWithin(ctx, time.Minute)
			assert.NoError(t, err)
			assert.Len(t, caps, 1)
		})
	}
	read(context.Background())
	await(t, b.entered, "the first call reaches lvmd")
	for range 7 {
		ctx := newWaiting()
		read(ctx)
		await(t, ctx.c, "a reader waits for the call in progress")
	}
	close(b.gate)
	wg.Wait()
	assert.EqualValues(t, 1, b.calls.Load(), "one call for eight readers")
}

// Refresh reads again, in the background, a kept listing and the device
// classes once they are older than half of maxAge, so that the next read
// finds them young; younger ones, and nothing at all at rest, are left.
func TestSharedRefresh(t *testing.T) {
	const maxAge = time.Minute
	s := newSharedLVMD(t, maxAge)
	b := &heldCapacity{Backend: s.shared.Backend}
	shared := s.wrap(b)
	ctx := context.Background()
	_, err := shared.ListVolumesWithin(ctx, "vg1", maxAge)
	require.NoError(t, err)
	_, err = shared.CapacityWithin(ctx, maxAge)
	require.NoError(t, err)
	require.EqualValues(t, 1, s.lists.Load())
	require.EqualValues(t, 1, b.calls.Load())

	// Nothing due: Refresh starts no read, so none can come later.
	assert.Nil(t, shared.Refresh(), "younger than half of maxAge: not read again")
	assert.EqualValues(t, 1, s.lists.Load())
	assert.EqualValues(t, 1, b.calls.Load())

	s.clock.Step(maxAge * 6 / 10) // past half of maxAge
	_, err = s.m.Create("vg1", "foreign", 4096, nil)
	require.NoError(t, err)
	done := shared.Refresh()
	require.NotNil(t, done, "past half of maxAge: read again")
	await(t, done, "the refresh's reads")
	assert.EqualValues(t, 2, s.lists.Load())
	assert.EqualValues(t, 2, b.calls.Load())
	s.clock.Step(maxAge * 5 / 10) // the first listing is past maxAge, the refreshed one is not
	vols, err := shared.ListVolumesWithin(ctx, "vg1", maxAge)
	require.NoError(t, err)
	assert.Equal(t, []string{"foreign"}, names(vols), "the refreshed listing, kept")
	_, err = shared.CapacityWithin(ctx, maxAge)
	require.NoError(t, err)
	assert.EqualValues(t, 2, s.lists.Load(), "answered by the refreshed listing")
	assert.EqualValues(t, 2, b.calls.Load(), "answered by the refreshed capacity")
}
