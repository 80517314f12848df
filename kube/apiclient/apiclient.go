// Package apiclient is the agent's client of the API server: the few kinds
// of objects lvm-agent reads and writes, each with client-go's typed
// methods.
//
// client-go's clientset and typed clients register every API group of
// Kubernetes in one scheme when a program starts; that costs the node agent
// about 25 MiB of resident memory for types it never sees. New builds the
// same typed clients (client-go's gentype) on REST clients whose scheme holds
// only core/v1 and coordination/v1. The provisioner, whose libraries need a
// clientset, wraps its own with package clientset.
package apiclient

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/gentype"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// Resource is one kind of object, in one namespace or cluster-wide. client-go's
// typed clients (and their fakes) have these methods, with these signatures.
type Resource[T runtime.Object, L runtime.Object] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// Interface is every kind lvm-agent uses.
type Interface interface {
	PVCs(namespace string) Resource[*corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaimList]
	PVs() Resource[*corev1.PersistentVolume, *corev1.PersistentVolumeList]
	Nodes() Resource[*corev1.Node, *corev1.NodeList]
	Pods(namespace string) Resource[*corev1.Pod, *corev1.PodList]
	Events(namespace string) Resource[*corev1.Event, *corev1.EventList]
	Leases(namespace string) Resource[*coordinationv1.Lease, *coordinationv1.LeaseList]
	// Secrets: the agent reads only the key Secrets its classes name.
	Secrets(namespace string) Resource[*corev1.Secret, *corev1.SecretList]
}

// Scheme holds the kinds of Interface (and the event recorder's references to them).
var Scheme = runtime.NewScheme()

var (
	codecs         = serializer.NewCodecFactory(Scheme)
	parameterCodec = runtime.NewParameterCodec(Scheme)
)

func init() {
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
	utilruntime.Must(corev1.AddToScheme(Scheme))
	utilruntime.Must(coordinationv1.AddToScheme(Scheme))
}

type client struct{ core, coordination rest.Interface }

// New is an Interface on cfg: one HTTP client and one rate limiter for both
// API groups, as a clientset has (kubernetes.NewForConfigAndClient).
func New(cfg *rest.Config) (Interface, error) {
	c := *cfg
	if c.RateLimiter == nil && c.QPS > 0 {
		if c.Burst <= 0 {
			return nil, fmt.Errorf("kubernetes client: burst must be positive when QPS is")
		}
		c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(c.QPS, c.Burst)
	}
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	c.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(Scheme, codecs).WithoutConversion()
	httpClient, err := rest.HTTPClientFor(&c)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	group := func(apiPath string, gv schema.GroupVersion) (rest.Interface, error) {
		g := c
		g.APIPath, g.GroupVersion = apiPath, &gv
		r, err := rest.RESTClientForConfigAndClient(&g, httpClient)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client: %w", err)
		}
		return r, nil
	}
	var out client
	if out.core, err = group("/api", corev1.SchemeGroupVersion); err != nil {
		return nil, err
	}
	if out.coordination, err = group("/apis", coordinationv1.SchemeGroupVersion); err != nil {
		return nil, err
	}
	return out, nil
}

func typed[T interface {
	runtime.Object
	metav1.Object
}, L runtime.Object](r rest.Interface, resource, namespace string, obj func() T, list func() L) Resource[T, L] {
	return gentype.NewClientWithList(resource, r, parameterCodec, namespace, obj, list, gentype.PrefersProtobuf[T]())
}

func zero[T any]() *T { return new(T) }

func (c client) PVCs(ns string) Resource[*corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaimList] {
	return typed(c.core, "persistentvolumeclaims", ns, zero[corev1.PersistentVolumeClaim], zero[corev1.PersistentVolumeClaimList])
}

func (c client) PVs() Resource[*corev1.PersistentVolume, *corev1.PersistentVolumeList] {
	return typed(c.core, "persistentvolumes", "", zero[corev1.PersistentVolume], zero[corev1.PersistentVolumeList])
}

func (c client) Nodes() Resource[*corev1.Node, *corev1.NodeList] {
	return typed(c.core, "nodes", "", zero[corev1.Node], zero[corev1.NodeList])
}

func (c client) Pods(ns string) Resource[*corev1.Pod, *corev1.PodList] {
	return typed(c.core, "pods", ns, zero[corev1.Pod], zero[corev1.PodList])
}

func (c client) Events(ns string) Resource[*corev1.Event, *corev1.EventList] {
	return typed(c.core, "events", ns, zero[corev1.Event], zero[corev1.EventList])
}

func (c client) Leases(ns string) Resource[*coordinationv1.Lease, *coordinationv1.LeaseList] {
	return typed(c.coordination, "leases", ns, zero[coordinationv1.Lease], zero[coordinationv1.LeaseList])
}

func (c client) Secrets(ns string) Resource[*corev1.Secret, *corev1.SecretList] {
	return typed(c.core, "secrets", ns, zero[corev1.Secret], zero[corev1.SecretList])
}
