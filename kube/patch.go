package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lvm-agent/lvm-agent/kube/apiclient"
)

// This file is the only place that writes annotations and labels: every write
// is a JSON merge patch of exactly the keys given, nothing else.

// MaxErrorBytes bounds the volume.error annotation.
const MaxErrorBytes = 1024

// Change is a set of keys to set (non-nil value) or remove (nil value).
type Change map[string]*string

// Set returns a Change that sets the given key/value pairs.
func Set(kv map[string]string) Change {
	c := Change{}
	for k, v := range kv {
		c[k] = &v
	}
	return c
}

// Remove adds keys to remove.
func (c Change) Remove(keys ...string) Change {
	for _, k := range keys {
		c[k] = nil
	}
	return c
}

// Pending reports whether applying c to current would change anything, so
// that the agent never writes a no-op.
func (c Change) Pending(current map[string]string) bool {
	for k, v := range c {
		cur, ok := current[k]
		if (v == nil) == ok || v != nil && *v != cur {
			return true
		}
	}
	return false
}

// mergePatch builds the patch. A non-empty resourceVersion makes the write
// conditional: the API server refuses it (409) if the object changed since
// the agent read it, so that a decision is never written on a newer request.
func mergePatch(resourceVersion string, annotations, labels Change) ([]byte, error) {
	meta := map[string]any{}
	if resourceVersion != "" {
		meta["resourceVersion"] = resourceVersion
	}
	if len(annotations) > 0 {
		meta["annotations"] = annotations
	}
	if len(labels) > 0 {
		meta["labels"] = labels
	}
	return json.Marshal(map[string]any{"metadata": meta})
}

// patch merge-patches the named object through its typed client's Patch.
// what names the object in the error.
func patch[T any](ctx context.Context, p func(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) (*T, error),
	what, name, resourceVersion string, annotations, labels Change) (*T, error) {
	data, err := mergePatch(resourceVersion, annotations, labels)
	if err != nil {
		return nil, err
	}
	obj, err := p(ctx, name, types.MergePatchType, data, metav1.PatchOptions{})
	if err != nil {
		return nil, fmt.Errorf("patch %s: %w", what, err)
	}
	return obj, nil
}

// UpdatePvcWithAnnotations merge-patches the given annotations (and labels,
// which may be nil) of a PVC and returns the PVC as the API server stored it.
// resourceVersion, when not empty, is a precondition.
func UpdatePvcWithAnnotations(ctx context.Context, c apiclient.Interface, namespace, name, resourceVersion string, annotations, labels Change) (*corev1.PersistentVolumeClaim, error) {
	return patch(ctx, c.PVCs(namespace).Patch, "PVC "+namespace+"/"+name, name, resourceVersion, annotations, labels)
}

// UpdatePvWithAnnotations merge-patches the given annotations (and labels) of a PV.
func UpdatePvWithAnnotations(ctx context.Context, c apiclient.Interface, name, resourceVersion string, annotations, labels Change) (*corev1.PersistentVolume, error) {
	return patch(ctx, c.PVs().Patch, "PV "+name, name, resourceVersion, annotations, labels)
}

// UpdateNodeWithAnnotations merge-patches the given annotations of a Node
// (the agent's capacity report). A merge patch never creates the Node, which
// is the kubelet's to register: a missing Node is an error that
// apierrors.IsNotFound recognizes.
func UpdateNodeWithAnnotations(ctx context.Context, c apiclient.Interface, name, resourceVersion string, annotations Change) (*corev1.Node, error) {
	return patch(ctx, c.Nodes().Patch, "Node "+name, name, resourceVersion, annotations, nil)
}

// NudgePod writes value as AnnResizeNudge on pod: one key, conditional on
// the resourceVersion pod was read at.
func NudgePod(ctx context.Context, c apiclient.Interface, pod *corev1.Pod, value string) error {
	_, err := patch(ctx, c.Pods(pod.Namespace).Patch, "Pod "+pod.Namespace+"/"+pod.Name, pod.Name, pod.ResourceVersion,
		Set(map[string]string{AnnResizeNudge: value}), nil)
	return err
}

// LabelRequest writes the volume.node label, value, on an unlabelled PVC or
// PV (the labeller's only write): a merge patch of that one label,
// conditional on the resourceVersion obj was read at, so that it never lands
// on an object changed since (a 409 the caller reads again).
func LabelRequest(ctx context.Context, c apiclient.Interface, obj runtime.Object, value string) error {
	m, err := metaOf(obj)
	if err != nil {
		return err
	}
	label := Set(map[string]string{LabelNode: value})
	switch obj.(type) {
	case *corev1.PersistentVolumeClaim:
		_, err = UpdatePvcWithAnnotations(ctx, c, m.GetNamespace(), m.GetName(), m.GetResourceVersion(), nil, label)
	default:
		_, err = UpdatePvWithAnnotations(ctx, c, m.GetName(), m.GetResourceVersion(), nil, label)
	}
	return err
}

// OneLine makes an error fit the volume.error annotation: one line, bounded.
func OneLine(err error) string {
	s := strings.Join(strings.Fields(err.Error()), " ")
	if len(s) > MaxErrorBytes {
		s = strings.ToValidUTF8(s[:MaxErrorBytes-3], "") + "..."
	}
	return s
}

// PVRequestMeta is what a provisioner puts on a PV it creates for an LV:
// the spec ("vg/lv") a later delete names, and the volume.node label, so
// that the agent's filtered watch sees the PV.
func PVRequestMeta(node, vg, lv string) (annotations, labels map[string]string) {
	return map[string]string{AnnSpec: vg + "/" + lv}, map[string]string{LabelNode: NodeLabelValue(node)}
}
