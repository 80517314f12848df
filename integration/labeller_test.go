package integration

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
	"github.com/lvm-agent/lvm-agent/provisioner"
)

// The provisioner's labeller and a hybrid agent against a real API server:
// requests written without the node label are labelled and answered through
// the agent's labelled watch, not its sweep (which lists at start only
// here); foreign objects are never written.
func TestLabellerHybrid(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := "default"
	// Unlabelled, and no request: another driver's claim, an answered one.
	harness.PVC(t, cp.Client, ns, "lb-foreign", "node-elsewhere")
	rawRequest(t, cp.Client, ns, "lb-answered", "node-elsewhere", `{"volumeGroup":"vg1","name":"x","size":4096}`, false)
	_, err := kube.UpdatePvcWithAnnotations(ctx, clientset.Wrap(cp.Client), ns, "lb-answered", "", kube.Set(map[string]string{kube.AnnLifecycle: kube.StateCreated}), nil)
	require.NoError(t, err)
	versions := map[string]string{}
	for _, name := range []string{"lb-foreign", "lb-answered"} {
		pvc, err := cp.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		versions[name] = pvc.ResourceVersion
	}

	reg := prometheus.NewRegistry()
	done := make(chan struct{})
	lease := kube.LeaseRef{Namespace: ns, Name: "lb-labeller"}
	go func() {
		kube.NewLabeller(clientset.Wrap(cp.Client), reg).WithLease(provisioner.LabellerLease(cp.Client, lease, "lb")).Run(ctx, 2)
		close(done)
	}()
	defer func() { cancel(); <-done }()
	// The agent starts once the labeller holds its Lease: an agent started
	// before watches the unlabelled objects itself, and its first sweep is
	// skipped (TestWatchModes covers that).
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := cp.Client.CoordinationV1().Leases(ns).Get(ctx, lease.Name, metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "", nil
	}), "the labeller's Lease held")

	addr := harness.FreeAddr(t)
	n := startNode(t, "--watch-mode", "hybrid", "--sweep-interval", "1h", "--relist-spread", "0", "--metrics-address", addr,
		"--labeller-lease", lease.String())
	waitHTTP(t, addr, "/readyz", 200)
	// The labeller holds its Lease: the agent does not watch the unlabelled
	// objects, and sweeps.
	waitMetricFunc(t, addr, "lvm_agent_unlabelled_watch", func(v float64) bool { return v == 0 })
	waitMetricFunc(t, addr, `lvm_agent_sweeps_total{result="ok"}`, func(v float64) bool { return v >= 1 })
	l, err := cp.Client.CoordinationV1().Leases(ns).Get(ctx, lease.Name, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, int32(kube.LabellerLeaseDuration/time.Second), *l.Spec.LeaseDurationSeconds)

	// Written after the agent's only sweep: only the label brings them.
	rawRequest(t, cp.Client, ns, "lb-unlabelled", n.name, `{"volumeGroup":"vg1","name":"lb-lv","size":4194304}`, false)
	pv := harness.PV(t, cp.Client, "lb-pv", n.name, kube.DefaultDriver, nil)
	_, err = kube.UpdatePvWithAnnotations(ctx, clientset.Wrap(cp.Client), pv.Name, "",
		kube.Set(map[string]string{kube.AnnLifecycle: kube.StateDeleting, kube.AnnSpec: "vg1/absent"}), nil)
	require.NoError(t, err)
	harness.WaitFor(t, 30*time.Second, func(ctx context.Context) (metav1.Object, error) {
		return cp.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "lb-unlabelled", metav1.GetOptions{})
	}, func(a map[string]string) bool { return a[kube.AnnLifecycle] == kube.StateCreated })
	harness.WaitFor(t, 30*time.Second, func(ctx context.Context) (metav1.Object, error) {
		return cp.Client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
	}, func(a map[string]string) bool { return a[kube.AnnLifecycle] == kube.StateDeleted })

	pvc, err := cp.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "lb-unlabelled", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, kube.NodeLabelValue(n.name), pvc.Labels[kube.LabelNode])
	got, err := cp.Client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, kube.NodeLabelValue(n.name), got.Labels[kube.LabelNode])
	// A write is counted when its answer arrives, which can be after the
	// test saw it: wait for the count, then check it.
	m := waitMetricFunc(t, addr, `lvm_agent_kube_requests_total{code="200",resource="persistentvolumeclaims",verb="patch"}`, func(v float64) bool { return v >= 1 })
	assert.Zero(t, m[`lvm_agent_unlabelled_requests_total{resource="persistentvolumeclaims"}`], "not found by a sweep")
	assert.Zero(t, m[`lvm_agent_unlabelled_requests_total{resource="persistentvolumes"}`])
	assert.Equal(t, 1.0, m[`lvm_agent_kube_requests_total{code="200",resource="persistentvolumeclaims",verb="patch"}`], "one answer")
	for name, rv := range versions {
		pvc, err := cp.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, rv, pvc.ResourceVersion, "%s: never written", name)
		assert.NotContains(t, pvc.Labels, kube.LabelNode)
	}

	// A labeller that stops deletes its Lease, and the agent takes over.
	cancel()
	<-done
	_, err = cp.Client.CoordinationV1().Leases(ns).Get(context.Background(), lease.Name, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "the Lease is deleted: %v", err)
	waitMetricFunc(t, addr, "lvm_agent_unlabelled_watch", func(v float64) bool { return v == 1 })
}
