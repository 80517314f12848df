package chaos

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/lvm-agent/lvm-agent/kube"
)

// The tracker watches every PVC and PV from before the first is made until
// the end, and records each object's first final state and every change
// after it. It watches through the observer API server (harness
// StartObserver): no watch cache and no restarts, so its watch never breaks
// and never skips a version, whatever happens to the API server the agent
// and the provisioner use.

type objKey struct{ kind, ns, name string }

func (k objKey) String() string {
	if k.ns == "" {
		return k.kind + " " + k.name
	}
	return k.kind + " " + k.ns + "/" + k.name
}

// record is what the tracker knows of one object.
type record struct {
	uid     types.UID
	exists  bool
	rv      string // as last seen
	state   string // lifecycle as last seen
	reason  string
	errMsg  string
	final   runtime.Object // the object when its final state was first seen
	finalRV string
	// answered is when a created answer was first seen: before it, no
	// answer named the claim's LV.
	answered time.Time
	// finals counts the final states seen: a provisioner's request written
	// again after one (lifecycle back to creating/deleting) starts a new
	// round, and is not a write after the final state.
	finals int
	// modifiedAfterFinal counts updates seen after the final state;
	// writesAfterFinal are those that changed anything but the deletion
	// of the object (the provisioner deleting a claim is not a write to it).
	modifiedAfterFinal int
	writesAfterFinal   []string
}

type tracker struct {
	mu     sync.Mutex
	objs   map[objKey]*record
	notify chan struct{} // closed and replaced on every change
	events int
}

func newTracker() *tracker {
	return &tracker{objs: map[objKey]*record{}, notify: make(chan struct{})}
}

// start runs PVC and PV informers on c (every namespace) until ctx ends.
func (t *tracker) start(ctx context.Context, c kubernetes.Interface) error {
	f := informers.NewSharedInformerFactory(c, 0)
	h := cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { t.observe(obj.(runtime.Object), false) },
		UpdateFunc: func(old, obj any) {
			if old.(metav1.Object).GetResourceVersion() != obj.(metav1.Object).GetResourceVersion() {
				t.observe(obj.(runtime.Object), false)
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			t.observe(obj.(runtime.Object), true)
		},
	}
	pvc, pv := f.Core().V1().PersistentVolumeClaims().Informer(), f.Core().V1().PersistentVolumes().Informer()
	for _, inf := range []cache.SharedIndexInformer{pvc, pv} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return err
		}
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), pvc.HasSynced, pv.HasSynced) {
		return fmt.Errorf("tracker informers did not sync")
	}
	return nil
}

func keyOf(obj runtime.Object) (objKey, metav1.Object, string, bool) {
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		s := o.Annotations[kube.AnnLifecycle]
		return objKey{"pvc", o.Namespace, o.Name}, o, s, s == kube.StateCreated || s == kube.StateFailed
	case *corev1.PersistentVolume:
		s := o.Annotations[kube.AnnLifecycle]
		return objKey{"pv", "", o.Name}, o, s, s == kube.StateDeleted || s == kube.StateFailed
	}
	panic(fmt.Sprintf("unexpected %T", obj))
}

func (t *tracker) observe(obj runtime.Object, deleted bool) {
	key, m, state, final := keyOf(obj)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.events++
	r := t.objs[key]
	if r == nil || r.uid != m.GetUID() {
		// A new object, or a new one of the same name.
		r = &record{uid: m.GetUID()}
		t.objs[key] = r
	}
	r.exists, r.rv = !deleted, m.GetResourceVersion()
	switch {
	case deleted:
	case r.final != nil && (state == kube.StateCreating || state == kube.StateDeleting):
		r.final = nil // asked again: a new request
	case r.final != nil:
		r.modifiedAfterFinal++
		if diff := changedBeyondDeletion(r.final, obj); diff != "" {
			r.writesAfterFinal = append(r.writesAfterFinal, fmt.Sprintf("rv %s→%s: %s", r.finalRV, m.GetResourceVersion(), diff))
		}
	case final:
		r.final, r.finalRV = obj.DeepCopyObject(), m.GetResourceVersion()
		r.finals++
	}
	if state == kube.StateCreated && r.answered.IsZero() {
		r.answered = time.Now()
	}
	if !deleted {
		ann := m.GetAnnotations()
		r.state, r.reason, r.errMsg = state, ann[kube.AnnReason], ann[kube.AnnError]
	}
	close(t.notify)
	t.notify = make(chan struct{})
}

// changedBeyondDeletion describes what differs between two versions of an
// object other than what deleting it changes (deletion timestamp, grace
// period, finalizers) and bookkeeping (resourceVersion, managedFields).
func changedBeyondDeletion(before, after runtime.Object) string {
	_, bm, _, _ := keyOf(before)
	_, am, _, _ := keyOf(after)
	var diffs []string
	for _, d := range []struct {
		what string
		a, b any
	}{
		{"annotations", bm.GetAnnotations(), am.GetAnnotations()},
		{"labels", bm.GetLabels(), am.GetLabels()},
		{"ownerReferences", bm.GetOwnerReferences(), am.GetOwnerReferences()},
		{"spec", specOf(before), specOf(after)},
	} {
		if !equality.Semantic.DeepEqual(d.a, d.b) {
			diffs = append(diffs, d.what)
		}
	}
	if len(diffs) == 0 {
		return ""
	}
	ba, aa := bm.GetAnnotations(), am.GetAnnotations()
	var keys []string
	for k := range ba {
		if ba[k] != aa[k] {
			keys = append(keys, k)
		}
	}
	for k := range aa {
		if _, ok := ba[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return strings.Join(diffs, ",") + " changed (annotation keys: " + strings.Join(keys, " ") + ")"
}

func specOf(obj runtime.Object) any {
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		return o.Spec
	case *corev1.PersistentVolume:
		return o.Spec
	}
	return nil
}

// get returns a copy of what is known of key.
func (t *tracker) get(key objKey) (record, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.objs[key]
	if !ok {
		return record{}, false
	}
	return *r, true
}

// waitFinal waits until key has reached a final state (its uid when uid is
// not empty), or ctx ends.
func (t *tracker) waitFinal(ctx context.Context, key objKey, uid types.UID) (record, error) {
	return t.waitFinalN(ctx, key, uid, 1)
}

// waitFinalN waits for the final state of the n-th request on key.
func (t *tracker) waitFinalN(ctx context.Context, key objKey, uid types.UID, n int) (record, error) {
	for {
		t.mu.Lock()
		r, ok := t.objs[key]
		ch := t.notify
		if ok && r.final != nil && r.finals >= n && (uid == "" || r.uid == uid) {
			out := *r
			t.mu.Unlock()
			return out, nil
		}
		t.mu.Unlock()
		select {
		case <-ctx.Done():
			return record{}, fmt.Errorf("%s: no final state seen: %w", key, ctx.Err())
		case <-ch:
		}
	}
}

// all returns a copy of every record.
func (t *tracker) all() map[objKey]record {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[objKey]record, len(t.objs))
	for k, r := range t.objs {
		out[k] = *r
	}
	return out
}
