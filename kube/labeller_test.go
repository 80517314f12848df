package kube

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
)

func localPV(name, host, lifecycle string) *corev1.PersistentVolume {
	pv := sweepPV(name, host, "", lifecycle)
	pv.Spec.CSI = nil
	pv.Spec.Local = &corev1.LocalVolumeSource{Path: "/dev/vg/" + name}
	return pv
}

func TestRoute(t *testing.T) {
	long := "node-with-a-name-longer-than-sixty-three-characters-which-a-label-cannot-hold"
	for _, c := range []struct {
		name       string
		obj        any
		node       string
		byHostname bool
		ok         bool
	}{
		{"PVC creating", sweepPVC("p", "node-a", StateCreating, nil), "node-a", false, true},
		{"PVC created", sweepPVC("p", "node-a", StateCreated, nil), "", false, false},
		{"PVC no lifecycle", sweepPVC("p", "node-a", "", nil), "", false, false},
		{"PVC no node", sweepPVC("p", "", StateCreating, nil), "", false, false},
		{"PVC long node", sweepPVC("p", long, StateCreating, nil), long, false, true},
		{"CSI PV deleting", sweepPV("v", "node-a", "other.csi", StateDeleting), "node-a", false, true},
		{"CSI PV created", sweepPV("v", "node-a", DefaultDriver, StateCreated), "", false, false},
		{"local PV deleting", localPV("v", "host-a", StateDeleting), "host-a", true, true},
		{"neither", &corev1.Node{}, "", false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			node, byHostname, ok := Route(c.obj)
			assert.Equal(t, c.ok, ok)
			if c.ok {
				assert.Equal(t, c.node, node)
				assert.Equal(t, c.byHostname, byHostname)
			}
		})
	}
}

// patched is the objects the fake clientset was asked to patch, by name.
func patched(c *fake.Clientset) map[string]int {
	out := map[string]int{}
	for _, a := range c.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			out[p.GetName()]++
		}
	}
	return out
}

func TestLabeller(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	long := "node-with-a-name-longer-than-sixty-three-characters-which-a-label-cannot-hold"
	hostNode := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-h", Labels: map[string]string{corev1.LabelHostname: "host-h"}}}
	open := sweepPVC("open", "node-a", StateCreating, nil)
	open.ResourceVersion = "7"
	c := fake.NewClientset(hostNode, open,
		sweepPVC("open-long", long, StateCreating, nil),
		sweepPVC("done", "node-a", StateCreated, nil),
		sweepPVC("foreign", "node-a", "", map[string]string{"app": "db"}),
		sweepPVC("labelled", "node-a", StateCreating, map[string]string{LabelNode: "someone-else"}),
		sweepPV("pv-open", "node-a", "other.csi", StateDeleting),
		sweepPV("pv-done", "node-a", DefaultDriver, StateCreated),
		localPV("pv-local", "host-h", StateDeleting),
		localPV("pv-local-unknown", "node-z", StateDeleting),
	)
	filterWatches(c)
	reg := prometheus.NewRegistry()
	l := NewLabeller(clientset.Wrap(c), reg)
	done := make(chan struct{})
	go func() { l.Run(ctx, 2); close(done) }()
	defer func() { cancel(); <-done }()

	labelOf := func(pv bool, name string) string {
		var o metav1.Object
		var err error
		if pv {
			o, err = c.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		} else {
			o, err = c.CoreV1().PersistentVolumeClaims("ns").Get(ctx, name, metav1.GetOptions{})
		}
		require.NoError(t, err)
		return o.GetLabels()[LabelNode]
	}
	require.Eventually(t, func() bool {
		return gather(t, reg)[key("lvm_agent_labeller_labelled_total", "resource", "persistentvolumes")] == 3 &&
			gather(t, reg)[key("lvm_agent_labeller_labelled_total", "resource", "persistentvolumeclaims")] == 2
	}, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, "node-a", labelOf(false, "open"))
	assert.Equal(t, NodeLabelValue(long), labelOf(false, "open-long"), "the hashed form")
	assert.Equal(t, "node-a", labelOf(true, "pv-open"))
	assert.Equal(t, "node-h", labelOf(true, "pv-local"), "a local PV: the node whose hostname label its affinity names")
	assert.Equal(t, "node-z", labelOf(true, "pv-local-unknown"), "no Node carries the hostname: the name, as an agent that cannot read its Node")
	assert.Equal(t, "someone-else", labelOf(false, "labelled"), "an object with the label is never relabelled")

	// A request written later is labelled too.
	_, err := c.CoreV1().PersistentVolumeClaims("ns").Create(ctx, sweepPVC("later", "node-b", StateCreating, nil), metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return labelOf(false, "later") == "node-b" }, 10*time.Second, 10*time.Millisecond)

	// The patches: one per request, each of the label alone, conditional.
	got := patched(c)
	assert.Equal(t, map[string]int{"open": 1, "open-long": 1, "pv-open": 1, "pv-local": 1, "pv-local-unknown": 1, "later": 1}, got,
		"no foreign object, answered one or labelled one is patched")
	for _, a := range c.Actions() {
		p, ok := a.(k8stesting.PatchAction)
		if !ok {
			continue
		}
		assert.Equal(t, types.MergePatchType, p.GetPatchType())
		var body struct {
			Metadata map[string]json.RawMessage
		}
		require.NoError(t, json.Unmarshal(p.GetPatch(), &body))
		var labels map[string]string
		require.NoError(t, json.Unmarshal(body.Metadata["labels"], &labels))
		assert.Equal(t, []string{LabelNode}, slices.Collect(maps.Keys(labels)), "the label alone")
		delete(body.Metadata, "labels")
		if p.GetName() == "open" {
			assert.Equal(t, map[string]json.RawMessage{"resourceVersion": json.RawMessage(`"7"`)}, body.Metadata, "conditional on the version read")
		} else {
			assert.Subset(t, []string{"resourceVersion"}, slices.Collect(maps.Keys(body.Metadata)))
		}
	}
}

// A request labelled by someone between the labeller's read and its write:
// the conditional patch conflicts, the labeller reads it again, and leaves it.
func TestLabellerConflict(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := fake.NewClientset(sweepPVC("raced", "node-a", StateCreating, nil))
	filterWatches(c)
	c.PrependReactor("patch", "persistentvolumeclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		// Someone labels it first.
		gvr := schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumeclaims"}
		o, err := c.Tracker().Get(gvr, "ns", "raced")
		require.NoError(t, err)
		pvc := o.(*corev1.PersistentVolumeClaim).DeepCopy()
		pvc.Labels = map[string]string{LabelNode: "by-hand"}
		require.NoError(t, c.Tracker().Update(gvr, pvc, "ns"))
		return true, nil, apierrors.NewConflict(gvr.GroupResource(), "raced", nil)
	})
	reg := prometheus.NewRegistry()
	l := NewLabeller(clientset.Wrap(c), reg)
	done := make(chan struct{})
	go func() { l.Run(ctx, 1); close(done) }()
	defer func() { cancel(); <-done }()
	require.Eventually(t, func() bool {
		for _, a := range c.Actions() {
			if a.GetVerb() == "get" && a.GetResource().Resource == "persistentvolumeclaims" {
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "read again after the conflict")
	time.Sleep(300 * time.Millisecond) // past the queue's first retry, had there been one
	assert.Equal(t, map[string]int{"raced": 1}, patched(c), "not patched again")
	pvc, err := c.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "raced", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "by-hand", pvc.Labels[LabelNode])
	assert.Zero(t, gather(t, reg)[key("lvm_agent_labeller_labelled_total", "resource", "persistentvolumeclaims")])
}
