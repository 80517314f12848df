package kube

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
	"github.com/lvm-agent/lvm-agent/kube/kubefake"
)

// watchedClient is a fake clientset that reports on watching each time a
// watch starts, so that a test answers only once the helper listens.
func watchedClient(objs ...runtime.Object) (*fake.Clientset, chan struct{}) {
	c := fake.NewClientset(objs...)
	watching := make(chan struct{}, 10)
	c.PrependWatchReactor("*", func(a clienttesting.Action) (bool, watch.Interface, error) {
		w, err := c.Tracker().Watch(a.GetResource(), a.GetNamespace())
		watching <- struct{}{}
		return true, w, err
	})
	return c, watching
}

// stale is the answer of an earlier request: its reason and error must not
// stand beside a new request.
var stale = map[string]string{AnnLifecycle: StateFailed, AnnReason: ReasonInsufficientCapacity, AnnError: "VG full"}

func TestCreateVolumeClearsReasonAndReturnsDevice(t *testing.T) {
	ann := map[string]string{AnnSelectedNode: "node-a"}
	for k, v := range stale {
		ann[k] = v
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", Annotations: ann, ResourceVersion: "1"}}
	c, watching := watchedClient(pvc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		pvc *corev1.PersistentVolumeClaim
		err error
	}
	done := make(chan result, 1)
	go func() {
		p, err := CreateVolume(ctx, clientset.Wrap(c), "ns", "c", CreateSpec{VolumeGroup: "vg0", Name: "pvc-1", Size: 4096}, nil)
		done <- result{p, err}
	}()
	select {
	case <-watching:
	case r := <-done:
		t.Fatalf("CreateVolume returned before watching: %v", r.err)
	}
	got, err := c.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "c", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, StateCreating, got.Annotations[AnnLifecycle])
	assert.NotContains(t, got.Annotations, AnnReason, "the request clears the stale reason")
	assert.NotContains(t, got.Annotations, AnnError, "the request clears the stale error")
	assert.Equal(t, "node-a", got.Labels[LabelNode])

	got.Annotations[AnnLifecycle], got.Annotations[AnnDevice] = StateCreated, "/dev/vg0/pvc-1"
	_, err = c.CoreV1().PersistentVolumeClaims("ns").Update(ctx, got, metav1.UpdateOptions{})
	require.NoError(t, err)
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, "/dev/vg0/pvc-1", r.pvc.Annotations[AnnDevice])
}

func TestDeleteVolumeClearsReason(t *testing.T) {
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv", Annotations: stale, ResourceVersion: "1"}}
	c, watching := watchedClient(pv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- DeleteVolumeWithAnnotations(ctx, clientset.Wrap(c), "pv", "vg0", "pvc-1", nil) }()
	select {
	case <-watching:
	case err := <-done:
		t.Fatalf("DeleteVolumeWithAnnotations returned before watching: %v", err)
	}
	got, err := c.CoreV1().PersistentVolumes().Get(ctx, "pv", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, StateDeleting, got.Annotations[AnnLifecycle])
	assert.NotContains(t, got.Annotations, AnnReason)
	assert.NotContains(t, got.Annotations, AnnError)
	got.Annotations[AnnLifecycle] = StateDeleted
	_, err = c.CoreV1().PersistentVolumes().Update(ctx, got, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, <-done)
}

// The deleting request labels a PV for its agent's watch: a PV labelled at
// creation keeps the node name it holds (a local PV's affinity names the
// hostname label, which may differ), an unlabelled one gets its affinity's.
func TestDeleteVolumeLabel(t *testing.T) {
	for _, tc := range []struct {
		name, label, affinity, want string
	}{
		{name: "labelled", label: "node-a", affinity: "host-a", want: "node-a"},
		{name: "unlabelled", affinity: "node-b", want: "node-b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv", ResourceVersion: "1"}}
			if tc.label != "" {
				pv.Labels = map[string]string{LabelNode: tc.label}
			}
			pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{tc.affinity}}}}}}}
			c, watching := watchedClient(pv)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- DeleteVolumeWithAnnotations(ctx, clientset.Wrap(c), "pv", "vg0", "pvc-1", nil) }()
			<-watching
			got, err := c.CoreV1().PersistentVolumes().Get(ctx, "pv", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.Labels[LabelNode])
			cancel()
			require.Error(t, <-done)
		})
	}
}

// A PV that already carries the "deleted" answer to the same vg/lv is not
// asked again; a failed answer, or one to another LV, is.
func TestDeleteVolumeAskedOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ann    map[string]string
		reused bool
	}{
		{"deleted, same LV", map[string]string{AnnLifecycle: StateDeleted, AnnSpec: "vg0/pvc-1"}, true},
		{"deleted, another LV", map[string]string{AnnLifecycle: StateDeleted, AnnSpec: "vg0/pvc-2"}, false},
		{"failed", map[string]string{AnnLifecycle: StateFailed, AnnSpec: "vg0/pvc-1", AnnReason: ReasonProtected}, false},
		{"not asked yet", map[string]string{AnnSpec: "vg0/pvc-1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv", Annotations: tc.ann, ResourceVersion: "1"}}
			c, watching := watchedClient(pv)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- DeleteVolumeWithAnnotations(ctx, clientset.Wrap(c), "pv", "vg0", "pvc-1", nil) }()
			if tc.reused {
				require.NoError(t, <-done)
				for _, a := range c.Actions() {
					assert.NotEqual(t, "patch", a.GetVerb(), "nothing written")
				}
				return
			}
			<-watching
			got, err := c.CoreV1().PersistentVolumes().Get(ctx, "pv", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, StateDeleting, got.Annotations[AnnLifecycle], "asked")
			assert.Equal(t, "vg0/pvc-1", got.Annotations[AnnSpec])
			got.Annotations[AnnLifecycle] = StateDeleted
			_, err = c.CoreV1().PersistentVolumes().Update(ctx, got, metav1.UpdateOptions{})
			require.NoError(t, err)
			require.NoError(t, <-done)
		})
	}
}

// A request still open (its caller's deadline passed while the agent had it
// queued) is waited on when asked again, not written again.
func TestCreateVolumeOpenRequestNotAskedAgain(t *testing.T) {
	spec := `{"volumeGroup":"vg0","name":"pvc-1","size":4096}`
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", ResourceVersion: "1",
		Annotations: map[string]string{AnnSelectedNode: "node-a", AnnLifecycle: StateCreating, AnnSpec: spec, AnnError: "lvmd unavailable"},
		Labels:      map[string]string{LabelNode: "node-a"}}}
	c, watching := watchedClient(pvc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := CreateVolume(ctx, clientset.Wrap(c), "ns", "c", CreateSpec{VolumeGroup: "vg0", Name: "pvc-1", Size: 4096}, nil)
		done <- err
	}()
	<-watching
	for _, a := range c.Actions() {
		assert.NotEqual(t, "patch", a.GetVerb(), "the open request is not written again")
	}
	got, err := c.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "c", metav1.GetOptions{})
	require.NoError(t, err)
	got.Annotations[AnnLifecycle], got.Annotations[AnnDevice] = StateCreated, "/dev/vg0/pvc-1"
	delete(got.Annotations, AnnError)
	_, err = c.CoreV1().PersistentVolumeClaims("ns").Update(ctx, got, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, <-done)
}

// preconditioned makes c keep resourceVersions as the API server does
// (kubefake), and records the versions the patches of resource named.
func preconditioned(c *fake.Clientset, resource string) *[]string {
	var rvs []string
	kubefake.Versioned(c, func(rv string) { rvs = append(rvs, rv) }, resource)
	return &rvs
}

// verbs are the requests c had for resource, watches left out.
func verbs(c *fake.Clientset, resource string) []string {
	var out []string
	for _, a := range c.Actions() {
		if a.GetResource().Resource == resource && a.GetVerb() != "watch" {
			out = append(out, a.GetVerb())
		}
	}
	return out
}

// fromWorld serves obj (as the caller read it) from a fake clientset whose
// patches of resource honour their resourceVersion; when changed, obj is
// changed there first (a label, a new resourceVersion).
func fromWorld(t *testing.T, obj runtime.Object, changed bool, resource string) (*fake.Clientset, chan struct{}, context.Context, *[]string) {
	m := obj.(metav1.Object)
	c, watching := watchedClient(obj)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	if changed {
		m.GetLabels()["app"] = "x"
		m.SetResourceVersion("2")
		gvr := corev1.SchemeGroupVersion.WithResource(resource)
		require.NoError(t, c.Tracker().Update(gvr, obj, m.GetNamespace()))
	}
	c.ClearActions()
	return c, watching, ctx, preconditioned(c, resource)
}

// CreateVolumeFrom, DeleteVolumeFrom and ExpandVolumeFrom write the
// request on the object as the caller read it, without reading it first,
// conditional on its resourceVersion; an object changed since is read
// again and asked as CreateVolume, DeleteVolumeWithAnnotations and
// ExpandVolumeWithAnnotations ask, and keeps the change.
func TestVolumeFrom(t *testing.T) {
	for _, changed := range []bool{false, true} {
		want := []string{"patch"}
		if changed {
			want = []string{"patch", "get", "patch"}
		}
		t.Run(fmt.Sprintf("create, changed since: %v", changed), func(t *testing.T) {
			pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", ResourceVersion: "1",
				Annotations: map[string]string{AnnSelectedNode: "node-a"}, Labels: map[string]string{}}}
			read := pvc.DeepCopy()
			c, watching, ctx, rvs := fromWorld(t, pvc, changed, "persistentvolumeclaims")
			done := make(chan error, 1)
			go func() {
				_, err := CreateVolumeFrom(ctx, clientset.Wrap(c), read, CreateSpec{VolumeGroup: "vg0", Name: "pvc-1", Size: 4096}, nil)
				done <- err
			}()
			<-watching
			assert.Equal(t, want, verbs(c, "persistentvolumeclaims"))
			assert.Equal(t, "1", (*rvs)[0], "the first request is conditional on the claim as read")
			got, err := c.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "c", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, StateCreating, got.Annotations[AnnLifecycle])
			assert.Equal(t, map[bool]string{true: "x"}[changed], got.Labels["app"], "the change since is kept")
			got.Annotations[AnnLifecycle], got.Annotations[AnnDevice] = StateCreated, "/dev/vg0/pvc-1"
			_, err = c.CoreV1().PersistentVolumeClaims("ns").Update(ctx, got, metav1.UpdateOptions{})
			require.NoError(t, err)
			require.NoError(t, <-done)
		})
		t.Run(fmt.Sprintf("delete, changed since: %v", changed), func(t *testing.T) {
			pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv", ResourceVersion: "1",
				Annotations: map[string]string{AnnSpec: "vg0/lv"}, Labels: map[string]string{LabelNode: "node-a"}}}
			read := pv.DeepCopy()
			c, watching, ctx, rvs := fromWorld(t, pv, changed, "persistentvolumes")
			done := make(chan error, 1)
			go func() { done <- DeleteVolumeFrom(ctx, clientset.Wrap(c), read, "vg0", "lv", nil) }()
			<-watching
			assert.Equal(t, want, verbs(c, "persistentvolumes"))
			assert.Equal(t, "1", (*rvs)[0], "the first request is conditional on the PV as read")
			got, err := c.CoreV1().PersistentVolumes().Get(ctx, "pv", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, StateDeleting, got.Annotations[AnnLifecycle])
			got.Annotations[AnnLifecycle] = StateDeleted
			_, err = c.CoreV1().PersistentVolumes().Update(ctx, got, metav1.UpdateOptions{})
			require.NoError(t, err)
			require.NoError(t, <-done)
		})
		t.Run(fmt.Sprintf("expand, changed since: %v", changed), func(t *testing.T) {
			pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv", ResourceVersion: "1",
				Annotations: map[string]string{AnnSpec: "vg0/lv", AnnSize: "4096"}, Labels: map[string]string{LabelNode: "node-a"}}}
			read := pv.DeepCopy()
			c, watching, ctx, rvs := fromWorld(t, pv, changed, "persistentvolumes")
			type result struct {
				size int64
				err  error
			}
			done := make(chan result, 1)
			go func() {
				size, err := ExpandVolumeFrom(ctx, clientset.Wrap(c), read, CreateSpec{VolumeGroup: "vg0", Name: "lv", Size: 8192}, nil)
				done <- result{size, err}
			}()
			<-watching
			assert.Equal(t, want, verbs(c, "persistentvolumes"))
			assert.Equal(t, "1", (*rvs)[0], "the first request is conditional on the PV as read")
			got, err := c.CoreV1().PersistentVolumes().Get(ctx, "pv", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, StateExpanding, got.Annotations[AnnLifecycle])
			assert.NotContains(t, got.Annotations, AnnSize, "the earlier answer's size is removed")
			assert.Equal(t, map[bool]string{true: "x"}[changed], got.Labels["app"], "the change since is kept")
			got.Annotations[AnnLifecycle], got.Annotations[AnnSize] = StateExpanded, "8192"
			_, err = c.CoreV1().PersistentVolumes().Update(ctx, got, metav1.UpdateOptions{})
			require.NoError(t, err)
			r := <-done
			require.NoError(t, r.err)
			assert.EqualValues(t, 8192, r.size)
		})
	}
}
