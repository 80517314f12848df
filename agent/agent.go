// Package agent is the node agent's logic: it turns lifecycle requests seen by
// the informers (the desired state of the world) into LVM operations through
// a Backend, answers them on the objects, and remembers what it answered (the
// actual state of the world). It knows the protocol; Kubernetes and gRPC
// details stay in kube/ and lvmbackend/.
package agent

import (
	"context"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// DefaultReadMaxAge is --lvmd-list-max-age: a create's listing decides only
// that nothing is in the way (lvcreate checks that again, and what the
// listing shows in the way is read afresh), so it may be old; the age
// bounds how long a change made by anything else goes unseen by the rule
// that a claim owns one LV on the node.
const DefaultReadMaxAge = 5 * time.Minute

// Config is what an agent needs to know about its node.
type Config struct {
	Node kube.Node
	// DeviceClasses maps a spec's volumeGroup to an lvmd device class; a
	// volume group that is not listed is a device class of the same name.
	DeviceClasses map[string]string
	// StripedOptionClass is the lvcreate option class for specs with striping.
	StripedOptionClass string
	// AllowUntagged lets deletes remove LVs without the ownership tag (made by
	// the original agent, which tagged nothing).
	AllowUntagged bool
	Workers       int
	// LVMDCalls bounds the calls into lvmd at once (DefaultLVMDCalls).
	LVMDCalls int
	// ShareReads shares lvmd's listings among the requests that wait for
	// them (lvmbackend.Shared), each kept for up to ReadMaxAge; only for a
	// dialect whose one-LV lookup is a listing (topolvm's).
	ShareReads bool
	ReadMaxAge time.Duration
	// OpTimeout bounds one lvmd call from its turn (the wait for a turn,
	// LVMDCalls, not included), and one API call of a request.
	OpTimeout time.Duration
	// Devices, when not nil, cross-checks LVs with the kernel's device-mapper.
	Devices *Devices
	// Backoff is the first and the longest retry delay of a request.
	BackoffBase, BackoffMax time.Duration
	// WaitPoll is the longest delay between two looks at a request that
	// waits for something outside the API (a thick clone's source in use:
	// nothing in the API says when its Pod let go of the device), so that
	// it goes on within WaitPoll of being free, however long it waited.
	WaitPoll time.Duration

	// Wiper zeroes thick LVs before their removal (wipe.go; nil: never,
	// as when the agent cannot write block devices: without Devices it
	// cannot tell that nothing has them open).
	Wiper *Wiper
	// Crypt makes encrypted volumes (crypt.go; nil: none, as without
	// Devices).
	Crypt *Crypt

	// openCounts reads a device's open count for a thick clone's copy
	// (Devices; nil: no copies); deviceRoot prefixes device paths and
	// sysRoot /sys. All are the tests' seams (regular files for devices).
	openCounts openCounter
	deviceRoot string
	sysRoot    string
}

// Agent is the reconciler.
type Agent struct {
	cfg     Config
	client  apiclient.Interface
	backend lvmbackend.Backend
	// shared is backend when it shares lvmd's listings (cfg.ShareReads),
	// else nil: a create's reads may be up to ReadMaxAge old (reads.go), a
	// grow confirms its kept listing with the kernel, and each answer has
	// aging listings read again (Refresh).
	shared   *lvmbackend.Shared
	recorder record.EventRecorder
	inf      *kube.Informers
	queue    workqueue.TypedRateLimitingInterface[Key]
	limiter  workqueue.TypedRateLimiter[Key] // the queue's; a wait's delay is capped (WaitPoll)
	metrics  *Metrics

	DSW DesiredStateOfWorld
	ASW ActualStateOfWorld

	mu   sync.Mutex
	busy map[target]bool // one operation at a time per LV
}

// New wires an agent to its informers; Run starts it.
func New(cfg Config, client apiclient.Interface, backend lvmbackend.Backend, recorder record.EventRecorder, inf *kube.Informers, metrics *Metrics) (*Agent, error) {
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 2 * time.Minute
	}
	if cfg.LVMDCalls <= 0 {
		cfg.LVMDCalls = DefaultLVMDCalls
	}
	backend = limitLVMDCalls(backend, cfg.LVMDCalls, cfg.OpTimeout)
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	var shared *lvmbackend.Shared
	if cfg.ShareReads {
		// Outside the bound: a request waiting for a shared listing holds
		// no turn of lvmd's.
		shared = lvmbackend.NewShared(backend, cfg.ReadMaxAge)
		if metrics.reg != nil {
			metrics.reg.MustRegister(shared)
		}
		backend = shared
	}
	if cfg.openCounts == nil && cfg.Devices != nil {
		cfg.openCounts = cfg.Devices
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = 500 * time.Millisecond
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = 2 * time.Minute
	}
	if cfg.WaitPoll <= 0 {
		cfg.WaitPoll = 10 * time.Second
	}
	limiter := workqueue.NewTypedItemExponentialFailureRateLimiter[Key](cfg.BackoffBase, cfg.BackoffMax)
	a := &Agent{cfg: cfg, client: client, backend: backend, shared: shared, recorder: recorder, inf: inf, metrics: metrics,
		busy: map[target]bool{}, limiter: limiter,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(limiter,
			workqueue.TypedRateLimitingQueueConfig[Key]{Name: "lvm-agent", MetricsProvider: metrics}),
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.observe(nil, obj) },
		UpdateFunc: a.observe,
		DeleteFunc: a.forget,
	}
	if _, err := inf.PVC.AddEventHandler(handler); err != nil {
		return nil, err
	}
	if _, err := inf.PV.AddEventHandler(handler); err != nil {
		return nil, err
	}
	return a, nil
}

// Run starts the informers and workers and blocks until ctx ends. It then
// stops taking work and returns when the in-flight operations are finished
// (each bounded by OpTimeout) or when grace has passed, whichever is first.
func (a *Agent) Run(ctx context.Context, grace time.Duration) error {
	// Pods on this node wait for their encrypted volumes' mappings (kubelet
	// retries the mount), not for the informers: opened from the start.
	go a.openEncrypted(ctx)
	a.inf.Start(ctx)
	klog.InfoS("Waiting for informers to sync", "node", a.cfg.Node.Name)
	if !cache.WaitForCacheSync(ctx.Done(), a.inf.PVC.HasSynced, a.inf.PV.HasSynced) {
		a.queue.ShutDown()
		return ctx.Err()
	}
	a.metrics.synced.Set(1)
	klog.InfoS("Informers synced; resuming open requests", "requests", a.DSW.Len(), "workers", a.cfg.Workers)
	var wg sync.WaitGroup
	for i := 0; i < a.cfg.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a.processNext() {
			}
		}()
	}
	<-ctx.Done()
	klog.InfoS("Stopping: no new work; waiting for in-flight operations", "grace", grace)
	a.queue.ShutDown()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		// Abandoning is safe: an interrupted create is found by its tag next time.
		klog.InfoS("Grace period over; abandoning in-flight operations")
	}
	return nil
}

// Resume retries every open request now, its backoff forgotten: the
// CapacityWatcher's OnBack hook. Requests that failed while lvmd was away
// would otherwise wait out a backoff grown during the outage (up to
// BackoffMax) after lvmd is back.
func (a *Agent) Resume() {
	keys := a.DSW.Keys()
	if len(keys) > 0 {
		klog.InfoS("lvmd answers; retrying the open requests now", "requests", len(keys))
	}
	for _, k := range keys {
		a.queue.Forget(k)
		a.queue.Add(k)
	}
}

// Synced reports whether the informers have synced.
func (a *Agent) Synced() bool { return a.inf.PVC.HasSynced() && a.inf.PV.HasSynced() }

// request returns the key of obj and whether obj is an open request owned by this node.
func (a *Agent) request(obj any) (Key, bool) {
	_, open := a.cfg.Node.Classify(obj)
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		return Key{Kind: KindPVC, Namespace: o.Namespace, Name: o.Name}, open
	case *corev1.PersistentVolume:
		return Key{Kind: KindPV, Name: o.Name}, open
	}
	return Key{}, false
}

// observe keeps the desired state in step with the informers. It queues a
// request only when the request itself changed, not when the agent's own
// error annotation did: retries come from the rate limiter, not from echoes.
func (a *Agent) observe(old, obj any) {
	k, open := a.request(obj)
	if k.Kind == "" {
		return
	}
	if a.cfg.Node.Misdirected(obj) && (old == nil || requestChanged(old, obj)) {
		a.misdirected(k, obj.(runtime.Object))
	}
	if !open {
		a.DSW.Remove(k)
		a.ASW.Remove(k)
		return
	}
	a.DSW.Add(k, obj.(runtime.Object))
	if old == nil || requestChanged(old, obj) {
		a.queue.Add(k)
	}
}

func (a *Agent) forget(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if k, _ := a.request(obj); k.Kind != "" {
		a.DSW.Remove(k)
		a.ASW.Remove(k)
	}
}

// requestChanged compares what a request consists of.
func requestChanged(old, obj any) bool {
	o, err1 := meta.Accessor(old)
	n, err2 := meta.Accessor(obj)
	if err1 != nil || err2 != nil {
		return true
	}
	if o.GetUID() != n.GetUID() || o.GetLabels()[kube.LabelNode] != n.GetLabels()[kube.LabelNode] {
		return true
	}
	for _, key := range []string{kube.AnnLifecycle, kube.AnnSpec, kube.AnnSelectedNode} {
		if o.GetAnnotations()[key] != n.GetAnnotations()[key] {
			return true
		}
	}
	if opv, ok := old.(*corev1.PersistentVolume); ok {
		o, n := opv.Spec.ClaimRef, obj.(*corev1.PersistentVolume).Spec.ClaimRef
		return (o == nil) != (n == nil) || o != nil && *o != *n
	}
	return false
}

func (a *Agent) processNext() bool {
	k, shutdown := a.queue.Get()
	if shutdown {
		return false
	}
	defer a.queue.Done(k)
	switch a.sync(k) {
	case syncDone:
		a.queue.Forget(k)
	case syncRetry:
		a.metrics.retries.Inc()
		a.queue.AddRateLimited(k)
	case syncWait:
		a.metrics.retries.Inc()
		a.queue.AddAfter(k, min(a.limiter.When(k), a.cfg.WaitPoll))
	case syncBusy:
		a.queue.AddAfter(k, 100*time.Millisecond)
	}
	return true
}

type syncResult int

const (
	syncDone syncResult = iota
	syncRetry
	syncWait // a retry of a named wait (SourceInUse): backoff, but at most WaitPoll
	syncBusy
)

// sync handles one request. Its context is not the agent's: an operation that
// has started runs to its end even during shutdown. It has no deadline of its
// own: each of its lvmd calls is bounded from its turn, each API call by its
// own OpTimeout.
func (a *Agent) sync(k Key) syncResult {
	obj, seen := a.DSW.get(k)
	if obj == nil {
		return syncDone
	}
	m, _ := meta.Accessor(obj)
	if a.ASW.IsAnswered(k, m.GetResourceVersion()) {
		return syncDone // the informer has not shown our answer yet
	}
	r := req{key: k, obj: obj, seen: seen}
	var t target
	var op func(context.Context) outcome
	var err error
	switch opKind(obj) {
	case "create":
		t, op, err = a.createStep(obj.(*corev1.PersistentVolumeClaim))
	case "grow":
		t, op, err = a.growStep(obj.(*corev1.PersistentVolume))
	default:
		t, op, err = a.deleteStep(obj.(*corev1.PersistentVolume))
	}
	if err != nil {
		return a.answer(r, fail(kube.ReasonInvalidSpec, err), time.Now(), nil)
	}
	if !a.acquire(t) {
		return syncBusy
	}
	defer a.release(t)
	start := time.Now()
	ctx, st := withSteps(context.Background(), start.Sub(seen))
	return a.answer(r, op(ctx), start, st)
}

// req is a request being handled: its object as last seen and when it was
// first seen open.
type req struct {
	key  Key
	obj  runtime.Object
	seen time.Time
}

// createStep is a PVC's step: its validated target and the create.
func (a *Agent) createStep(pvc *corev1.PersistentVolumeClaim) (target, func(context.Context) outcome, error) {
	spec, t, err := a.createTarget(pvc)
	return t, func(ctx context.Context) outcome { return a.create(ctx, pvc, spec, t) }, err
}

// deleteStep is a PV's step: its validated target and the removal.
func (a *Agent) deleteStep(pv *corev1.PersistentVolume) (target, func(context.Context) outcome, error) {
	t, err := a.deleteTarget(pv)
	return t, func(ctx context.Context) outcome { return a.remove(ctx, pv, t) }, err
}

func (a *Agent) acquire(t target) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.busy[t] {
		return false
	}
	a.busy[t] = true
	return true
}

func (a *Agent) release(t target) { a.mu.Lock(); delete(a.busy, t); a.mu.Unlock() }

// answer writes the outcome on the object: the final state (one conditional
// merge patch), or for a transient error the error message, then a retry.
func (a *Agent) answer(r req, out outcome, start time.Time, st *steps) syncResult {
	k, obj := r.key, r.obj
	m, _ := meta.Accessor(obj)
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.OpTimeout)
	defer cancel()
	kind := opKind(obj)
	if out.changed {
		klog.V(2).InfoS("Request changed while it was handled; nothing answered, reading it again", "request", k)
		a.reread(ctx, k, obj)
		return syncRetry
	}
	if out.state == "" {
		a.metrics.observe(kind, "retry", start)
		klog.ErrorS(out.err, "Volume operation failed; will retry", "request", k)
		msg := kube.OneLine(out.err)
		reason, res := "VolumeRetrying", syncRetry
		if out.reason != "" {
			// A wait with a name of its own (SourceInUse): looked at
			// again at least every WaitPoll.
			reason, res = out.reason, syncWait
		}
		a.recorder.Event(obj, corev1.EventTypeWarning, reason, msg)
		if c := (kube.Change{kube.AnnError: &msg}); c.Pending(m.GetAnnotations()) {
			// Conditional like every write: if the object moved on (say, our
			// final answer landed but its response was lost), the note is
			// dropped rather than written after a final state.
			if _, err := a.patch(ctx, k, m.GetResourceVersion(), c); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				klog.ErrorS(err, "Could not record the error", "request", k)
			}
		}
		return res
	}
	change := kube.Set(map[string]string{kube.AnnLifecycle: out.state})
	switch {
	case out.state == kube.StateFailed:
		change[kube.AnnReason], change[kube.AnnError] = &out.reason, ptr(kube.OneLine(out.err))
	case out.device != "":
		change[kube.AnnDevice] = &out.device
		change.Remove(kube.AnnError, kube.AnnReason)
	case out.state == kube.StateExpanded:
		change[kube.AnnSize] = ptr(strconv.FormatInt(out.size, 10))
		change.Remove(kube.AnnError, kube.AnnReason)
	default:
		change.Remove(kube.AnnError, kube.AnnReason)
	}
	sent := time.Now()
	_, err := a.patch(ctx, k, m.GetResourceVersion(), change)
	wrote := time.Since(sent)
	if err != nil && out.undo != nil {
		// The answer for an LV just made did not land: the claim may have
		// gone, or begun to be deleted, since it was read before the
		// lvcreate. If so the LV is judged now, as made says.
		if u, gone := out.undo(ctx); gone {
			if u.changed {
				a.reread(ctx, k, obj)
			} else {
				klog.ErrorS(u.err, "Claim changed while its LV was made and could not be judged; will retry", "request", k)
			}
			return syncRetry
		}
	}
	switch {
	case apierrors.IsNotFound(err):
		return syncDone
	case apierrors.IsConflict(err):
		// The object changed since it was read: decide again on the new
		// version, read from the API server. The informer would bring it,
		// but not for an object a sweep handed over, which no informer
		// holds: retried as it was, it would meet a 409 for ever.
		klog.V(2).InfoS("Request changed while it was handled; reading it again", "request", k)
		a.reread(ctx, k, obj)
		return syncRetry
	case err != nil:
		klog.ErrorS(err, "Could not write the answer; will retry", "request", k, "state", out.state)
		return syncRetry
	}
	a.ASW.Answered(k, m.GetResourceVersion())
	a.DSW.answered(k)
	a.metrics.answered(k.Kind, r.seen, sent)
	a.metrics.observe(kind, out.state, start)
	if out.state == kube.StateFailed {
		klog.ErrorS(out.err, "Volume request failed", "request", k, "reason", out.reason)
		a.recorder.Event(obj, corev1.EventTypeWarning, "Volume"+out.reason, kube.OneLine(out.err))
		return syncDone
	}
	kv := []any{"request", k, "state", out.state}
	if out.state == kube.StateExpanded {
		kv = append(kv, "sizeBytes", out.size)
	}
	klog.InfoS("Volume request done", append(append(kv, "duration", time.Since(start), "write", wrote), st.kvs()...)...)
	if a.shared != nil {
		a.shared.Refresh() // between requests, not in the next create's path
	}
	if out.state == kube.StateExpanded {
		a.recorder.Eventf(obj, corev1.EventTypeNormal, "VolumeExpanded", "volume expanded to %d bytes by lvm-agent on node %s", out.size, a.cfg.Node.Name)
	} else {
		a.recorder.Eventf(obj, corev1.EventTypeNormal, "Volume"+titleCase(out.state), "volume %s by lvm-agent on node %s", out.state, a.cfg.Node.Name)
	}
	return syncDone
}

// reread replaces the request held for k, if it is still stale, with the
// object as the API server has it now (trimmed as the informers trim), or
// forgets it when it is gone or no longer an open request of this node.
func (a *Agent) reread(ctx context.Context, k Key, stale runtime.Object) {
	var fresh runtime.Object
	var err error
	if k.Kind == KindPVC {
		fresh, err = a.client.PVCs(k.Namespace).Get(ctx, k.Name, metav1.GetOptions{})
	} else {
		fresh, err = a.client.PVs().Get(ctx, k.Name, metav1.GetOptions{})
	}
	switch {
	case apierrors.IsNotFound(err):
		fresh = nil
	case err != nil:
		klog.ErrorS(err, "Could not read the request again; will retry", "request", k)
		return
	default:
		fresh = kube.Trim(fresh)
		if _, open := a.request(fresh); !open {
			fresh = nil
		}
	}
	if a.DSW.replace(k, stale, fresh) && fresh == nil {
		a.ASW.Remove(k)
	}
}

// patch writes c on k's object, conditional on rv, and returns the version
// the API server stored: rv itself when c changed nothing.
func (a *Agent) patch(ctx context.Context, k Key, rv string, c kube.Change) (stored string, err error) {
	if k.Kind == KindPVC {
		var o *corev1.PersistentVolumeClaim
		if o, err = kube.UpdatePvcWithAnnotations(ctx, a.client, k.Namespace, k.Name, rv, c, nil); err == nil {
			stored = o.ResourceVersion
		}
	} else {
		var o *corev1.PersistentVolume
		if o, err = kube.UpdatePvWithAnnotations(ctx, a.client, k.Name, rv, c, nil); err == nil {
			stored = o.ResourceVersion
		}
	}
	a.metrics.wrote(string(k.Kind), err)
	return stored, err
}

// misdirected warns about a request labelled for this node that another
// node owns (or none): the agent does nothing else with it.
func (a *Agent) misdirected(k Key, obj runtime.Object) {
	a.metrics.misdirected.WithLabelValues(string(k.Kind)).Inc()
	klog.InfoS("Request labelled for this node but owned elsewhere; ignored", "request", k)
	a.recorder.Eventf(obj, corev1.EventTypeWarning, "VolumeRequestNotOwned",
		"labelled %s=%s, but node %s does not own it (PVC: selected-node; PV: node affinity and a served driver or provisioner); lvm-agent on this node ignores it",
		kube.LabelNode, kube.NodeLabelValue(a.cfg.Node.Name), a.cfg.Node.Name)
}

func ptr(s string) *string { return &s }

// opKind names a request's operation, for sync's choice of step and the
// metrics: create (a PVC), grow (a PV "expanding") or delete (any other PV).
func opKind(obj runtime.Object) string {
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		return "create"
	case *corev1.PersistentVolume:
		if o.Annotations[kube.AnnLifecycle] == kube.StateExpanding {
			return "grow"
		}
	}
	return "delete"
}

func titleCase(s string) string {
	if s == "" {
		return s
	}
	return string(s[0]-'a'+'A') + s[1:]
}
