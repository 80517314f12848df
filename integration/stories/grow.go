package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Growth: a volume grows under its running Pod (a Block claim's growth is
// in demo/block).

func growExt4(ctx context.Context, s *Story) {
	s.ThickClass(ctx)
	growFS(ctx, s, thickClass, "ext4", 64, 256)
}

// xfsprogs 6 makes no xfs smaller than 300 MiB.
func growXFS(ctx context.Context, s *Story) {
	s.Class(ctx, "lvm-xfs", "vg1", "xfs", corev1.PersistentVolumeReclaimDelete)
	growFS(ctx, s, "lvm-xfs", "xfs", 320, 640)
}

// growFS: a Pod keeps appending to a log on a Filesystem claim of class
// while the claim's request goes from fromMiB to toMiB; df in the same
// running Pod sees the new size, and a file written before reads the same.
func growFS(ctx context.Context, s *Story, class, fs string, fromMiB, toMiB int) {
	s.Step(fmt.Sprintf("A volume grows under its running Pod: %s, %d MiB -> %d MiB", fs, fromMiB, toMiB),
		"The Pod keeps appending to a log while its PVC's request is raised. kube-controller-manager hands the claim",
		"to lvm-agent's provisioner, whose resizer has the node's agent extend the LV (lvmd's ResizeLV); kubelet then",
		"grows "+fs+" online. df in the same Pod shows the new size, and a file written before reads the same.")
	s.PVC(ctx, Claim{Name: "grow", Class: class, Size: fmt.Sprintf("%dMi", fromMiB)})
	s.RunPod(ctx, PodSpec{Name: "grower", Claim: "grow", Script: `head -c 4194304 /dev/urandom >/data/seed && ` +
		`md5sum /data/seed >/data/seed.md5 && sync; (i=0; while :; do echo $i >>/data/log; i=$((i+1)); sleep 0.2; done) & true`})
	s.WaitReady(ctx, "grower")
	s.Within(ctx, "/data/seed.md5 in pod/grower", func(ctx context.Context) (bool, string, error) {
		out, err := s.Exec(ctx, "grower", "cat", "/data/seed.md5")
		if err != nil {
			return false, err.Error(), nil
		}
		return strings.TrimSpace(out) != "", out, nil
	})
	pod, err := s.Kube.CoreV1().Pods(s.NS).Get(ctx, "grower", metav1.GetOptions{})
	s.Must(err, "reading pod/grower")
	seed := firstLine(s.ExecShow(ctx, "grower", "sh", "-c", "md5sum /data/seed; df -h /data"))
	v := s.Bound(ctx, "grow")

	asked := time.Now()
	to := fmt.Sprintf("%dMi", toMiB)
	s.Resize(ctx, "grow", to)
	// kubelet grows the filesystem when it syncs the Pod, then sets the
	// claim's capacity: at once, because the provisioner annotates the Pod
	// (its periodic sync is a minute away).
	s.ClaimCapacity(ctx, "grow", to)
	now, err := s.Kube.CoreV1().Pods(s.NS).Get(ctx, "grower", metav1.GetOptions{})
	s.Must(err, "reading pod/grower")
	nudge := now.Annotations["pv.csi.alibabacloud.com/volume.resize-nudge"]
	restarts := int32(-1)
	if len(now.Status.ContainerStatuses) == 1 {
		restarts = now.Status.ContainerStatuses[0].RestartCount
	}
	s.Say("The claim's capacity %s %.0f s after the request; the Pod's nudge: %s", to, time.Since(asked).Seconds(), nudge)
	if now.UID != pod.UID || restarts != 0 || nudge != "grow="+to {
		s.Fatalf("pod/grower: UID %s (was %s), %d restarts, nudge %q: want the same Pod, not restarted, nudged grow=%s",
			now.UID, pod.UID, restarts, nudge, to)
	}
	s.Kubectl(ctx, "get", "pvc", "grow")
	if lv, _ := s.LVs(ctx).Named(v.LV.Name); lv.Size != int64(toMiB)<<20 {
		s.Fatalf("LV %s is %d bytes, want %d", v.LV.Name, lv.Size, int64(toMiB)<<20)
	}
	s.Say("The same Pod (no restart): the new size, the file written before the grow unchanged, the log still growing:")
	// df -P: one line per filesystem (busybox wraps a long device-mapper name).
	out := s.ExecShow(ctx, "grower", "sh", "-c", "df -kP /data | tail -n 1; md5sum /data/seed; wc -l </data/log; sleep 1; wc -l </data/log")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		s.Fatalf("pod/grower printed %d lines, want 4: %q", len(lines), out)
	}
	// The filesystem's own overhead stays well under a fifth of the device.
	df := strings.Fields(lines[0])
	kib, _ := strconv.Atoi(field(df, 1))
	before, _ := strconv.Atoi(lines[2])
	after, _ := strconv.Atoi(lines[3])
	switch {
	case kib <= toMiB*1024*4/5:
		s.Fatalf("pod/grower's %s on /data has %d KiB after the grow to %s, want over %d", fs, kib, to, toMiB*1024*4/5)
	case lines[1] != seed:
		s.Fatalf("pod/grower's /data/seed reads %q after the grow, %q before", lines[1], seed)
	case after <= before:
		s.Fatalf("pod/grower's log did not grow in a second after the grow: %d lines, then %d", before, after)
	}
}

func firstLine(s string) string { return strings.TrimSpace(strings.SplitN(s, "\n", 2)[0]) }

func field(f []string, i int) string {
	if i < len(f) {
		return f[i]
	}
	return ""
}
