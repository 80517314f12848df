package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The rest of the full scenario (make test): a claim that cannot fit, ten
// claims while the node's parts are killed, a class that keeps its LVs.

func emptyDir(ctx context.Context, s *Story) {
	s.Step("A Pod with an emptyDir", "The cluster runs Pods and answers kubectl exec before lvm-agent is installed.")
	s.RunPod(ctx, PodSpec{Name: "hello", Script: "echo hello from $(cat /etc/hostname) >/data/hello"})
	s.WaitReady(ctx, "hello")
	s.ExecWithin(ctx, "hello", "hello from hello", "cat", "/data/hello")
}

func tooLarge(ctx context.Context, s *Story) {
	s.Step("A PVC larger than the VG (2 GiB): Pending, an event says why, no LV")
	s.ThickClass(ctx)
	s.PVC(ctx, Claim{Name: "huge", Class: thickClass, Size: "8Gi"})
	s.RunPod(ctx, PodSpec{Name: "huge", Claim: "huge", Script: "true"})
	var why string
	s.WithinFor(ctx, 5*time.Minute, "a ProvisioningFailed or FailedScheduling event on pvc/huge or pod/huge", func(ctx context.Context) (bool, string, error) {
		evs, err := s.Kube.CoreV1().Events(s.NS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=huge"})
		if err != nil {
			return false, err.Error(), nil
		}
		for _, e := range evs.Items {
			if e.Reason == "ProvisioningFailed" || e.Reason == "FailedScheduling" {
				why = e.Reason + ": " + e.Message
				return true, why, nil
			}
		}
		return false, fmt.Sprintf("%d other events", len(evs.Items)), nil
	})
	s.Kubectl(ctx, "get", "events", "--field-selector", "involvedObject.name=huge")
	pvc, err := s.Kube.CoreV1().PersistentVolumeClaims(s.NS).Get(ctx, "huge", metav1.GetOptions{})
	s.Must(err, "reading pvc/huge")
	lvs := s.LVs(ctx)
	s.ShowLVs(lvs)
	if pvc.Status.Phase != corev1.ClaimPending || len(lvs.Owned(string(pvc.UID))) > 0 {
		s.Fatalf("pvc/huge is %s with %d LVs (%s), want Pending with none", pvc.Status.Phase, len(lvs.Owned(string(pvc.UID))), why)
	}
}

// killsBurst: ten claims and Pods in one go while lvmd, the agent's Pod,
// kubelet, containerd and kube-apiserver are killed in turn, each back
// before the next (as a node's service manager keeps it: a kubelet started
// while containerd is down exits). Then all ten deleted while the agent is
// killed. The node is audited after each.
func killsBurst(ctx context.Context, s *Story) {
	s.Step("Ten PVCs and Pods at once while the node's parts are killed",
		"make test-faults' kills in one burst: while the claims are provisioned and the Pods start, kill -9 of the lvmd sidecar,",
		"the agent's Pod deleted, kill -9 of kubelet, of containerd and of kube-apiserver (each started again, as a node's",
		"service manager does, before the next). An LV that is not lvm-agent's must come out untouched.")
	s.ThickClass(ctx)
	foreign := s.MakeForeign(ctx)
	const n = 10
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("many-%d", i)
		s.Must(s.createPVC(ctx, Claim{Name: name, Class: thickClass, Size: "64Mi", App: "many"}), "creating pvc/%s", name)
		s.Cleanup(func(ctx context.Context) { s.DeletePVC(ctx, name) })
		s.Must(s.createPod(ctx, PodSpec{Name: name, Claim: name, App: "many",
			Script: fmt.Sprintf("echo claim %d >/data/file && sync /data/file", i)}), "creating pod/%s", name)
		s.Cleanup(func(ctx context.Context) { s.DeletePod(ctx, name) })
	}
	s.Show("kubectl apply -f many.yaml   # ten PVCs many-1..10 of 64Mi, ten Pods using them", "")
	start := time.Now()
	s.Kill9("lvmd", "")
	if s.Install != "systemd" {
		s.Kubectl(ctx, "-n", "lvm-agent", "delete", "pod", "-l", "app.kubernetes.io/name=lvm-agent", "--wait=false")
	}
	s.Run(ctx, "cluster.sh", "restart", "kubelet", "KILL")
	s.WithinFor(ctx, 2*time.Minute, "kubelet healthy", func(ctx context.Context) (bool, string, error) {
		_, err := Get(ctx, "http://127.0.0.1:10248/healthz")
		return err == nil, fmt.Sprint(err), nil
	})
	s.Run(ctx, "cluster.sh", "restart", "containerd", "KILL")
	s.WithinFor(ctx, 2*time.Minute, "containerd serving", func(ctx context.Context) (bool, string, error) {
		out, err := exec.CommandContext(ctx, "ctr", "version").CombinedOutput()
		return err == nil, strings.TrimSpace(string(out)), nil
	})
	s.Run(ctx, "cluster.sh", "restart", "kube-apiserver", "KILL")
	killed := time.Since(start)
	// The API server may still be starting: its errors are waited out.
	s.WithinFor(ctx, 15*time.Minute, "ten Pods Ready", func(ctx context.Context) (bool, string, error) {
		pods, err := s.Kube.CoreV1().Pods(s.NS).List(ctx, metav1.ListOptions{LabelSelector: "app=many"})
		if err != nil {
			return false, err.Error(), nil
		}
		ready := 0
		for _, p := range pods.Items {
			if ok, _, err := podReady(&p); err != nil {
				return false, "", err
			} else if ok {
				ready++
			}
		}
		return ready == n, fmt.Sprintf("%d of %d Pods Ready", ready, len(pods.Items)), nil
	})
	recovered := time.Since(start)
	s.AgentsReady(ctx)
	s.Kubectl(ctx, "get", "pvc", "-l", "app=many")
	s.ShowLVs(s.LVs(ctx))
	s.agentMetrics(ctx)
	rows := [][]string{}
	a := s.Audit(ctx, "many", n, foreign)
	rows = append(rows, append([]string{"lvmd,agent-pod,kubelet,containerd,kube-apiserver", "10", "0", strconv.Itoa(int(recovered.Seconds()))}, strings.Fields(a.String())...))
	if !a.Zero() {
		s.KillsTable(rows)
		s.Fatalf("the audit after the burst found %s (lost duplicated orphaned open failed foreign)", a)
	}
	s.burstTimes(ctx, start, killed)
	s.readBack(ctx, n)

	s.Step("All ten deleted while the agent is killed: the PVs released, deleted, gone; no LV left")
	pvcs, err := s.Kube.CoreV1().PersistentVolumeClaims(s.NS).List(ctx, metav1.ListOptions{LabelSelector: "app=many"})
	s.Must(err, "listing the claims")
	for i := 1; i <= n; i++ {
		s.DeletePod(ctx, fmt.Sprintf("many-%d", i))
	}
	s.Must(s.Kube.CoreV1().PersistentVolumeClaims(s.NS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "app=many"}),
		"deleting the claims app=many")
	s.Show("kubectl delete pvc -l app=many", fmt.Sprintf("%d claims deleted", len(pvcs.Items)))
	start = time.Now()
	s.Kill9("lvm-agent", "--lvmd-socket=")
	s.Kubectl(ctx, "get", "pv")
	s.WithinFor(ctx, 15*time.Minute, "the ten PVs and their LVs gone", s.roundGone(pvcs.Items))
	recovered = time.Since(start)
	s.ShowLVs(s.LVs(ctx))
	a = s.Audit(ctx, "many", 0, foreign)
	rows = append(rows, append([]string{"agent", "0", "10", strconv.Itoa(int(recovered.Seconds()))}, strings.Fields(a.String())...))
	s.KillsTable(rows) // make test-faults' figures: recover s from the first kill
	if !a.Zero() {
		s.Fatalf("the audit after the deletes found %s (lost duplicated orphaned open failed foreign)", a)
	}
}

// AgentsReady waits until the agent's DaemonSet has every Pod updated and
// ready (an agent run by systemd has none).
func (s *Story) AgentsReady(ctx context.Context) {
	s.WithinFor(ctx, 10*time.Minute, "daemonset/lvm-agent rolled out", func(ctx context.Context) (bool, string, error) {
		ds, err := s.Kube.AppsV1().DaemonSets("lvm-agent").Get(ctx, "lvm-agent", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "no DaemonSet", nil
		} else if err != nil {
			return false, err.Error(), nil
		}
		st := ds.Status
		return st.ObservedGeneration >= ds.Generation && st.UpdatedNumberScheduled == st.DesiredNumberScheduled &&
				st.NumberReady == st.DesiredNumberScheduled && st.DesiredNumberScheduled > 0,
			fmt.Sprintf("%d of %d updated, %d ready", st.UpdatedNumberScheduled, st.DesiredNumberScheduled, st.NumberReady), nil
	})
	s.Kubectl(ctx, "-n", "lvm-agent", "get", "pods")
}

// agentMetrics: lvmd's listings and the creates as the agent counted them
// (the agent's Pod was deleted during the burst: its successor's).
func (s *Story) agentMetrics(ctx context.Context) {
	pods, err := s.Kube.CoreV1().Pods("lvm-agent").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=lvm-agent"})
	if err != nil || len(pods.Items) == 0 || pods.Items[0].Status.PodIP == "" {
		s.Say("(the agent's metrics: no agent Pod with an IP: %v)", err)
		return
	}
	body, err := Get(ctx, "http://"+pods.Items[0].Status.PodIP+":8495/metrics")
	if err != nil {
		s.Say("(the agent's metrics: %v)", err)
		return
	}
	var lines []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "lvm_agent_lvmd_lists_total") || strings.HasPrefix(l, `lvm_agent_operations_total{kind="create",result="created"}`) {
			lines = append(lines, l)
		}
	}
	fmt.Fprintf(s.out, "node: the agent started during the burst: %s\n", strings.Join(lines, "; "))
}

// burstTimes: where the ten claims' time went, from the API server's
// timestamps (whole seconds) after the claims were created: when each
// claim's PV was made, when its Pod became Ready.
func (s *Story) burstTimes(ctx context.Context, start time.Time, killed time.Duration) {
	pvs, err := s.Kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	s.Must(err, "listing the PVs")
	pods, err := s.Kube.CoreV1().Pods(s.NS).List(ctx, metav1.ListOptions{LabelSelector: "app=many"})
	s.Must(err, "listing the Pods")
	var made, ready []float64
	for _, pv := range pvs.Items {
		if pv.Spec.ClaimRef != nil && strings.HasPrefix(pv.Spec.ClaimRef.Name, "many-") {
			made = append(made, pv.CreationTimestamp.Sub(start).Seconds())
		}
	}
	for _, p := range pods.Items {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				ready = append(ready, c.LastTransitionTime.Sub(start).Seconds())
			}
		}
	}
	fmt.Fprintf(s.out, "node: the burst, in s after the claims were created (min median max): PVs made %s; Pods Ready %s; the kills done at %.0f\n",
		spread(made), spread(ready), killed.Seconds())
}

// spread is "min median max" of the values (the median of an even count:
// the upper middle one), or "none".
func spread(v []float64) string {
	if len(v) == 0 {
		return "none"
	}
	slices.Sort(v)
	return fmt.Sprintf("%.0f %.0f %.0f", v[0], v[len(v)/2], v[len(v)-1])
}

// readBack: each Pod's file, read on the node where kubelet mounted its
// claim's LV for it.
func (s *Story) readBack(ctx context.Context, n int) {
	pods, err := s.Kube.CoreV1().Pods(s.NS).List(ctx, metav1.ListOptions{LabelSelector: "app=many"})
	s.Must(err, "listing the Pods")
	if len(pods.Items) != n {
		s.Fatalf("%d Pods app=many, want %d", len(pods.Items), n)
	}
	for _, p := range pods.Items {
		claim := p.Spec.Volumes[0].PersistentVolumeClaim.ClaimName
		pvc, err := s.Kube.CoreV1().PersistentVolumeClaims(s.NS).Get(ctx, claim, metav1.GetOptions{})
		s.Must(err, "reading pvc/%s", claim)
		file := fmt.Sprintf("/var/lib/kubelet/pods/%s/volumes/kubernetes.io~local-volume/%s/file", p.UID, pvc.Spec.VolumeName)
		want := "claim " + strings.TrimPrefix(claim, "many-")
		s.WithinFor(ctx, 2*time.Minute, file+" (pod/"+p.Name+")", func(ctx context.Context) (bool, string, error) {
			b, err := os.ReadFile(file)
			if err != nil {
				return false, err.Error(), nil
			}
			return strings.TrimSpace(string(b)) == want, string(b), nil
		})
	}
	s.Say("ten claims Bound, exactly one LV each, every Pod's synced file read back on the node")
}

func retain(ctx context.Context, s *Story) {
	s.Step("A Retain class keeps its LV")
	s.Class(ctx, "lvm-thick-retain", s.VG, "ext4", corev1.PersistentVolumeReclaimRetain)
	s.Must(s.createPVC(ctx, Claim{Name: "kept", Class: "lvm-thick-retain", Size: "64Mi"}), "creating pvc/kept")
	s.Show("kubectl apply -f kept.yaml   # a Filesystem PVC of 64Mi in lvm-thick-retain", "persistentvolumeclaim/kept created")
	s.RunPod(ctx, PodSpec{Name: "keeper", Claim: "kept", Script: "echo kept >/data/file && sync /data/file"})
	s.WaitReady(ctx, "keeper")
	v := s.Bound(ctx, "kept")
	// What the class keeps, its operator removes: the PV, then the LV.
	s.Cleanup(func(ctx context.Context) {
		s.DeletePod(ctx, "keeper")
		err := s.Kube.CoreV1().PersistentVolumeClaims(s.NS).Delete(ctx, "kept", metav1.DeleteOptions{})
		if !apierrors.IsNotFound(err) {
			s.Must(err, "deleting pvc/kept")
		}
		err = s.Kube.CoreV1().PersistentVolumes().Delete(ctx, v.PV, metav1.DeleteOptions{})
		if !apierrors.IsNotFound(err) {
			s.Must(err, "deleting pv/%s", v.PV)
		}
		s.Within(ctx, "pv/"+v.PV+" gone", func(ctx context.Context) (bool, string, error) {
			return gone(s.Kube.CoreV1().PersistentVolumes().Get(ctx, v.PV, metav1.GetOptions{}))
		})
		if _, ok := s.LVs(ctx).Named(v.LV.Name); ok {
			s.Lvm(ctx, "lvremove", "-q", "-y", s.VG+"/"+v.LV.Name)
		}
	})
	s.DeletePod(ctx, "keeper")
	s.Must(s.Kube.CoreV1().PersistentVolumeClaims(s.NS).Delete(ctx, "kept", metav1.DeleteOptions{}), "deleting pvc/kept")
	s.Show("kubectl delete pvc kept", `persistentvolumeclaim "kept" deleted`)
	s.Within(ctx, "pv/"+v.PV+" Released", func(ctx context.Context) (bool, string, error) {
		pv, err := s.Kube.CoreV1().PersistentVolumes().Get(ctx, v.PV, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return pv.Status.Phase == corev1.VolumeReleased, "phase " + string(pv.Status.Phase), nil
	})
	s.Kubectl(ctx, "get", "pv", v.PV)
	lvs := s.LVs(ctx)
	s.ShowLVs(lvs)
	lv, ok := lvs.Named(v.LV.Name)
	if !ok || !slices.Contains(lv.Tags, ownerTag+v.UID) || !slices.Contains(lv.Tags, "lvm-agent.retained") {
		s.Fatalf("LV %s of the released pv/%s: there %v, tags %v; want it kept with %s%s and lvm-agent.retained", v.LV.Name, v.PV, ok, lv.Tags, ownerTag, v.UID)
	}
}
