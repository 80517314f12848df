package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
)

// The three watch modes against a real API server: what each one receives,
// which requests it answers, and that each answer is one write.
func TestWatchModes(t *testing.T) {
	ctx := context.Background()
	// Objects of other nodes, labelled (our provisioner) and not (another one).
	for i := 0; i < 10; i++ {
		for _, labelled := range []bool{true, false} {
			name := fmt.Sprintf("wm-foreign-%d-%v", i, labelled)
			rawRequest(t, cp.Client, "default", name, "node-elsewhere", `{"volumeGroup":"vg1","name":"x","size":4096}`, labelled)
		}
	}
	for _, c := range []struct {
		mode              kube.WatchMode
		answersUnlabelled bool
		filtered          bool // by the API server: no foreign object reaches the agent's watch
		// hybrid: a Lease held by a labeller that labels nothing, so that
		// only the sweep finds the unlabelled requests (late)
		lease bool
	}{
		{kube.WatchHybrid, true, true, false},
		{kube.WatchHybrid, true, true, true},
		{kube.WatchLabelled, false, true, false},
		{kube.WatchAll, true, false, false},
	} {
		name := string(c.mode)
		if c.lease {
			name += "-lease"
		}
		t.Run(name, func(t *testing.T) {
			addr := harness.FreeAddr(t)
			ns := "default"
			prefix := "wm-" + name
			if c.lease {
				heldLease(t, ns, prefix)
			}
			// No spread of the first sweep: the test waits for it (kube's unit tests cover the spread).
			n := startNode(t, "--watch-mode", string(c.mode), "--sweep-interval", "300ms", "--relist-spread", "0", "--metrics-address", addr,
				"--labeller-lease", ns+"/"+prefix)
			waitHTTP(t, addr, "/readyz", 200)
			if c.mode == kube.WatchHybrid {
				want := 1.0
				if c.lease {
					want = 0
				}
				waitMetricFunc(t, addr, "lvm_agent_unlabelled_watch", func(v float64) bool { return v == want })
			}

			// Our provisioner: labelled, answered at once in every mode.
			require.NoError(t, n.create(t, ns, prefix+"-labelled", spec(prefix+"-lv1", "4Mi")))

			// The original provisioner: no label.
			rawRequest(t, cp.Client, ns, prefix+"-unlabelled", n.name, `{"volumeGroup":"vg1","name":"`+prefix+`-lv2","size":4194304}`, false)
			pv := harness.PV(t, cp.Client, prefix+"-pv", n.name, kube.DefaultDriver, nil)
			_, err := kube.UpdatePvWithAnnotations(ctx, clientset.Wrap(cp.Client), pv.Name, "",
				kube.Set(map[string]string{kube.AnnLifecycle: kube.StateDeleting, kube.AnnSpec: "vg1/absent"}), nil)
			require.NoError(t, err)
			getPVC := func(ctx context.Context) (metav1.Object, error) {
				return cp.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, prefix+"-unlabelled", metav1.GetOptions{})
			}
			getPV := func(ctx context.Context) (metav1.Object, error) {
				return cp.Client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
			}
			if c.answersUnlabelled {
				harness.WaitFor(t, 10*time.Second, getPVC, func(a map[string]string) bool { return a[kube.AnnLifecycle] == kube.StateCreated })
				harness.WaitFor(t, 10*time.Second, getPV, func(a map[string]string) bool { return a[kube.AnnLifecycle] == kube.StateDeleted })
			} else {
				time.Sleep(2 * time.Second) // several sweep intervals, had there been sweeps
				o, err := getPVC(ctx)
				require.NoError(t, err)
				assert.Equal(t, kube.StateCreating, o.GetAnnotations()[kube.AnnLifecycle], "labelled mode sees only labelled requests")
			}

			pvcPatch := `lvm_agent_kube_requests_total{code="200",resource="persistentvolumeclaims",verb="patch"}`
			pvPatch := `lvm_agent_kube_requests_total{code="200",resource="persistentvolumes",verb="patch"}`
			answered := 1.0
			if c.answersUnlabelled {
				answered = 2
			}
			// The agent counts a write once its client has the response,
			// which can be after this test saw the write: wait for the
			// counts, then check that there is no more than one per transition.
			waitMetricFunc(t, addr, pvcPatch, func(v float64) bool { return v >= answered })
			if c.answersUnlabelled {
				waitMetricFunc(t, addr, pvPatch, func(v float64) bool { return v >= 1 })
			}
			m := scrape(t, addr)
			if c.answersUnlabelled {
				assert.Equal(t, 1.0, m[pvPatch], "one write per transition")
			}
			assert.Equal(t, answered, m[pvcPatch], "one write per transition")
			assert.Zero(t, m[`lvm_agent_kube_requests_total{code="409",resource="persistentvolumeclaims",verb="patch"}`])
			assert.Greater(t, m[`lvm_agent_kube_received_bytes_total{resource="persistentvolumeclaims",verb="watch"}`], 0.0)
			assert.Greater(t, m[`lvm_agent_kube_watch_events_total{resource="persistentvolumeclaims"}`], 0.0)
			foreign := m[`lvm_agent_kube_objects_received_total{foreign="true",resource="persistentvolumeclaims",source="informer"}`] +
				m[`lvm_agent_kube_objects_received_total{foreign="true",resource="persistentvolumes",source="informer"}`]
			if c.filtered {
				assert.Zero(t, foreign, "no other node's object reaches the watch")
				assert.Greater(t, m[`lvm_agent_kube_objects_received_total{foreign="false",resource="persistentvolumeclaims",source="informer"}`], 0.0)
			} else {
				assert.GreaterOrEqual(t, foreign, 20.0, "every PVC of the other node")
			}
			switch {
			case c.mode == kube.WatchHybrid && c.lease:
				// Found late, by a sweep: said once in the log with the
				// hint, counted, and an event on the object.
				assert.Greater(t, m[`lvm_agent_sweeps_total{result="ok"}`], 0.0)
				assert.Equal(t, 1.0, m[`lvm_agent_unlabelled_requests_total{resource="persistentvolumeclaims"}`])
				assert.Equal(t, 1.0, m[`lvm_agent_unlabelled_requests_total{resource="persistentvolumes"}`])
				assert.GreaterOrEqual(t, m[`lvm_agent_kube_objects_received_total{foreign="true",resource="persistentvolumeclaims",source="unlabelled"}`], 10.0,
					"the unlabelled PVCs of every node are listed")
				assert.Equal(t, 1, strings.Count(n.agent.Output(), "Found a request late"), "said once")
				assert.Contains(t, n.agent.Output(), "--label-requests")
				require.Eventually(t, func() bool {
					evs, err := cp.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
						"involvedObject.name": prefix + "-unlabelled", "reason": "UnlabelledRequest"}.String()})
					return err == nil && len(evs.Items) == 1
				}, 10*time.Second, 50*time.Millisecond)
			case c.mode == kube.WatchHybrid:
				// No labeller: the agent watches the unlabelled objects, and
				// nothing is late.
				assert.Zero(t, m[`lvm_agent_sweeps_total{result="ok"}`])
				assert.Greater(t, m[`lvm_agent_sweeps_total{result="skipped"}`], 0.0)
				assert.Zero(t, m[`lvm_agent_unlabelled_requests_total{resource="persistentvolumeclaims"}`])
				assert.GreaterOrEqual(t, m[`lvm_agent_kube_objects_received_total{foreign="true",resource="persistentvolumeclaims",source="unlabelled"}`], 10.0,
					"the unlabelled PVCs of every node are watched")
				assert.NotContains(t, n.agent.Output(), "Found a request late")
			default:
				assert.NotContains(t, m, `lvm_agent_sweeps_total{result="ok"}`)
			}
		})
	}
}

// heldLease makes a Lease that a labeller holds and renews (an hour long):
// the agents then rely on the labeller for unlabelled requests.
func heldLease(t *testing.T, ns, name string) {
	t.Helper()
	now := metav1.NewMicroTime(time.Now())
	_, err := cp.Client.CoordinationV1().Leases(ns).Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("a-labeller-that-labels-nothing"), LeaseDurationSeconds: ptr.To(int32(3600)), RenewTime: &now},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cp.Client.CoordinationV1().Leases(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}
