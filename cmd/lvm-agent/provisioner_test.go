//go:build !nodeagent

package main

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"
)

// slowAgent fails its first attempts as our provisioner does while the
// node's agent has not answered, then provisions.
type slowAgent struct {
	failures int32 // set before the controller runs
	calls    atomic.Int32
}

func (s *slowAgent) Provision(_ context.Context, opts controller.ProvisionOptions) (*v1.PersistentVolume, controller.ProvisioningState, error) {
	if s.calls.Add(1) <= s.failures {
		return nil, controller.ProvisioningInBackground, errors.New("no answer before the deadline")
	}
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: opts.PVName},
		Spec: v1.PersistentVolumeSpec{
			Capacity:               v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Mi")},
			AccessModes:            opts.PVC.Spec.AccessModes,
			PersistentVolumeSource: v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: "/dev/vg/lv"}},
		},
	}, controller.ProvisioningFinished, nil
}

func (s *slowAgent) Delete(context.Context, *v1.PersistentVolume) error { return nil }

// A claim whose agent fails more attempts than the library's default
// threshold (15) is still provisioned once the agent answers: the
// controller keeps retrying it, as csi-provisioner does.
func TestClaimRetriedPastTheLibrarysThreshold(t *testing.T) {
	const name = "lvm.lvm-agent.io"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "lvm"}, Provisioner: name}
	claim := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "default", UID: "uid-1",
			Annotations: map[string]string{"volume.kubernetes.io/storage-provisioner": name}},
		Spec: v1.PersistentVolumeClaimSpec{
			StorageClassName: &class.Name,
			AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Resources:        v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Mi")}},
		},
	}
	client := fake.NewClientset(class, claim)
	agent := &slowAgent{failures: 20}
	// The options runProvisioner uses, with a backoff of milliseconds
	// instead of the library's 15 s so that 20 failures take no time.
	opts := append(controllerOptions(provisionerOptions{workers: 1}),
		controller.RateLimiter(workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Millisecond, 10*time.Millisecond)))
	go controller.NewProvisionController(ctx, client, name, agent, opts...).Run(ctx)

	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		pvs, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(pvs.Items) == 1 {
			if n := agent.calls.Load(); n != 21 {
				t.Errorf("Provision called %d times, want 21 (20 failures, then the PV)", n)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no PV after %d attempts (20 failed): the controller gave up on the claim", agent.calls.Load())
}
