package provisioner

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
)

func nudgePod(name, claim string, mod func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: corev1.PodSpec{NodeName: "n1", Volumes: []corev1.Volume{{Name: "data",
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}}}
	if mod != nil {
		mod(p)
	}
	return p
}

// patchedPods lists the Pods the client patched, in order.
func patchedPods(c *fake.Clientset) []string {
	var out []string
	for _, a := range c.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && a.GetResource().Resource == "pods" {
			out = append(out, p.GetName())
		}
	}
	return out
}

// ourPV is a local PV that provisioner "p" made.
func ourPV() *corev1.PersistentVolume {
	return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv1", Annotations: map[string]string{kube.AnnProvisionedBy: "p"}},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/dev/vg/lv"}}}}
}

// startNudger runs a Nudger of provisioner "p" over the fake client.
func startNudger(t *testing.T, c *fake.Clientset) (context.Context, *Nudger) {
	factory := informers.NewSharedInformerFactory(c, 0)
	n, err := NewNudger(c, "p", factory, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	return ctx, n
}

func TestNudgeAfterNodeResizePending(t *testing.T) {
	pv := ourPV()
	foreign := pv.DeepCopy()
	foreign.Name, foreign.Annotations = "pv2", map[string]string{kube.AnnProvisionedBy: "other"}
	claim := func(name, pv string, pending bool) *corev1.PersistentVolumeClaim {
		c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: corev1.PersistentVolumeClaimSpec{VolumeName: pv}}
		c.Status.AllocatedResources = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}
		if pending {
			c.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{
				corev1.ResourceStorage: corev1.PersistentVolumeClaimNodeResizePending}
		}
		return c
	}
	objs := []runtime.Object{pv, foreign,
		claim("grown", "pv1", true), claim("waiting", "pv1", false), claim("theirs", "pv2", true),
		nudgePod("a", "grown", nil),
		nudgePod("b", "grown", nil),
		nudgePod("done", "grown", func(p *corev1.Pod) { p.Annotations = map[string]string{kube.AnnResizeNudge: "grown=2Gi"} }),
		nudgePod("leaving", "grown", func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: time.Now()} }),
		nudgePod("unscheduled", "grown", func(p *corev1.Pod) { p.Spec.NodeName = "" }),
		nudgePod("finished", "grown", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
		nudgePod("other-claim", "waiting", nil),
		nudgePod("foreign-pv", "theirs", nil),
	}
	c := fake.NewClientset(objs...)
	ctx, n := startNudger(t, c)

	for _, key := range []string{"ns/grown", "ns/waiting", "ns/theirs", "ns/gone"} {
		require.NoError(t, n.sync(ctx, key))
	}
	assert.ElementsMatch(t, []string{"a", "b"}, patchedPods(c), "only the running Pods of the claim waiting for kubelet")
	for _, name := range []string{"a", "b"} {
		p, err := c.CoreV1().Pods("ns").Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "grown=2Gi", p.Annotations[kube.AnnResizeNudge])
	}

	// Once per Pod and size: the same resize again writes nothing.
	c.ClearActions()
	require.NoError(t, n.sync(ctx, "ns/grown"))
	assert.Empty(t, patchedPods(c))
}

func TestNudgeIsConditional(t *testing.T) {
	pod := nudgePod("a", "grown", func(p *corev1.Pod) { p.ResourceVersion = "7" })
	c := fake.NewClientset(pod)
	var body string
	c.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		body = string(a.(k8stesting.PatchAction).GetPatch())
		return false, nil, nil
	})
	_ = kube.NudgePod(context.Background(), clientset.Wrap(c), pod, "grown=2Gi")
	assert.JSONEq(t, `{"metadata":{"resourceVersion":"7","annotations":{"`+kube.AnnResizeNudge+`":"grown=2Gi"}}}`, body)
}

// The nudger's own loop: a claim that turns NodeResizePending is seen by
// its informer and its running Pod nudged.
func TestNudgerRuns(t *testing.T) {
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "grown"}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv1"}}
	c := fake.NewClientset(ourPV(), pvc, nudgePod("a", "grown", nil))
	ctx, n := startNudger(t, c)
	go n.Run(ctx)

	pvc.Status.AllocatedResources = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}
	pvc.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{corev1.ResourceStorage: corev1.PersistentVolumeClaimNodeResizePending}
	_, err := c.CoreV1().PersistentVolumeClaims("ns").UpdateStatus(ctx, pvc, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		p, err := c.CoreV1().Pods("ns").Get(ctx, "a", metav1.GetOptions{})
		return err == nil && p.Annotations[kube.AnnResizeNudge] == "grown=2Gi"
	}, 5*time.Second, 10*time.Millisecond)
}
