package provisioning

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

// BenchmarkPVCBound measures a user's wait: from creating a claim (and its
// Pod) to the claim being Bound, through the real scheduler, PV controller,
// provisioner and agent, with the fake lvmd answering at once and after 1 s.
// It prints the median of the run's iterations:
//
//	make bench-provision   (go test -run '^$' -bench PVCBound -benchtime 20x ./integration/provisioning)
func BenchmarkPVCBound(b *testing.B) {
	storageClass(b, "bench", storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg1"})
	for _, latency := range []time.Duration{0, time.Second} {
		b.Run(fmt.Sprintf("lvmd-%dms", latency.Milliseconds()), func(b *testing.B) {
			big.lvm.SetLatency(latency)
			defer big.lvm.SetLatency(0)
			ns := newNamespace(b)
			var took []time.Duration
			for i := 0; b.Loop(); i++ {
				name := fmt.Sprintf("c%d", i)
				// 2 GiB: only the big node can hold it, so every claim takes the same path.
				w, err := cluster.Client.CoreV1().PersistentVolumeClaims(ns).Watch(context.Background(),
					metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
				if err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				claimAndPod(b, ns, name, "bench", "2Gi", corev1.PersistentVolumeFilesystem, nil)
				untilBound(b, w)
				took = append(took, time.Since(start))
				w.Stop()
				b.StopTimer()
				_, pv := waitBound(b, ns, name)
				deleteClaim(b, ns, name)
				pvGone(b, pv.Name)
				b.StartTimer()
			}
			slices.Sort(took)
			median := took[len(took)/2]
			b.ReportMetric(median.Seconds(), "median-s")
			b.ReportMetric(0, "ns/op")
			fmt.Printf("PVC created -> bound, fake lvmd latency %v: median %v of %d (min %v, max %v)\n",
				latency, median.Round(time.Millisecond), len(took), took[0].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
		})
	}
}

func untilBound(b *testing.B, w watch.Interface) {
	b.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				b.Fatal("watch ended")
			}
			if pvc, isPVC := ev.Object.(*corev1.PersistentVolumeClaim); isPVC && pvc.Status.Phase == corev1.ClaimBound {
				return
			}
		case <-deadline:
			b.Fatalf("claim not bound in %v", timeout)
		}
	}
}
