package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
	"github.com/lvm-agent/lvm-agent/provisioner"
)

// originalWait is how long a provisioner of the original design waits for
// an answer before it gives up and asks again.
const originalWait = 16 * time.Second

// originalProvisioner drives the agent as Alibaba's CSI controller does: a
// Get and an Update of the whole object with the two annotations, no
// volume.node label, then a poll of the object for the answer.
type originalProvisioner struct{ t *testing.T }

// update is the original's UpdatePvcWithAnnotations / UpdatePvWithAnnotations:
// Get, set the annotations, Update; a conflict is tried again.
func (p originalProvisioner) update(get func(context.Context) (runtime.Object, error), update func(context.Context, runtime.Object) error, ann map[string]string) {
	p.t.Helper()
	ctx := context.Background()
	for try := 0; ; try++ {
		obj, err := get(ctx)
		require.NoError(p.t, err)
		m, err := meta.Accessor(obj)
		require.NoError(p.t, err)
		a := m.GetAnnotations()
		if a == nil {
			a = map[string]string{}
		}
		for k, v := range ann {
			a[k] = v
		}
		m.SetAnnotations(a)
		if err = update(ctx, obj); err == nil || !apierrors.IsConflict(err) || try == 5 {
			require.NoError(p.t, err)
			return
		}
	}
}

// create asks for an LV on an existing PVC and returns the answer's state
// and the time it took; "" if none came within originalWait.
func (p originalProvisioner) create(ns, pvc, spec string) (string, time.Duration) {
	p.t.Helper()
	c := cp.Client.CoreV1().PersistentVolumeClaims(ns)
	return p.ask(func(ctx context.Context) (runtime.Object, error) { return c.Get(ctx, pvc, metav1.GetOptions{}) },
		func(ctx context.Context, o runtime.Object) error {
			_, err := c.Update(ctx, o.(*corev1.PersistentVolumeClaim), metav1.UpdateOptions{})
			return err
		}, kube.StateCreating, spec)
}

// delete asks for the removal of vg/lv on an existing PV.
func (p originalProvisioner) delete(pv, vgLV string) (string, time.Duration) {
	p.t.Helper()
	c := cp.Client.CoreV1().PersistentVolumes()
	return p.ask(func(ctx context.Context) (runtime.Object, error) { return c.Get(ctx, pv, metav1.GetOptions{}) },
		func(ctx context.Context, o runtime.Object) error {
			_, err := c.Update(ctx, o.(*corev1.PersistentVolume), metav1.UpdateOptions{})
			return err
		}, kube.StateDeleting, vgLV)
}

// ask writes the request (state and spec) and waits for its answer.
func (p originalProvisioner) ask(get func(context.Context) (runtime.Object, error), update func(context.Context, runtime.Object) error,
	state, spec string) (string, time.Duration) {
	p.t.Helper()
	start := time.Now()
	p.update(get, update, map[string]string{kube.AnnLifecycle: state, kube.AnnSpec: spec})
	return p.wait(start, func(ctx context.Context) (metav1.Object, error) {
		o, err := get(ctx)
		if err != nil {
			return nil, err
		}
		return meta.Accessor(o)
	}, state)
}

// wait polls as the original does (it has no watch), every 100 ms here so
// that the time measured is the agent's.
func (p originalProvisioner) wait(start time.Time, get func(context.Context) (metav1.Object, error), open string) (string, time.Duration) {
	p.t.Helper()
	for time.Since(start) < originalWait {
		o, err := get(context.Background())
		require.NoError(p.t, err)
		if s := o.GetAnnotations()[kube.AnnLifecycle]; s != open {
			return s, time.Since(start)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return "", originalWait
}

// originalRun is one round of everything the original provisioner asks,
// each answered before it would give up: create, the same create asked
// again, a create that fails, the delete of the created LV, the delete of
// an LV that does not exist. It returns the answer times.
func originalRun(t *testing.T, n *node, prefix string) []time.Duration {
	t.Helper()
	p := originalProvisioner{t}
	ns := "default"
	var times []time.Duration
	answer := func(what, want, got string, d time.Duration) {
		t.Helper()
		require.Equal(t, want, got, "%s %s: answered %q after %v (\"\": none within the original's %v)", prefix, what, got, d, originalWait)
		times = append(times, d)
	}
	claim := harness.PVC(t, cp.Client, ns, prefix+"-pvc", n.name)
	lv := prefix + "-lv"
	spec := fmt.Sprintf(`{"volumeGroup":"vg1","name":%q,"size":4194304}`, lv)
	state, d := p.create(ns, claim.Name, spec)
	answer("create", kube.StateCreated, state, d)
	state, d = p.create(ns, claim.Name, spec)
	answer("create again", kube.StateCreated, state, d)
	require.Len(t, lvsNamed(t, n, lv), 1, "one LV for both requests")

	harness.PVC(t, cp.Client, ns, prefix+"-big", n.name)
	state, d = p.create(ns, prefix+"-big", fmt.Sprintf(`{"volumeGroup":"vg1","name":%q,"size":%d}`, prefix+"-big", int64(1)<<40))
	answer("create too big", kube.StateFailed, state, d)
	assert.Equal(t, kube.ReasonInsufficientCapacity, pvcAnnotations(t, ns, prefix+"-big")[kube.AnnReason])

	pv := harness.PV(t, cp.Client, prefix+"-pv", n.name, kube.DefaultDriver, claim)
	harness.DeleteClaim(t, cp.Client, claim)
	state, d = p.delete(pv.Name, "vg1/"+lv)
	answer("delete", kube.StateDeleted, state, d)
	require.Empty(t, lvsNamed(t, n, lv), "the LV is removed")

	absent := harness.PV(t, cp.Client, prefix+"-pv-absent", n.name, kube.DefaultDriver, nil)
	state, d = p.delete(absent.Name, "vg1/"+prefix+"-absent")
	answer("delete of an absent LV", kube.StateDeleted, state, d)
	t.Logf("%s: answer times create, create again, failure, delete, delete absent: %v", prefix, times)
	return times
}

func lvsNamed(t *testing.T, n *node, name string) []string {
	t.Helper()
	var out []string
	for _, lv := range n.lvs(t, "vg1") {
		if lv.Name == name {
			out = append(out, lv.Name)
		}
	}
	return out
}

// labeller runs the provisioner's labeller with its Lease, as lvm-agent
// provisioner does, until the returned stop is called (stop waits for it).
func labeller(t *testing.T, lease kube.LeaseRef) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		kube.NewLabeller(clientset.Wrap(cp.Client), prometheus.NewRegistry()).WithLease(provisioner.LabellerLease(cp.Client, lease, "test-"+sanitize(t.Name()))).Run(ctx, 2)
		close(done)
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// Issue 24: an unmodified provisioner of the original design (Get + Update,
// no label) against an agent with its default flags, with and without the
// provisioner's labeller, and the labeller stopped and started in the middle
// of a run of requests. Every request is answered before the original would
// give up; none waits for a sweep (30 min by default).
func TestOriginalProvisioner(t *testing.T) {
	ctx := context.Background()
	addr := harness.FreeAddr(t)
	// Only what every test agent has (node, API server, lvmd, metrics);
	// the watch mode, the sweep and the Lease are the defaults.
	n := startNode(t, "--metrics-address", addr)
	waitHTTP(t, addr, "/readyz", 200)
	watching := func(v float64) {
		t.Helper()
		waitMetricFunc(t, addr, "lvm_agent_unlabelled_watch", func(got float64) bool { return got == v })
	}
	// The default Lease: deploy/'s namespace.
	lease, err := kube.ParseLeaseRef("lvm-agent/" + kube.LabellerLeaseName)
	require.NoError(t, err)
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lease.Namespace}}, metav1.CreateOptions{}); err != nil {
		require.True(t, apierrors.IsAlreadyExists(err), "%v", err)
	}

	t.Run("no labeller", func(t *testing.T) {
		watching(1)
		originalRun(t, n, "orig-alone")
	})

	t.Run("labeller", func(t *testing.T) {
		stop := labeller(t, lease)
		defer stop()
		watching(0)
		originalRun(t, n, "orig-labelled")
		pv, err := cp.Client.CoreV1().PersistentVolumes().Get(ctx, "orig-labelled-pv-absent", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, kube.NodeLabelValue(n.name), pv.Labels[kube.LabelNode], "delivered labelled, by the labeller")
	})

	t.Run("labeller stopped and started during a run", func(t *testing.T) {
		stop := labeller(t, lease)
		watching(0)
		p := originalProvisioner{t}
		const requests = 12
		var wg sync.WaitGroup
		results := make([]string, requests)
		times := make([]time.Duration, requests)
		for i := range requests {
			switch i {
			case 4:
				stop() // deletes its Lease: the agent watches at once
			case 8:
				stop = labeller(t, lease)
			}
			name := fmt.Sprintf("orig-flip-%d", i)
			harness.PVC(t, cp.Client, "default", name, n.name)
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i], times[i] = p.create("default", name, fmt.Sprintf(`{"volumeGroup":"vg1","name":%q,"size":4194304}`, name))
			}()
			time.Sleep(300 * time.Millisecond)
		}
		wg.Wait()
		stop()
		for i := range requests {
			assert.Equal(t, kube.StateCreated, results[i], "request %d: answered %q after %v", i, results[i], times[i])
		}
		t.Logf("answer times, labeller stopped before request 4 and started before request 8: %v", times)
	})

	m := scrape(t, addr)
	assert.Zero(t, m[`lvm_agent_unlabelled_requests_total{resource="persistentvolumeclaims"}`], "no request was found late, by a sweep")
	assert.Zero(t, m[`lvm_agent_unlabelled_requests_total{resource="persistentvolumes"}`])
}
