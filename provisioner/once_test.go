package provisioner

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/lvm-agent/lvm-agent/kube"
)

// countingProvisioner tells each return of Provision and of ShouldProvision.
type countingProvisioner struct {
	*Provisioner
	returned chan error
	should   chan bool
}

func (c countingProvisioner) ShouldProvision(ctx context.Context, pvc *corev1.PersistentVolumeClaim) bool {
	ok := c.Provisioner.ShouldProvision(ctx, pvc)
	c.should <- ok
	return ok
}

func (c countingProvisioner) Provision(ctx context.Context, opts controller.ProvisionOptions) (*corev1.PersistentVolume, controller.ProvisioningState, error) {
	pv, state, err := c.Provisioner.Provision(ctx, opts)
	c.returned <- err
	return pv, state, err
}

// creatingWrites counts the patches of a claim that ask for a volume.
func creatingWrites(client *fake.Clientset) *atomic.Int32 {
	var n atomic.Int32
	client.PrependReactor("patch", "persistentvolumeclaims", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if strings.Contains(string(a.(clienttesting.PatchAction).GetPatch()), `"`+kube.StateCreating+`"`) {
			n.Add(1)
		}
		return false, nil, nil
	})
	return &n
}

// The library's claim worker takes up again a claim that our own writes
// (the request, the agent's answer) updated while it was provisioned, when
// its PV informer does not show the PV just saved yet
// (provisionClaimOperation looks for the PV only there). Here that informer
// never shows it, the widest form of that race: ShouldProvision says no, so
// Provision is not called again (no second Provisioning event, PV create,
// ProvisioningSucceeded event); the claim is asked once, its PV created once.
func TestLibraryProvisionsOnceThoughCalledAgain(t *testing.T) {
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	sc := class(wffc, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg0", "wipe": "none"}) // the Node has no capacity annotation
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{HostnameLabel: "host-a"}}}
	fsMode := corev1.PersistentVolumeFilesystem
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data", UID: "uid-1", ResourceVersion: "1",
		Annotations: map[string]string{kube.AnnSelectedNode: "node-a", "volume.kubernetes.io/storage-provisioner": kube.DefaultProvisioner}},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &sc.Name, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: &fsMode,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	client := fake.NewClientset(node, sc, pvc)
	asked := creatingWrites(client)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	claims := client.CoreV1().PersistentVolumeClaims("ns")
	client.PrependWatchReactor("*", func(a clienttesting.Action) (bool, watch.Interface, error) {
		if a.GetResource().Resource == "persistentvolumes" {
			return true, watch.NewFake(), nil // the library's PV informer: never up to date
		}
		w, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace())
		if a.GetResource().Resource == "persistentvolumeclaims" && a.GetNamespace() == "ns" {
			// The agent answers a request once Provision watches for it
			// (the fake's watch replays nothing).
			go func() {
				c, err := claims.Get(ctx, "data", metav1.GetOptions{})
				if assert.NoError(t, err) && assert.Equal(t, kube.StateCreating, c.Annotations[kube.AnnLifecycle]) {
					c.Annotations[kube.AnnLifecycle], c.Annotations[kube.AnnDevice] = kube.StateCreated, "/dev/vg0/pvc-uid-1"
					_, err = claims.Update(ctx, c, metav1.UpdateOptions{})
					assert.NoError(t, err)
				}
			}()
		}
		return true, w, err
	})

	var pvCreates atomic.Int32
	client.PrependReactor("create", "persistentvolumes", func(clienttesting.Action) (bool, runtime.Object, error) {
		pvCreates.Add(1)
		return false, nil, nil
	})
	p := countingProvisioner{New(client, Config{Timeout: 10 * time.Second}), make(chan error, 100), make(chan bool, 100)}
	pc := controller.NewProvisionController(ctx, client, kube.DefaultProvisioner, p,
		controller.LeaderElection(false), controller.MetricsPort(0), controller.AddFinalizer(true),
		controller.CreateProvisionedPVLimiter(workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, time.Second)))
	go pc.Run(ctx)
	next := func(what string) {
		t.Helper()
		select {
		case ok := <-p.should:
			require.Equal(t, what == "first", ok, "ShouldProvision, %s", what)
		case <-ctx.Done():
			t.Fatalf("no ShouldProvision call (%s)", what)
		}
	}
	next("first")
	select {
	case err := <-p.returned:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("Provision did not return")
	}
	// The claim was updated during the call (the request, the answer): the
	// library takes it up again, and is told no.
	next("again")
	select {
	case err := <-p.returned:
		t.Fatalf("Provision called again (returned %v)", err)
	default:
	}
	assert.Equal(t, int32(1), asked.Load(), "creating writes")
	assert.Equal(t, int32(1), pvCreates.Load(), "PV creates")
	pv, err := client.CoreV1().PersistentVolumes().Get(ctx, "pvc-uid-1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "/dev/vg0/pvc-uid-1", pv.Spec.Local.Path)
}

// Provision reuses only an answer that a new request would get again: the
// agent's "created", with its device, to the identical spec, asked of the
// claim's selected node. The same request still open is waited on, not
// written again. Anything else is asked again (and answered here).
func TestProvisionReusesOnlyTheSameAnswer(t *testing.T) {
	sc := class(storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg0"})
	same := `{"volumeGroup":"vg0","name":"pvc-uid-1","size":1073741824}`
	for _, c := range []struct {
		name   string
		ann    map[string]string
		label  string
		reused bool
		waited bool
	}{
		{"created, same spec, same node", map[string]string{kube.AnnLifecycle: kube.StateCreated, kube.AnnSpec: same, kube.AnnDevice: "/dev/vg0/old"}, "node-a", true, false},
		{"another spec", map[string]string{kube.AnnLifecycle: kube.StateCreated, kube.AnnSpec: strings.Replace(same, "1073741824", "536870912", 1),
			kube.AnnDevice: "/dev/vg0/old"}, "node-a", false, false},
		{"failed", map[string]string{kube.AnnLifecycle: kube.StateFailed, kube.AnnSpec: same, kube.AnnReason: kube.ReasonNameConflict,
			kube.AnnDevice: "/dev/vg0/old"}, "node-a", false, false},
		{"another node", map[string]string{kube.AnnLifecycle: kube.StateCreated, kube.AnnSpec: same, kube.AnnDevice: "/dev/vg0/old"}, "node-b", false, false},
		{"no device", map[string]string{kube.AnnLifecycle: kube.StateCreated, kube.AnnSpec: same}, "node-a", false, false},
		{"creating, same spec, same node", map[string]string{kube.AnnLifecycle: kube.StateCreating, kube.AnnSpec: same}, "node-a", false, true},
		{"creating, another spec", map[string]string{kube.AnnLifecycle: kube.StateCreating, kube.AnnSpec: strings.Replace(same, "1073741824", "536870912", 1)}, "node-a", false, false},
		{"creating, another node", map[string]string{kube.AnnLifecycle: kube.StateCreating, kube.AnnSpec: same}, "node-b", false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, corev1.PersistentVolumeFilesystem, created)
			asked := creatingWrites(w.client)
			for k, v := range c.ann {
				w.pvc.Annotations[k] = v
			}
			w.pvc.Labels = map[string]string{kube.LabelNode: c.label}
			_, err := w.client.CoreV1().PersistentVolumeClaims("ns").Update(context.Background(), w.pvc, metav1.UpdateOptions{})
			require.NoError(t, err)
			pv, state, err := provision(t, w, sc)
			require.NoError(t, err)
			assert.Equal(t, controller.ProvisioningFinished, state)
			if c.reused {
				assert.Equal(t, int32(0), asked.Load(), "creating writes")
				assert.Equal(t, "/dev/vg0/old", pv.Spec.Local.Path)
				return
			}
			if c.waited {
				assert.Equal(t, int32(0), asked.Load(), "creating writes")
			} else {
				assert.Equal(t, int32(1), asked.Load(), "creating writes")
			}
			assert.Equal(t, created[kube.AnnDevice], pv.Spec.Local.Path)
			ann, _ := requested(t, w)
			assert.Equal(t, same, ann[kube.AnnSpec])
		})
	}
}
