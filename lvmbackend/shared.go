package lvmbackend

import (
	"context"
	"errors"
	"path"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Shared is a Backend that shares the node's reads among the requests that
// wait for them at the same moment. topolvm's lvmd has no one-LV lookup:
// each GetLVList forks `lvs` over the whole volume group, and each
// Capacity opens a Watch stream (`lvm fullreport`). With one listing per
// request, a burst of N requests waits for N listings in a row (the
// cluster power cut's recovery: eight workers answered in bursts of eight,
// 90 s apart).
//
// Which reads may be old is in the method called, and how old in its
// argument:
//   - ListVolumes and GetVolume (a delete, the check after a failed create,
//     the orphan collector, a claim asked again) read a listing that began
//     after the call, shared by every such read waiting at that moment.
//     Capacity is lvmd's, asked at the call.
//   - ListVolumesWithin and CapacityWithin (a create: names, tags, sizes,
//     and the device classes' names) answer from the class's last listing
//     while it began less than maxAge before the call, or from the one in
//     flight. The agent's own writes through this Backend are applied to
//     the kept listing as they succeed (an LV made, removed, grown), so a
//     burst of this agent's creates costs one listing, not one each; a
//     write whose outcome is unknown (an error) drops it.
//   - Listed is not a read: the kept listing's entry, for a caller that
//     confirms it by other means (a grow: the kernel's device).
//
// google/lvmd has a one-LV lookup and cannot list a VG that holds a thin
// pool, so Shared serves topolvm's dialect (and direct reads over it) only.
// A hand-written single flight rather than x/sync/singleflight: a caller
// here must never join a listing that began before it asked (GetVolume), and
// a listing that began before one of this agent's writes ended must have
// that write applied, which singleflight's shared result cannot express.
type Shared struct {
	Backend
	// maxAge bounds how old a listing Listed answers from may be, and
	// Refresh reads again what is older than half of it.
	maxAge time.Duration
	now    func() time.Time

	mu      sync.Mutex
	classes map[string]*listing
	caps    []Capacity
	capsAt  time.Time
	// capsFlight is the Capacity call in progress: callers arriving while
	// it runs share its answer (a burst's requests all read it at once).
	capsFlight *capsFlight

	lists *prometheus.CounterVec
}

var _ Backend = (*Shared)(nil)

// listing is one device class's last listing and the one in flight.
type listing struct {
	vols []Volume
	kept bool // vols is a listing, at is when it began
	at   time.Time
	// epoch counts the writes whose outcome is unknown: a listing that
	// began in an earlier epoch is not kept.
	epoch  uint64
	flight *flight
	// dir is the directory of the class's LV devices (/dev/VG) as the last
	// listing with an LV in it showed: a new LV's path when CreateLV
	// answers without it, also once the class is empty again.
	dir string
}

// flight is one GetLVList in progress. Writes that succeed while it runs
// are journalled and replayed on its answer: each is idempotent (an LV put
// or dropped by name), so it does not matter whether lvmd's listing saw it.
type flight struct {
	done    chan struct{}
	started time.Time
	epoch   uint64
	journal []func([]Volume) []Volume
	vols    []Volume
	err     error
}

// NewShared wraps b; maxAge is Listed's bound and Refresh's (the
// agent's --lvmd-list-max-age, which it passes to the Within reads too).
func NewShared(b Backend, maxAge time.Duration) *Shared {
	s := &Shared{Backend: b, maxAge: maxAge, now: time.Now, classes: map[string]*listing{},
		lists: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lvm_agent_lvmd_lists_total",
			Help: "Listings of a device class asked of lvmd (fetched), and reads answered by one shared with other requests (shared)."}, []string{"read"}),
	}
	return s
}

// Describe and Collect make lvm_agent_lvmd_lists_total registrable.
func (s *Shared) Describe(ch chan<- *prometheus.Desc) { s.lists.Describe(ch) }

// Collect: see Describe.
func (s *Shared) Collect(ch chan<- prometheus.Metric) { s.lists.Collect(ch) }

func (s *Shared) class(dc string) *listing {
	l := s.classes[dc]
	if l == nil {
		l = &listing{}
		s.classes[dc] = l
	}
	return l
}

// ListVolumes reads a listing that began after the call, as GetVolume
// does: every ListVolumes waiting at that moment shares it. For a reader
// that must see what anything else on the node changed a moment ago (the
// orphan collector, a claim asked again).
func (s *Shared) ListVolumes(ctx context.Context, deviceClass string) ([]Volume, error) {
	return s.fresh(ctx, deviceClass, s.now())
}

// ListVolumesWithin answers from the class's kept listing while it began
// less than maxAge before the call (this Shared's writes applied to it),
// or else shares the listing in flight, whenever it began, or starts one.
// For a reader that decides by it only what a later check confirms (a
// create: nothing in the way, which lvcreate checks again); maxAge then
// bounds how long a change made by anything else goes unseen.
func (s *Shared) ListVolumesWithin(ctx context.Context, deviceClass string, maxAge time.Duration) ([]Volume, error) {
	s.mu.Lock()
	l := s.class(deviceClass)
	if l.kept && s.now().Sub(l.at) < maxAge {
		vols := clone(l.vols)
		s.mu.Unlock()
		s.lists.WithLabelValues("shared").Inc()
		return vols, nil
	}
	s.mu.Unlock()
	return s.fresh(ctx, deviceClass, time.Time{})
}

// Refresh reads again, in the background, what a create reads from this
// Shared once it is older than half of maxAge: each device class's kept
// listing and the device classes (CapacityWithin). The agent calls it after
// each answer: the reads then run between requests, and the next create
// finds them young instead of waiting for them once they pass maxAge (with
// topolvm's lvmd a listing forks lvs, and Capacity runs lvm fullreport:
// seconds each on a loaded node, and a create reads every class). Nothing
// is read at rest, and a class is read at most once per half maxAge.
// The channel is closed once the reads it started have ended; it is nil
// when none was due.
func (s *Shared) Refresh() <-chan struct{} {
	if s.maxAge <= 0 {
		return nil
	}
	s.mu.Lock()
	now, half := s.now(), s.maxAge/2
	var due []string
	for dc, l := range s.classes {
		if l.kept && l.flight == nil && now.Sub(l.at) >= half {
			due = append(due, dc)
		}
	}
	caps := s.caps != nil && s.capsFlight == nil && now.Sub(s.capsAt) >= half
	s.mu.Unlock()
	if len(due) == 0 && !caps {
		return nil
	}
	var wg sync.WaitGroup
	read := func(f func(context.Context)) {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), s.maxAge)
			defer cancel()
			f(ctx)
		})
	}
	for _, dc := range due {
		read(func(ctx context.Context) { _, _ = s.fresh(ctx, dc, time.Time{}) })
	}
	if caps {
		read(func(ctx context.Context) { _, _ = s.capacity(ctx, half) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return done
}

// GetVolume reads a listing that began after the call.
func (s *Shared) GetVolume(ctx context.Context, deviceClass, name string) (*Volume, error) {
	vols, err := s.fresh(ctx, deviceClass, s.now())
	if err != nil {
		return nil, err
	}
	return pick(vols, deviceClass, name)
}

// Listed is name as the class's kept listing shows it (the agent's own
// writes applied), while that listing is younger than maxAge; nil when
// there is none or the LV is not in it. Not a read: for a caller that
// confirms what it uses of the answer by other means (a grow: the kernel's
// device, agent/grow.go).
func (s *Shared) Listed(deviceClass, name string) *Volume {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.classes[deviceClass]
	if l == nil || !l.kept || s.now().Sub(l.at) >= s.maxAge {
		return nil
	}
	i := slices.IndexFunc(l.vols, func(v Volume) bool { return v.Name == name })
	if i < 0 {
		return nil
	}
	v := l.vols[i]
	v.Tags = slices.Clone(v.Tags)
	return &v
}

// fresh returns a listing that began at or after since: the one in flight
// when it did, or else the next one, which this call starts.
func (s *Shared) fresh(ctx context.Context, dc string, since time.Time) ([]Volume, error) {
	s.mu.Lock()
	l := s.class(dc)
	f := l.flight
	if f != nil && (f.started.Before(since) || f.epoch != l.epoch) {
		// Too old for this caller: wait for it to end, then start the next
		// (others arriving meanwhile share that one).
		s.mu.Unlock()
		if err := wait(ctx, "list", f.done); err != nil {
			return nil, err
		}
		return s.fresh(ctx, dc, since)
	}
	if f != nil {
		s.mu.Unlock()
		s.lists.WithLabelValues("shared").Inc()
		if err := wait(ctx, "list", f.done); err != nil {
			return nil, err
		}
		return clone(f.vols), f.err
	}
	f = &flight{done: make(chan struct{}), started: s.now(), epoch: l.epoch}
	l.flight = f
	s.mu.Unlock()

	s.lists.WithLabelValues("fetched").Inc()
	vols, err := s.Backend.ListVolumes(ctx, dc)

	s.mu.Lock()
	for _, apply := range f.journal {
		vols = apply(vols)
	}
	f.vols, f.err = vols, err
	l.flight = nil
	for _, v := range vols {
		if v.Path != "" {
			l.dir = path.Dir(v.Path)
			break
		}
	}
	if err == nil && f.epoch == l.epoch {
		l.vols, l.kept, l.at = clone(vols), true, f.started
	} else {
		l.vols, l.kept = nil, false
	}
	s.mu.Unlock()
	close(f.done)
	return clone(vols), err
}

// wait waits for a call in progress to end (done closed), or for ctx.
func wait(ctx context.Context, op string, done <-chan struct{}) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return &Error{Op: op, Kind: ErrUnavailable, Cause: ctx.Err()}
	}
}

// wrote records a write's effect on a class: apply (idempotent) on the
// kept listing and on the one in flight, or, with apply nil (an unknown
// outcome), drop both.
func (s *Shared) wrote(dc string, apply func([]Volume) []Volume) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.class(dc)
	if apply == nil {
		l.vols, l.kept = nil, false
		l.epoch++
		return
	}
	if l.kept {
		l.vols = apply(l.vols)
	}
	if l.flight != nil {
		l.flight.journal = append(l.flight.journal, apply)
	}
}

// put is the write of an LV lvmd answered for. Its answer has no lv_attr,
// which makes the agent check dependents by a fresh read.
func put(v Volume) func([]Volume) []Volume {
	return func(vols []Volume) []Volume {
		if i := slices.IndexFunc(vols, func(o Volume) bool { return o.Name == v.Name }); i >= 0 {
			return slices.Replace(vols, i, i+1, v)
		}
		return append(vols, v)
	}
}

func drop(name string) func([]Volume) []Volume {
	return func(vols []Volume) []Volume {
		return slices.DeleteFunc(vols, func(o Volume) bool { return o.Name == name })
	}
}

// CreateVolume creates and records the LV. topolvm's CreateLV answers
// without the path: it gets the one its class's listings imply (lvmd lists
// every LV of a VG as /dev/VG/NAME), so that the answer needs no listing of
// its own; a class never listed with an LV in it leaves the path to the
// caller's GetVolume.
func (s *Shared) CreateVolume(ctx context.Context, req CreateRequest) (*Volume, error) {
	v, err := s.Backend.CreateVolume(ctx, req)
	if err != nil {
		s.wrote(req.DeviceClass, nil)
		return nil, err
	}
	if v.Path == "" {
		s.mu.Lock()
		if l := s.class(req.DeviceClass); l.dir != "" {
			v.Path = path.Join(l.dir, v.Name)
		}
		s.mu.Unlock()
	}
	s.wrote(req.DeviceClass, put(*v))
	return v, nil
}

// SnapshotVolume makes and records the snapshot; the source's listed
// lv_attr no longer holds (it is an origin now), so the listing is dropped.
func (s *Shared) SnapshotVolume(ctx context.Context, req SnapshotRequest) (*Volume, error) {
	v, err := s.Backend.SnapshotVolume(ctx, req)
	s.wrote(req.DeviceClass, nil)
	return v, err
}

// RemoveVolume removes and records; a missing LV is gone all the same.
func (s *Shared) RemoveVolume(ctx context.Context, deviceClass, name string) error {
	err := s.Backend.RemoveVolume(ctx, deviceClass, name)
	if err == nil || errors.Is(err, ErrNotFound) {
		s.wrote(deviceClass, drop(name))
	} else {
		s.wrote(deviceClass, nil)
	}
	return err
}

// ResizeVolume grows and records the new size.
func (s *Shared) ResizeVolume(ctx context.Context, deviceClass, name string, sizeBytes int64) (int64, error) {
	size, err := s.Backend.ResizeVolume(ctx, deviceClass, name, sizeBytes)
	if err != nil {
		s.wrote(deviceClass, nil)
		return size, err
	}
	s.wrote(deviceClass, func(vols []Volume) []Volume {
		for i := range vols {
			if vols[i].Name == name {
				vols[i].SizeBytes = max(vols[i].SizeBytes, size)
			}
		}
		return vols
	})
	return size, nil
}

// capsFlight is one Capacity call in progress.
type capsFlight struct {
	done chan struct{}
	caps []Capacity
	err  error
}

// CapacityWithin answers from an answer begun less than maxAge before the
// call, or shares the call in progress, whenever it began, or else makes
// one. For a reader of the device classes' names (a create's check of the
// other classes, the orphan collector).
func (s *Shared) CapacityWithin(ctx context.Context, maxAge time.Duration) ([]Capacity, error) {
	return s.capacity(ctx, maxAge)
}

// capacity answers as CapacityWithin.
func (s *Shared) capacity(ctx context.Context, maxAge time.Duration) ([]Capacity, error) {
	s.mu.Lock()
	if s.caps != nil && s.now().Sub(s.capsAt) < maxAge {
		caps := slices.Clone(s.caps)
		s.mu.Unlock()
		return caps, nil
	}
	if f := s.capsFlight; f != nil {
		s.mu.Unlock()
		if err := wait(ctx, "capacity", f.done); err != nil {
			return nil, err
		}
		return slices.Clone(f.caps), f.err
	}
	f := &capsFlight{done: make(chan struct{})}
	s.capsFlight = f
	s.mu.Unlock()
	at := s.now()
	f.caps, f.err = s.Backend.Capacity(ctx)
	s.mu.Lock()
	if f.err == nil {
		s.caps, s.capsAt = slices.Clone(f.caps), at
	}
	s.capsFlight = nil
	s.mu.Unlock()
	close(f.done)
	return slices.Clone(f.caps), f.err
}

// clone copies a listing deeply enough that callers may change it.
func clone(vols []Volume) []Volume {
	if vols == nil {
		return nil
	}
	out := slices.Clone(vols)
	for i := range out {
		out[i].Tags = slices.Clone(out[i].Tags)
	}
	return out
}
