package agent

import (
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lvm-agent/lvm-agent/kube"
)

// The agent is the target of the hybrid watch mode's sweep (kube.Sweeper):
// what a sweep finds takes the informers' path, so that a request found by
// a sweep is handled, answered and forgotten exactly like a watched one.
var _ kube.SweepTarget = (*Agent)(nil)

// Swept is an object that the informers do not deliver. It is observed as an
// informer's update whose old object is the request last seen. A sweep sees
// snapshots, not every change: when the request last seen was answered and
// the object has changed since, it is asked again (say failed, then creating
// again with the same spec between two sweeps), so it is a new request even
// if it reads the same.
func (a *Agent) Swept(obj runtime.Object) {
	k, open := a.request(obj)
	if k.Kind == "" {
		return
	}
	old := a.DSW.Get(k)
	if old != nil && open {
		o, err1 := meta.Accessor(old)
		n, err2 := meta.Accessor(obj)
		if err1 == nil && err2 == nil && o.GetResourceVersion() != n.GetResourceVersion() && a.ASW.IsAnswered(k, o.GetResourceVersion()) {
			old = nil
		}
	}
	a.observe(old, obj) // a nil old is a first sighting
}

// SweptGone is an object handed over by a sweep that was deleted since. It
// is forgotten unless the informers hold another object of that name now.
func (a *Agent) SweptGone(obj runtime.Object) {
	k, _ := a.request(obj)
	m, err := meta.Accessor(obj)
	if k.Kind == "" || err != nil {
		return
	}
	if a.DSW.removeUID(k, m.GetUID()) {
		a.ASW.Remove(k)
	}
}

// removeUID forgets k if the request held is of the object with uid.
func (d *DesiredStateOfWorld) removeUID(k Key, uid types.UID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r, ok := d.objs[k]; ok {
		if m, err := meta.Accessor(r.obj); err == nil && m.GetUID() != uid {
			return false
		}
	}
	delete(d.objs, k)
	return true
}
