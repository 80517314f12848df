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
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// make test-faults' rounds (node.sh --mode faults): for each fault in turn,
// 20 claims are created and the 20 of the round before deleted in one go,
// with the node already chosen on each claim, as the scheduler or the clone
// placer writes it (the PV controller then provisions at once, no Pod
// needed), and 3 s later the fault:
//
//	agent           kill -9 of the agent's process (kubelet restarts it;
//	                with --install systemd, node.sh's service loop)
//	lvmd            kill -9 of lvmd's process (the sidecar's, or the host's)
//	lvmd-away       lvmd kept away for 60 s (killed again each time it is
//	                back): the Node's capacity annotation and the agent's
//	                lvm_agent_lvmd_reachable must say so meanwhile
//	kubelet         kill -9, started again (cluster.sh restart: the service
//	containerd      kill -9, started again  manager's Restart= on a node)
//	kube-apiserver  SIGTERM, started again (an upgrade's restart)
//	vg-full         vg1 filled: 20 claims of a fifteenth of its free space,
//	                so that only some fit; each of the others answered failed
//	                with InsufficientCapacity and sent back to the scheduler
//	                (its selected-node removed), with no LV, and vg1 left with
//	                less room than one claim; then space is freed and the
//	                node chosen again on the refused ones: all Bound
//
// Each round ends when every claim of the round is Bound and every PV and
// LV of the deleted ones is gone (recover: the fault -> that), then the
// audit of the whole node (audit.go). Each count must be 0.

const (
	selectedNode = "volume.kubernetes.io/selected-node"
	reasonKey    = "pv.csi.alibabacloud.com/volume.reason"
	topologyKey  = "csi.alibabacloud.com/storage-topology"
)

func faultRounds(ctx context.Context, s *Story) {
	s.Step("Faults: an LV that is not lvm-agent's, which nothing may touch, and 20 claims to delete in the first round",
		"The claims name this node (volume.kubernetes.io/selected-node), as the scheduler would: provisioned without Pods.")
	s.ThickClass(ctx)
	foreign := s.MakeForeign(ctx)
	s.Cleanup(func(ctx context.Context) { s.deleteRounds(ctx) })
	s.burst(ctx, "base", "16Mi")
	s.WithinFor(ctx, 10*time.Minute, "20 claims of round base Bound", s.roundBound("base", 20))
	var rows [][]string
	audited := func(row []string, a Audit) {
		rows = append(rows, append(row, strings.Fields(a.String())...))
		if !a.Zero() {
			s.KillsTable(rows)
			s.Fatalf("the audit after %s found %s (lost duplicated orphaned open failed foreign)", row[0], a)
		}
	}
	if a := s.Audit(ctx, "faults", 20, foreign); !a.Zero() {
		s.Fatalf("the audit of round base found %s (lost duplicated orphaned open failed foreign)", a)
	}
	prev := "base"
	for _, f := range s.Faults {
		if f == "vg-full" {
			s.Step("The volume group full: 20 claims that cannot all fit (round vg-full), round " + prev + " still there")
			row, a := s.vgFull(ctx, prev, foreign)
			audited(row, a)
			prev = f
			continue
		}
		s.Step(fmt.Sprintf("Fault: %s, during 20 creates (round %s) and 20 deletes (round %s)", f, f, prev))
		s.burst(ctx, f, "16Mi")
		deleted := s.deleteRound(ctx, prev)
		// The fault strikes 3 s into the burst: a moment of the fault's
		// design, not a wait for anything.
		time.Sleep(3 * time.Second)
		start := time.Now()
		s.fault(ctx, f)
		s.WithinFor(ctx, 15*time.Minute, "20 claims of round "+f+" Bound", s.roundBound(f, 20))
		s.WithinFor(ctx, 15*time.Minute, "the PVs and LVs of round "+prev+" gone", s.roundGone(deleted))
		took := time.Since(start)
		s.Kubectl(ctx, "-n", "lvm-agent", "get", "pods")
		audited([]string{f, "20", "20", strconv.Itoa(int(took.Seconds()))}, s.Audit(ctx, "faults", 20, foreign))
		prev = f
	}
	s.Step("Faults: the last round deleted; the node audited once more")
	deleted := s.deleteRound(ctx, prev)
	start := time.Now()
	s.WithinFor(ctx, 15*time.Minute, "the PVs and LVs of round "+prev+" gone", s.roundGone(deleted))
	took := time.Since(start)
	s.ShowLVs(s.LVs(ctx))
	a := s.Audit(ctx, "faults", 0, foreign)
	rows = append(rows, append([]string{"(end)", "0", strconv.Itoa(len(deleted)), strconv.Itoa(int(took.Seconds()))}, strings.Fields(a.String())...))
	s.KillsTable(rows)
	if !a.Zero() {
		s.Fatalf("the last audit found %s (lost duplicated orphaned open failed foreign)", a)
	}
}

// burst creates round's 20 claims of size, on this node.
func (s *Story) burst(ctx context.Context, round, size string) {
	node, err := os.Hostname()
	s.Must(err, "reading the node's name")
	for i := 1; i <= 20; i++ {
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", round, i), Namespace: s.NS,
				Labels:      map[string]string{"app": "faults", "round": round},
				Annotations: map[string]string{selectedNode: node}},
			Spec: corev1.PersistentVolumeClaimSpec{
				StorageClassName: ptr(thickClass),
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
			},
		}
		_, err := s.Kube.CoreV1().PersistentVolumeClaims(s.NS).Create(ctx, pvc, metav1.CreateOptions{})
		s.Must(err, "creating pvc/%s", pvc.Name)
	}
	s.Show(fmt.Sprintf("kubectl apply -f round-%s.yaml   # 20 PVCs %s-1..20 of %s on node %s", round, round, size, node), "")
}

// roundClaims lists a round's claims (every round's when round is "").
func (s *Story) roundClaims(ctx context.Context, round string) ([]corev1.PersistentVolumeClaim, error) {
	sel := "app=faults"
	if round != "" {
		sel += ",round=" + round
	}
	l, err := s.Kube.CoreV1().PersistentVolumeClaims(s.NS).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// roundBound: want claims of the round there, all Bound. The API server may
// be away: its errors are waited out.
func (s *Story) roundBound(round string, want int) func(context.Context) (bool, string, error) {
	return func(ctx context.Context) (bool, string, error) {
		claims, err := s.roundClaims(ctx, round)
		if err != nil {
			return false, err.Error(), nil
		}
		bound := 0
		for _, c := range claims {
			if c.Status.Phase == corev1.ClaimBound {
				bound++
			}
		}
		return bound == want && len(claims) == want, fmt.Sprintf("%d of %d Bound", bound, len(claims)), nil
	}
}

// deleteRound deletes the round's claims; what they were, for roundGone.
func (s *Story) deleteRound(ctx context.Context, round string) []corev1.PersistentVolumeClaim {
	claims, err := s.roundClaims(ctx, round)
	s.Must(err, "listing round %s's claims", round)
	s.Must(s.Kube.CoreV1().PersistentVolumeClaims(s.NS).DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: "app=faults,round=" + round}), "deleting round %s's claims", round)
	s.Show("kubectl delete pvc -l round="+round+" --wait=false", fmt.Sprintf("%d claims deleted", len(claims)))
	return claims
}

// deleteRounds: what the rounds left, gone (the story's cleanup).
func (s *Story) deleteRounds(ctx context.Context) {
	claims, err := s.roundClaims(ctx, "")
	s.Must(err, "listing the rounds' claims")
	for _, c := range claims {
		s.DeletePVC(ctx, c.Name)
	}
}

// roundGone: the PVs of those claims and the LVs tagged with them gone.
func (s *Story) roundGone(claims []corev1.PersistentVolumeClaim) func(context.Context) (bool, string, error) {
	return func(ctx context.Context) (bool, string, error) {
		pvs, err := s.Kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		lvs, err := s.lvs(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		pvsLeft, lvsLeft := 0, 0
		for _, c := range claims {
			lvsLeft += len(lvs.Owned(string(c.UID)))
			if slices.ContainsFunc(pvs.Items, func(pv corev1.PersistentVolume) bool { return pv.Name == c.Spec.VolumeName }) {
				pvsLeft++
			}
		}
		return pvsLeft+lvsLeft == 0, fmt.Sprintf("%d of their PVs, %d of their LVs", pvsLeft, lvsLeft), nil
	}
}

func (s *Story) fault(ctx context.Context, f string) {
	switch f {
	case "agent":
		s.Kill9("lvm-agent", "--lvmd-socket=")
	case "lvmd":
		s.Kill9("lvmd", "")
	case "lvmd-away":
		s.lvmdAway(ctx, time.Minute)
	case "kubelet", "containerd":
		s.Run(ctx, "cluster.sh", "restart", f, "KILL")
	case "kube-apiserver":
		s.Run(ctx, "cluster.sh", "restart", "kube-apiserver", "TERM")
	default:
		s.Fatalf("no fault %q (agent, lvmd, lvmd-away, kubelet, containerd, kube-apiserver, vg-full)", f)
	}
}

// lvmdAway: no lvmd for d (killed again each time it is back); each look
// asks the Node's capacity annotation and the agent's metric whether they
// say so. Both must, at least once.
func (s *Story) lvmdAway(ctx context.Context, d time.Duration) {
	node, err := os.Hostname()
	s.Must(err, "reading the node's name")
	metrics := "http://127.0.0.1:8495/metrics" // the systemd unit's --metrics-address
	if s.Install != "systemd" {
		pods, err := s.Kube.CoreV1().Pods("lvm-agent").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=lvm-agent"})
		s.Must(err, "listing the agent's Pods")
		if len(pods.Items) == 0 {
			s.Fatalf("no agent Pod")
		}
		metrics = "http://" + pods.Items[0].Status.PodIP + ":8495/metrics"
	}
	said, metric, looks := false, false, 0
	for end := time.Now().Add(d); time.Now().Before(end); looks++ {
		kill9("lvmd", "") // none between kubelet's restarts
		if n, err := s.Kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err == nil &&
			strings.Contains(n.Annotations[topologyKey], `"lvmdUnreachable":true`) {
			said = true
		}
		if body, err := Get(ctx, metrics); err == nil && slices.Contains(strings.Split(body, "\n"), "lvm_agent_lvmd_reachable 0") {
			metric = true
		}
		select {
		case <-ctx.Done():
			s.Fatalf("lvmd away: %v", ctx.Err())
		case <-time.After(2 * time.Second): // the next look
		}
	}
	s.Show(fmt.Sprintf("# lvmd kept away %s", d), fmt.Sprintf("%d looks: the Node's capacity annotation said lvmdUnreachable: %v; lvm_agent_lvmd_reachable 0: %v", looks, said, metric))
	if !said || !metric {
		s.Fatalf("lvmd away %s: the Node said so %v, the agent's metric %v: both must", d, said, metric)
	}
}

// vgFull: the vg-full round (faultRounds' comment); prev's 20 claims live.
// Its row: creates, deletes, recover s; and the audit.
func (s *Story) vgFull(ctx context.Context, prev string, foreign *Foreign) ([]string, Audit) {
	free := s.vgFree(ctx)
	size := free / 15 >> 22 << 22 // whole 4 MiB extents
	s.Say("vg1 free: %d bytes; 20 claims of %d MiB", free, size>>20)
	s.burst(ctx, "vg-full", fmt.Sprintf("%dMi", size>>20))
	var claims []corev1.PersistentVolumeClaim
	s.WithinFor(ctx, 15*time.Minute, "a decision on every claim of round vg-full", func(ctx context.Context) (bool, string, error) {
		var err error
		if claims, err = s.roundClaims(ctx, "vg-full"); err != nil {
			return false, err.Error(), nil
		}
		decided := 0
		for _, c := range claims {
			if c.Status.Phase == corev1.ClaimBound || c.Annotations[selectedNode] == "" && c.Annotations[reasonKey] != "" {
				decided++
			}
		}
		return decided == 20, fmt.Sprintf("%d of %d decided", decided, len(claims)), nil
	})
	lvs := s.LVs(ctx)
	var fit, refused []string
	for _, c := range claims {
		if c.Status.Phase == corev1.ClaimBound {
			fit = append(fit, c.Name)
			continue
		}
		refused = append(refused, c.Name)
		if r := c.Annotations[reasonKey]; r != "InsufficientCapacity" {
			s.Fatalf("pvc/%s answered %s, not InsufficientCapacity", c.Name, r)
		}
		if n := len(lvs.Owned(string(c.UID))); n > 0 {
			s.Fatalf("pvc/%s was refused but has %d LVs", c.Name, n)
		}
	}
	free = s.vgFree(ctx)
	s.Say("vg-full: %d Bound, %d refused; vg1 free now: %d bytes", len(fit), len(refused), free)
	switch {
	case len(fit) == 0 || len(refused) == 0:
		s.Fatalf("vg-full: all 20 claims decided alike (%d Bound)", len(fit))
	case free >= size:
		s.Fatalf("vg-full: claims refused while vg1 had room for one (%d bytes free, claims of %d)", free, size)
	}
	s.Events(ctx, refused[0], "ProvisioningFailed", "")

	s.Step("The volume group full: space freed (round "+prev+" and the claims that fit deleted), the node chosen again on the refused claims",
		"As the scheduler does once the capacity says they fit (the claims have no Pods).")
	start := time.Now()
	deleted := s.deleteRound(ctx, prev)
	var fitClaims []corev1.PersistentVolumeClaim
	for _, c := range claims {
		if slices.Contains(fit, c.Name) {
			fitClaims = append(fitClaims, c)
			s.Must(s.Kube.CoreV1().PersistentVolumeClaims(s.NS).Delete(ctx, c.Name, metav1.DeleteOptions{}), "deleting pvc/%s", c.Name)
		}
	}
	s.Show("kubectl delete pvc "+strings.Join(fit, " ")+" --wait=false", "")
	s.WithinFor(ctx, 15*time.Minute, "the PVs and LVs of round "+prev+" gone", s.roundGone(deleted))
	s.WithinFor(ctx, 15*time.Minute, "the PVs and LVs of the claims that fit gone", s.roundGone(fitClaims))
	node, err := os.Hostname()
	s.Must(err, "reading the node's name")
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, selectedNode, node)
	for _, name := range refused {
		_, err := s.Kube.CoreV1().PersistentVolumeClaims(s.NS).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		s.Must(err, "choosing the node again on pvc/%s", name)
	}
	s.Show("kubectl annotate pvc "+strings.Join(refused, " ")+" "+selectedNode+"="+node, "")
	s.WithinFor(ctx, 15*time.Minute, "the refused claims Bound", s.roundBound("vg-full", len(refused)))
	row := []string{"vg-full", "20", strconv.Itoa(20 + len(fit)), strconv.Itoa(int(time.Since(start).Seconds()))}
	return row, s.Audit(ctx, "faults", len(refused), foreign)
}

func (s *Story) vgFree(ctx context.Context) int64 {
	out, err := exec.CommandContext(ctx, "lvm", "vgs", "--noheadings", "--units", "b", "--nosuffix", "-o", "vg_free", s.VG).Output()
	s.Must(err, "lvm vgs %s", s.VG)
	free, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	s.Must(err, "reading %s's free bytes", s.VG)
	return free
}

func ptr[T any](v T) *T { return &v }
