package lvmbackend_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lvm-agent/lvm-agent/lvmbackend"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

// sharedLVMD is a fake topolvm lvmd whose listings are counted and can be
// held open (gate), behind a Shared.
type sharedLVMD struct {
	m      *lvmdfake.LVM
	shared *lvmbackend.Shared
	lists  atomic.Int32
	gate   chan struct{} // while not nil, each listing waits for a receive
	mu     sync.Mutex
}

func newSharedLVMD(t *testing.T, maxAge time.Duration) *sharedLVMD {
	t.Helper()
	s := &sharedLVMD{m: lvmdfake.NewLVM(lvmdfake.Class{Name: "vg1", VG: "vg1", SizeBytes: 1 << 30})}
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
	s.shared = lvmbackend.NewShared(b, maxAge)
	return s
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

// heldListing starts a ListVolumes that lvmd holds until release; its
// answer comes on the channel.
func (s *sharedLVMD) heldListing(t *testing.T) chan []lvmbackend.Volume {
	t.Helper()
	s.hold()
	listed := make(chan []lvmbackend.Volume)
	go func() {
		vols, err := s.shared.ListVolumes(context.Background(), "vg1")
		assert.NoError(t, err)
		listed <- vols
	}()
	s.waitLists(t, 1)
	return listed
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
	s.hold()
	var wg sync.WaitGroup
	got := make([][]lvmbackend.Volume, 20)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			vols, err := s.shared.ListVolumes(ctx, "vg1")
			assert.NoError(t, err)
			got[i] = vols
		}()
	}
	s.waitLists(t, 1)
	time.Sleep(50 * time.Millisecond) // the others join the listing in flight
	s.release()
	wg.Wait()
	assert.EqualValues(t, 1, s.lists.Load(), "twenty concurrent reads, one listing")
	for _, g := range got {
		assert.NotNil(t, g)
	}
}

func TestSharedGetVolumeReadsAfterItsCall(t *testing.T) {
	s := newSharedLVMD(t, time.Minute)
	ctx := context.Background()
	listed := s.heldListing(t)
	// An LV made by someone else after that listing began: a GetVolume
	// asked now must see it, so it may not share the listing in flight.
	_, err := s.m.Create("vg1", "foreign", 4096, nil)
	require.NoError(t, err)
	got := make(chan error)
	go func() {
		_, err := s.shared.GetVolume(ctx, "vg1", "foreign")
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	s.release()
	<-listed
	require.NoError(t, <-got)
	// (The fake reads its model when released, so both listings see the
	// LV; what must differ is that the GetVolume asked for its own.)
	assert.EqualValues(t, 2, s.lists.Load(), "the GetVolume did not share the listing that began before it")
}

func TestSharedOwnWritesKeepTheListing(t *testing.T) {
	s := newSharedLVMD(t, time.Minute)
	ctx := context.Background()
	_, err := s.m.Create("vg1", "first", 4096, nil)
	require.NoError(t, err)
	_, err = s.shared.ListVolumes(ctx, "vg1")
	require.NoError(t, err)

	v, err := s.shared.CreateVolume(ctx, lvmbackend.CreateRequest{DeviceClass: "vg1", Name: "mine", SizeBytes: 8192, Tags: []string{"t"}})
	require.NoError(t, err)
	assert.Equal(t, "/dev/vg1/mine", v.Path, "the path filled in is the one lvmd lists")

	vols, err := s.shared.ListVolumes(ctx, "vg1")
	require.NoError(t, err)
	assert.Equal(t, []string{"first", "mine"}, names(vols))
	assert.Equal(t, []string{"t"}, vols[1].Tags)

	size, err := s.shared.ResizeVolume(ctx, "vg1", "mine", 1<<20)
	require.NoError(t, err)
	require.NoError(t, s.shared.RemoveVolume(ctx, "vg1", "first"))
	vols, err = s.shared.ListVolumes(ctx, "vg1")
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
	vols, err := s.shared.ListVolumes(ctx, "vg1")
	require.NoError(t, err)
	assert.Equal(t, []string{"new"}, names(vols))
	assert.EqualValues(t, 1, s.lists.Load())
}

func TestSharedUnknownOutcomeDropsTheListing(t *testing.T) {
	s := newSharedLVMD(t, time.Minute)
	ctx := context.Background()
	_, err := s.shared.ListVolumes(ctx, "vg1")
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
	_, err = s.shared.ListVolumes(ctx, "vg1")
	require.NoError(t, err)
	assert.EqualValues(t, 2, s.lists.Load(), "a failed create: the next read asks lvmd")
}

func TestSharedMaxAge(t *testing.T) {
	s := newSharedLVMD(t, 50*time.Millisecond)
	ctx := context.Background()
	_, err := s.shared.ListVolumes(ctx, "vg1")
	require.NoError(t, err)
	_, err = s.m.Create("vg1", "foreign", 4096, nil)
	require.NoError(t, err)
	vols, err := s.shared.ListVolumes(ctx, "vg1")
	require.NoError(t, err)
	assert.Empty(t, vols, "within the age: the kept listing")
	// WithFresh (the orphan collector):
	// a listing begun after the call, whatever the kept one's age.
	vols, err = s.shared.ListVolumes(lvmbackend.WithFresh(ctx), "vg1")
	require.NoError(t, err)
	assert.Equal(t, []string{"foreign"}, names(vols), "WithFresh: lvmd's")
	time.Sleep(60 * time.Millisecond)
	vols, err = s.shared.ListVolumes(ctx, "vg1")
	require.NoError(t, err)
	assert.Equal(t, []string{"foreign"}, names(vols), "after it: lvmd's")
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

// slowCapacity is a Backend whose Capacity takes a while and is counted.
type slowCapacity struct {
	lvmbackend.Backend
	calls atomic.Int32
}

func (c *slowCapacity) Capacity(ctx context.Context) ([]lvmbackend.Capacity, error) {
	c.calls.Add(1)
	time.Sleep(100 * time.Millisecond)
	return c.Backend.Capacity(ctx)
}

// Requests reading the capacity at once (a burst's creates, each checking
// the other device classes) share one call into lvmd.
func TestSharedCapacityInFlight(t *testing.T) {
	s := newSharedLVMD(t, time.Minute)
	b := &slowCapacity{Backend: s.shared.Backend}
	shared := lvmbackend.NewShared(b, time.Minute)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			caps, err := shared.Capacity(context.Background())
			assert.NoError(t, err)
			assert.Len(t, caps, 1)
		})
	}
	wg.Wait()
	assert.EqualValues(t, 1, b.calls.Load(), "one call for eight readers")
}

// Refresh reads again, in the background, a kept listing and the device
// classes once they are older than half of MaxAge, so that the next read
// finds them young; younger ones, and nothing at all at rest, are left.
func TestSharedRefresh(t *testing.T) {
	const maxAge = time.Second
	s := newSharedLVMD(t, maxAge)
	b := &slowCapacity{Backend: s.shared.Backend}
	shared := lvmbackend.NewShared(b, maxAge)
	start := time.Now()
	ctx := context.Background()
	_, err := shared.ListVolumes(ctx, "vg1")
	require.NoError(t, err)
	_, err = shared.Capacity(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, s.lists.Load())
	require.EqualValues(t, 1, b.calls.Load())

	shared.Refresh()
	time.Sleep(100 * time.Millisecond)
	assert.EqualValues(t, 1, s.lists.Load(), "younger than half of MaxAge: not read again")
	assert.EqualValues(t, 1, b.calls.Load())

	time.Sleep(time.Until(start.Add(maxAge * 6 / 10))) // past half of MaxAge
	_, err = s.m.Create("vg1", "foreign", 4096, nil)
	require.NoError(t, err)
	shared.Refresh()
	s.waitLists(t, 2)
	require.Eventually(t, func() bool { return b.calls.Load() == 2 }, 5*time.Second, time.Millisecond)
	time.Sleep(time.Until(start.Add(maxAge * 11 / 10))) // the first listing is past MaxAge, the refreshed one is not
	vols, err := shared.ListVolumes(ctx, "vg1")
	require.NoError(t, err)
	assert.Equal(t, []string{"foreign"}, names(vols), "the refreshed listing, kept")
	_, err = shared.Capacity(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 2, s.lists.Load(), "answered by the refreshed listing")
	assert.EqualValues(t, 2, b.calls.Load(), "answered by the refreshed capacity")
}
