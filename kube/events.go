package kube

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/lvm-agent/lvm-agent/kube/apiclient"
)

// NewRecorder records events on PVCs and PVs as component@node. The returned
// func flushes and stops the broadcaster.
func NewRecorder(c apiclient.Interface, component, node string) (record.EventRecorder, func()) {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(eventSink{c})
	return b.NewRecorder(apiclient.Scheme, corev1.EventSource{Component: component, Host: node}), b.Shutdown
}

// eventSink writes the broadcaster's events in their own namespaces, as
// client-go's typed EventSinkImpl does for a clientset.
type eventSink struct{ c apiclient.Interface }

func (s eventSink) Create(e *corev1.Event) (*corev1.Event, error) {
	return s.c.Events(e.Namespace).Create(context.TODO(), e, metav1.CreateOptions{})
}

func (s eventSink) Update(e *corev1.Event) (*corev1.Event, error) {
	return s.c.Events(e.Namespace).Update(context.TODO(), e, metav1.UpdateOptions{})
}

func (s eventSink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	return s.c.Events(e.Namespace).Patch(context.TODO(), e.Name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
}
