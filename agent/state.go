package agent

import (
	"maps"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
)

// Key names one request: a PVC by namespace/name, a PV by name. The original
// agent keyed PVCs by name alone, so two namespaces could collide.
type Key struct {
	Kind      Kind
	Namespace string
	Name      string
}

// Kind of object a request lives on.
type Kind string

const (
	KindPVC Kind = "pvc"
	KindPV  Kind = "pv"
)

func (k Key) String() string {
	if k.Namespace == "" {
		return string(k.Kind) + ":" + k.Name
	}
	return string(k.Kind) + ":" + k.Namespace + "/" + k.Name
}

// DesiredStateOfWorld holds the open requests owned by this node: each PVC
// that is "creating" and each PV that is "deleting", as last seen, with
// when the agent first saw it open (where its answer clock starts).
type DesiredStateOfWorld struct {
	mu   sync.RWMutex
	objs map[Key]request
}

type request struct {
	obj  runtime.Object
	seen time.Time
}

// Add records or replaces a request; a replaced one keeps its first
// sighting, unless it was answered since.
func (d *DesiredStateOfWorld) Add(k Key, obj runtime.Object) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.objs == nil {
		d.objs = map[Key]request{}
	}
	r := d.objs[k]
	if r.seen.IsZero() {
		r.seen = time.Now()
	}
	r.obj = obj
	d.objs[k] = r
}

// Remove forgets a request.
func (d *DesiredStateOfWorld) Remove(k Key) { d.mu.Lock(); delete(d.objs, k); d.mu.Unlock() }

// answered stops k's clock: the request stays held until the informer shows
// the answer, but the next one under this key (seen open by a sweep before
// the informer shows the answer, say) is timed from its own sighting.
func (d *DesiredStateOfWorld) answered(k Key) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r, ok := d.objs[k]; ok {
		r.seen = time.Time{}
		d.objs[k] = r
	}
}

// replace puts obj (nil: nothing) in place of old, if old is still the
// request held for k: an informer's newer object is never overwritten.
func (d *DesiredStateOfWorld) replace(k Key, old, obj runtime.Object) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.objs[k]
	if !ok || r.obj != old {
		return false
	}
	if obj == nil {
		delete(d.objs, k)
	} else {
		r.obj = obj
		d.objs[k] = r
	}
	return true
}

// Get returns the request for k, or nil.
func (d *DesiredStateOfWorld) Get(k Key) runtime.Object {
	obj, _ := d.get(k)
	return obj
}

// get returns the request for k and when it was first seen open.
func (d *DesiredStateOfWorld) get(k Key) (runtime.Object, time.Time) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	r := d.objs[k]
	return r.obj, r.seen
}

// Keys lists the open requests.
func (d *DesiredStateOfWorld) Keys() []Key {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return slices.Collect(maps.Keys(d.objs))
}

// Len is the number of open requests.
func (d *DesiredStateOfWorld) Len() int { d.mu.RLock(); defer d.mu.RUnlock(); return len(d.objs) }

// ActualStateOfWorld remembers the requests the agent has answered until the
// informer shows the answer. Between the write and that moment the informer
// still shows the request; this is what keeps the agent from acting — and
// writing — twice.
type ActualStateOfWorld struct {
	mu   sync.RWMutex
	done map[Key]string // the resourceVersion of the request that was answered
}

// Answered records that the request at resourceVersion rv got its final answer.
func (a *ActualStateOfWorld) Answered(k Key, rv string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.done == nil {
		a.done = map[Key]string{}
	}
	a.done[k] = rv
}

// IsAnswered reports whether the request at rv was answered already.
func (a *ActualStateOfWorld) IsAnswered(k Key, rv string) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	done, ok := a.done[k]
	return ok && done == rv
}

// Remove forgets k.
func (a *ActualStateOfWorld) Remove(k Key) { a.mu.Lock(); delete(a.done, k); a.mu.Unlock() }
