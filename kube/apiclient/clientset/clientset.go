// Package clientset makes a client-go clientset (a real one, or its fake in
// tests) an apiclient.Interface.
package clientset

import (
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lvm-agent/lvm-agent/kube/apiclient"
)

// Wrap is c as an apiclient.Interface.
func Wrap(c kubernetes.Interface) apiclient.Interface { return wrapped{c} }

type wrapped struct{ c kubernetes.Interface }

// IsWatchListSemanticsUnSupported tells client-go's informers what the
// wrapped clientset tells them (its fake cannot stream a list).
func (w wrapped) IsWatchListSemanticsUnSupported() bool {
	u, ok := w.c.(interface{ IsWatchListSemanticsUnSupported() bool })
	return ok && u.IsWatchListSemanticsUnSupported()
}

func (w wrapped) PVCs(ns string) apiclient.Resource[*corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaimList] {
	return w.c.CoreV1().PersistentVolumeClaims(ns)
}

func (w wrapped) PVs() apiclient.Resource[*corev1.PersistentVolume, *corev1.PersistentVolumeList] {
	return w.c.CoreV1().PersistentVolumes()
}

func (w wrapped) Nodes() apiclient.Resource[*corev1.Node, *corev1.NodeList] {
	return w.c.CoreV1().Nodes()
}

func (w wrapped) Pods(ns string) apiclient.Resource[*corev1.Pod, *corev1.PodList] {
	return w.c.CoreV1().Pods(ns)
}

func (w wrapped) Events(ns string) apiclient.Resource[*corev1.Event, *corev1.EventList] {
	return w.c.CoreV1().Events(ns)
}

func (w wrapped) Leases(ns string) apiclient.Resource[*coordinationv1.Lease, *coordinationv1.LeaseList] {
	return w.c.CoordinationV1().Leases(ns)
}

func (w wrapped) Secrets(ns string) apiclient.Resource[*corev1.Secret, *corev1.SecretList] {
	return w.c.CoreV1().Secrets(ns)
}
