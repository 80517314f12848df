package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
)

// The leader row (-leader-claims): the memory of the provisioner's leader,
// the real `lvm-agent provisioner` with deploy/'s defaults (every
// controller on), against a fresh API server holding N bound claims of an
// lvm-agent StorageClass, each with the local PV the provisioner made, on
// leaderNodes Nodes. Nothing else watches the claims here, so the API
// server's open PVC and PV watches are the leader's informers.
const (
	leaderNS    = "lvm-agent" // the provisioner's namespace (its Lease, the capacity objects)
	leaderNodes = 50
	leaderClass = "leader-lvm"
	claimsNS    = 10 // namespaces the claims are spread over
)

// leaderRow is one provisioner start at a number of claims.
type leaderRow struct {
	claims        int
	synced        time.Duration // start → the library's "Started provisioner controller"
	rss, anon     float64       // MiB, VmRSS and RssAnon after the settle
	hwm           float64       // MiB, VmHWM
	heapInuse     float64       // MiB, go_memstats_heap_inuse_bytes
	pvcW, pvW, nW float64       // watches open on the API server: PVCs, PVs, Nodes
}

// runLeader makes the claims, growing between the rows, and starts a fresh
// provisioner for each row.
func runLeader(ctx context.Context, cfg config, claims []int, settle time.Duration, log io.Writer) ([]leaderRow, error) {
	tb := &harness.ProgramTB{Log: log}
	defer tb.Close()
	logf := progress(log)
	dir := tb.TempDir()
	bin := cfg.agentBin
	if bin == "" {
		bin = harness.AgentBinary(tb, dir)
	}
	logf("starting etcd + kube-apiserver")
	cp, err := harness.StartDevCluster("", dir, 5*time.Minute)
	if err != nil {
		return nil, err
	}
	tb.Cleanup(func() { _ = cp.Env.Stop() })
	rc := *cp.Config
	rc.QPS, rc.Burst = 5000, 10000
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	c, err := kubernetes.NewForConfig(&rc)
	if err != nil {
		return nil, err
	}
	if err := leaderWorld(ctx, c); err != nil {
		return nil, err
	}
	var rows []leaderRow
	have := 0
	for _, n := range claims {
		start := time.Now()
		if err := parallel(ctx, cfg.createWorkers, have, n, func(ctx context.Context, i int) error { return leaderVolume(ctx, c, i) }); err != nil {
			return nil, err
		}
		if n > have {
			logf("made claims and PVs %d..%d in %v", have, n, time.Since(start).Round(time.Millisecond))
		}
		have = n
		r, err := leaderRun(ctx, tb, cp, bin, n, settle, cfg.verbose, logf)
		if err != nil {
			return nil, fmt.Errorf("leader row %d: %w", n, err)
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// leaderWorld: the namespaces, the class and the Nodes, each with its
// agent's capacity annotation.
func leaderWorld(ctx context.Context, c kubernetes.Interface) error {
	ns := []string{leaderNS}
	for i := range claimsNS {
		ns = append(ns, fmt.Sprintf("claims-%02d", i))
	}
	for _, n := range ns {
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	grow := true
	if _, err := c.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: leaderClass},
		Provisioner: kube.DefaultProvisioner, VolumeBindingMode: &wffc, AllowVolumeExpansion: &grow,
		Parameters: map[string]string{"volumeGroup": "vg1"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	capacity := kube.EncodeStorageTopology([]kube.StorageCapacity{{Type: "lvm", Name: "vg1", DeviceClass: "vg1",
		Capacity: 64 << 40, Free: 32 << 40, Grow: true, Wipe: kube.WipeZero}})
	for i := range leaderNodes {
		name := leaderNode(i)
		if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{corev1.LabelHostname: name}, Annotations: map[string]string{kube.DefaultCapacityAnnotation: capacity}}},
			metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

func leaderNode(i int) string { return fmt.Sprintf("node-%03d", i%leaderNodes) }

// leaderVolume is claim i, bound, and its PV, as lvm-agent's provisioner
// and kube-controller-manager leave them.
func leaderVolume(ctx context.Context, c kubernetes.Interface, i int) error {
	node := leaderNode(i)
	pvName := fmt.Sprintf("pvc-%06d", i)
	size := resource.MustParse("1Gi")
	pvc := harness.NewPVC(fmt.Sprintf("claims-%02d", i%claimsNS), fmt.Sprintf("data-%06d", i), node)
	class := leaderClass
	pvc.Spec.StorageClassName, pvc.Spec.VolumeName = &class, pvName
	for k, v := range map[string]string{"volume.kubernetes.io/storage-provisioner": kube.DefaultProvisioner,
		"volume.beta.kubernetes.io/storage-provisioner": kube.DefaultProvisioner, "pv.kubernetes.io/bind-completed": "yes",
		"pv.kubernetes.io/bound-by-controller": "yes", kube.AnnLifecycle: kube.StateCreated, kube.AnnDevice: "/dev/vg1/" + pvName,
		kube.AnnSpec: fmt.Sprintf(`{"volumeGroup":"vg1","name":%q,"size":%d}`, pvName, size.Value())} {
		pvc.Annotations[k] = v
	}
	pvc.Labels = map[string]string{kube.LabelNode: kube.NodeLabelValue(node), "app": "db"}
	pvc.Finalizers = []string{"kubernetes.io/pvc-protection"}
	made, err := c.CoreV1().PersistentVolumeClaims(pvc.Namespace).Create(ctx, pvc, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	} else if err != nil {
		return err
	}
	made.Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound, AccessModes: pvc.Spec.AccessModes,
		Capacity: corev1.ResourceList{corev1.ResourceStorage: size}}
	if _, err := c.CoreV1().PersistentVolumeClaims(pvc.Namespace).UpdateStatus(ctx, made, metav1.UpdateOptions{}); err != nil {
		return err
	}
	annotations, labels := kube.PVRequestMeta(node, "vg1", pvName)
	annotations[kube.AnnProvisionedBy] = kube.DefaultProvisioner
	fs := "ext4"
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pvName, Annotations: annotations, Labels: labels,
		Finalizers: []string{"kubernetes.io/pv-protection", "external-provisioner.volume.kubernetes.io/finalizer"}},
		Spec: corev1.PersistentVolumeSpec{Capacity: corev1.ResourceList{corev1.ResourceStorage: size}, AccessModes: pvc.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete, StorageClassName: leaderClass,
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/dev/vg1/" + pvName, FSType: &fs}},
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: made.Namespace, Name: made.Name,
				UID: made.UID, ResourceVersion: made.ResourceVersion},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}}}}
	madePV, err := c.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	} else if err == nil {
		madePV.Status.Phase = corev1.VolumeBound
		_, err = c.CoreV1().PersistentVolumes().UpdateStatus(ctx, madePV, metav1.UpdateOptions{})
	}
	return err
}

// leaderRun starts the provisioner, waits for its claims controller to
// have synced, lets it settle, and reads its memory.
func leaderRun(ctx context.Context, tb *harness.ProgramTB, cp *harness.ControlPlane, bin string, claims int, settle time.Duration,
	verbose bool, logf func(string, ...any)) (leaderRow, error) {
	r := leaderRow{claims: claims}
	addr := harness.FreeAddr(tb)
	_, port, _ := strings.Cut(addr, ":")
	start := time.Now()
	p := harness.StartAgent(tb, bin, "provisioner", "--kubeconfig", cp.Kubeconfig, "--namespace", leaderNS,
		"--metrics-port", port, "--health-address", "")
	defer func() {
		_, _ = p.Signal(syscall.SIGTERM, 30*time.Second)
		p.Kill()
		if verbose {
			logf("provisioner output:\n%s", p.Output())
		}
	}()
	for !strings.Contains(p.Output(), "Started provisioner controller") {
		if time.Since(start) > 5*time.Minute {
			return r, fmt.Errorf("the provisioner's claims controller did not start in 5 min:\n%s", p.Output())
		}
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	r.synced = time.Since(start)
	logf("  %d claims: the claims controller started after %v; settling %v", claims, r.synced.Round(time.Millisecond), settle)
	select {
	case <-ctx.Done():
		return r, ctx.Err()
	case <-time.After(settle):
	}
	mem, err := harness.ProcMemory(p.Cmd.Process.Pid)
	if err != nil {
		return r, err
	}
	r.rss, r.anon, r.hwm = mem["VmRSS"], mem["RssAnon"], mem["VmHWM"]
	m, err := harness.ReadMetrics(addr)
	if err != nil {
		return r, fmt.Errorf("the provisioner's /metrics: %w", err)
	}
	r.heapInuse = m["go_memstats_heap_inuse_bytes"] / (1 << 20)
	api, err := sampleAPIServer(ctx, cp)
	if err != nil {
		return r, err
	}
	r.pvcW = api.m.sum("apiserver_longrunning_requests", `resource="persistentvolumeclaims"`, `verb="WATCH"`)
	r.pvW = api.m.sum("apiserver_longrunning_requests", `resource="persistentvolumes"`, `verb="WATCH"`)
	r.nW = api.m.sum("apiserver_longrunning_requests", `resource="nodes"`, `verb="WATCH"`)
	logf("  %d claims: VmRSS %.1f MiB, RssAnon %.1f MiB, heap in use %.1f MiB; watches PVC %.0f, PV %.0f, Node %.0f",
		claims, r.rss, r.anon, r.heapInuse, r.pvcW, r.pvW, r.nW)
	return r, nil
}

func printLeader(out io.Writer, settle time.Duration, rows []leaderRow) {
	fmt.Fprintf(out, "the provisioner's leader (lvm-agent provisioner, every controller on), %d Nodes, bound claims of one class each with its local PV; read %v after its claims controller started\n\n",
		leaderNodes, settle)
	fmt.Fprintln(out, "| claims | claims controller started | VmRSS MiB | RssAnon MiB | VmHWM MiB | Go heap in use MiB | PVC watches | PV watches | Node watches |")
	fmt.Fprintln(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Fprintf(out, "| %d | %.2f s | %.1f | %.1f | %.1f | %.1f | %s | %s | %s |\n", r.claims, r.synced.Seconds(), r.rss, r.anon, r.hwm, r.heapInuse,
			strconv.FormatFloat(r.pvcW, 'f', 0, 64), strconv.FormatFloat(r.pvW, 'f', 0, 64), strconv.FormatFloat(r.nW, 'f', 0, 64))
	}
	fmt.Fprintln(out, "\nwatches: apiserver_longrunning_requests of verb WATCH, the leader's only (nothing else watches here): one per informer, the labeller's filtered one included.")
}
