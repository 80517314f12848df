package provisioning

import (
	"context"
	"fmt"
	"maps"
	"os"
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
			eventWrites(b, ns, len(took))
		})
	}
}

// eventWrites prints the event writes about the namespace's claims per
// claim, by reason: an event's count is its create and each patch that
// counted it again (kube-controller-manager's, the provisioner's, the
// agent's).
func eventWrites(b *testing.B, ns string, claims int) {
	b.Helper()
	evs, err := cluster.Client.CoreV1().Events(ns).List(context.Background(),
		metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("involvedObject.kind", "PersistentVolumeClaim").String()})
	if err != nil {
		b.Fatal(err)
	}
	by := map[string]int32{}
	var all int32
	for _, e := range evs.Items {
		n := max(e.Count, 1)
		by[e.Reason] += n
		all += n
	}
	line := fmt.Sprintf("event writes on the claims: %.2f per claim", float64(all)/float64(claims))
	for _, r := range slices.Sorted(maps.Keys(by)) {
		line += fmt.Sprintf(", %s %.2f", r, float64(by[r])/float64(claims))
	}
	fmt.Println(line)
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

// BenchmarkPVCBurst: 20 claims, each with a Pod, created at once on a node
// of their own whose lvmd takes 6 s per create (BURST_LVMD_LATENCY), one at
// a time (LVM's lock on the VG), so the k-th claim cannot be Bound before
// about k x 6 s; four creates queued at lvmd then outlast one attempt of
// this provisioner (--timeout 20s), as on a loaded node. It prints each
// claim's wait, created -> Bound, in order, beside that floor, and the
// median.
//
//	make bench-provision   (... -bench PVCBurst -benchtime 1x ./integration/provisioning)
func BenchmarkPVCBurst(b *testing.B) {
	const n = 20
	latency := 6 * time.Second
	if s := os.Getenv("BURST_LVMD_LATENCY"); s != "" {
		var err error
		if latency, err = time.ParseDuration(s); err != nil {
			b.Fatal(err)
		}
	}
	storageClass(b, "burst", storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg1"})
	ns := newNamespace(b)
	bn := startNode(b, "burst", 100<<30, "64", "256Gi") // CPU for 20 Pods of 1 CPU
	for i := 0; b.Loop(); i++ {
		bn.lvm.SetLatency(latency)
		w, err := cluster.Client.CoreV1().PersistentVolumeClaims(ns).Watch(context.Background(), metav1.ListOptions{})
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		for j := range n {
			claimAndPod(b, ns, fmt.Sprintf("b%d-%d", i, j), "burst", "2Gi", corev1.PersistentVolumeFilesystem, map[string]string{corev1.LabelHostname: bn.name})
		}
		bound := map[string]time.Duration{}
		pvs := map[string]string{} // claim -> its PV
		deadline := time.After(n*latency + 3*time.Minute)
		for len(bound) < n {
			select {
			case ev := <-w.ResultChan():
				if c, ok := ev.Object.(*corev1.PersistentVolumeClaim); ok && c.Status.Phase == corev1.ClaimBound {
					if _, seen := bound[c.Name]; !seen {
						bound[c.Name], pvs[c.Name] = time.Since(start), c.Spec.VolumeName
					}
				}
			case <-deadline:
				b.Fatalf("%d of %d claims bound in time\nprovisioner:\n%s\nagent of node %s:\n%s\nkube-scheduler:\n%s", len(bound), n,
					prov.Output(), bn.name, bn.agent.Output(), cluster.Scheduler.Output())
			}
		}
		w.Stop()
		b.StopTimer()
		took := slices.Sorted(maps.Values(bound))
		for k, d := range took {
			fmt.Printf("burst %d: claim %2d bound after %6.1f s (lvmd's floor %4.0f s)\n", i, k+1, d.Seconds(), float64(k+1)*latency.Seconds())
		}
		fmt.Printf("burst %d: %d claims, fake lvmd %v per create: median %.1f s (floor %.1f s), last %.1f s\n", i, n, latency,
			(took[n/2-1]+took[n/2]).Seconds()/2, float64(n+1)/2*latency.Seconds(), took[n-1].Seconds())
		bn.lvm.SetLatency(0)
		for name := range pvs {
			deleteClaim(b, ns, name)
		}
		for _, pv := range pvs {
			pvGone(b, pv)
		}
		b.StartTimer()
	}
	b.ReportMetric(0, "ns/op")
}
