package main

import (
	"context"
	"os"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Clones, thin and thick: two sources, each with a Pod that wrote 4 MiB of
// random bytes and keeps running. A thin clone (twice the source's size) is
// made while its source's Pod writes; a thick clone asked while its
// source's Pod runs waits (SourceInUse) and is copied once that Pod is
// gone. A Pod on each clone reads the source's bytes, again after the
// sources are deleted. The classes need deploy/overlays/clones (lvmd's thin
// class in vg1/pool0, the agent's device access).

// seedScript: the seed appears whole, synced, or not at all.
const seedScript = "head -c 4194304 /dev/urandom >/data/s && sync /data/s && mv /data/s /data/seed && sync /data"

func clones(ctx context.Context, s *Story) {
	s.Step("Clones: two sources, a thin and a thick volume, each with a Pod that wrote 4 MiB and keeps running",
		"The thin class lvm-thin-ext4 is deploy/examples/storageclass-thin.yaml (the thin pool vg1/pool0) with ext4 and Delete.",
		"The thin source's Pod also keeps appending to a log.")
	s.ThickClass(ctx)
	s.Class(ctx, thinClass, "thin", "ext4", corev1.PersistentVolumeReclaimDelete)
	s.PVC(ctx, Claim{Name: "src-thin", Class: thinClass, Size: "64Mi"})
	s.RunPod(ctx, PodSpec{Name: "src-thin", Claim: "src-thin",
		Script: seedScript + "; (i=0; while :; do echo $i >>/data/log; i=$((i+1)); sleep 0.2; done) & true"})
	s.PVC(ctx, Claim{Name: "src-thick", Class: thickClass, Size: "64Mi"})
	s.RunPod(ctx, PodSpec{Name: "src-thick", Claim: "src-thick", Script: seedScript})
	s.WaitReady(ctx, "src-thin", "src-thick")
	thinSum, thickSum := s.seeded(ctx, "src-thin"), s.seeded(ctx, "src-thick")

	s.Step("A thin clone of 128 MiB while the source's Pod writes: a thin snapshot, at once",
		"The clone claim names the source in its dataSource; the provisioner places it on the source's node (ClonePlaced),",
		"the agent has lvmd make a thin snapshot owned by the clone. Larger than its source: kubelet grows its ext4 on mount.")
	s.PVC(ctx, Claim{Name: "thin-copy", Class: thinClass, Size: "128Mi", Source: "src-thin"})
	// Placed before any Pod asks for it (a Pod at once could have the
	// scheduler choose the one node first).
	s.WaitEvent(ctx, "thin-copy", "ClonePlaced", "")
	s.RunPod(ctx, PodSpec{Name: "thin-copy", Claim: "thin-copy", Script: "true"})
	s.WaitReady(ctx, "thin-copy")
	s.ClaimCapacity(ctx, "thin-copy", "128Mi")
	if got := s.seeded(ctx, "thin-copy"); got != thinSum {
		s.Fatalf("pod/thin-copy reads /data/seed as %q, its source %q", got, thinSum)
	}
	df := strings.Fields(lastLine(s.ExecShow(ctx, "thin-copy", "df", "-kP", "/data")))
	if kib, _ := strconv.Atoi(field(df, 1)); kib <= 128*1024*4/5 {
		s.Fatalf("pod/thin-copy's ext4 has %d KiB, want over %d: not grown to the clone's 128Mi", kib, 128*1024*4/5)
	}
	s.Bound(ctx, "thin-copy") // one LV of its own: lvm2 gave the snapshot no tag of its origin's
	s.Bound(ctx, "src-thin")

	s.Step("A thick clone asked while the source's Pod runs: it waits (SourceInUse), and is copied once the Pod is gone",
		"lvmd cannot snapshot a thick LV: the agent copies the source's blocks itself, only while nothing has the source",
		"open (device-mapper's open count), and verifies the copy before it answers.")
	s.PVC(ctx, Claim{Name: "thick-copy", Class: thickClass, Size: "64Mi", Source: "src-thick"})
	s.RunPod(ctx, PodSpec{Name: "thick-copy", Claim: "thick-copy", Script: "true"})
	s.WaitEvent(ctx, "thick-copy", "SourceInUse", "")
	pvc, err := s.Kube.CoreV1().PersistentVolumeClaims(s.NS).Get(ctx, "thick-copy", metav1.GetOptions{})
	s.Must(err, "reading pvc/thick-copy")
	if pvc.Status.Phase != corev1.ClaimPending {
		s.Fatalf("pvc/thick-copy is %s while its source is in use, want Pending", pvc.Status.Phase)
	}
	s.DeletePod(ctx, "src-thick")
	s.WaitReady(ctx, "thick-copy")
	s.WaitEvent(ctx, "thick-copy", "CloneCopied", "")
	if got := s.seeded(ctx, "thick-copy"); got != thickSum {
		s.Fatalf("pod/thick-copy reads /data/seed as %q, its source %q", got, thickSum)
	}
	s.Bound(ctx, "thick-copy")

	s.Step("The sources deleted: the clones keep their bytes",
		"Read again by the clones' Pods after the node's page cache is dropped.")
	s.DeletePod(ctx, "src-thin")
	s.DeletePVC(ctx, "src-thin")
	s.DeletePVC(ctx, "src-thick")
	s.Must(os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0), "dropping the node's page cache")
	s.ShowLVs(s.LVs(ctx))
	if thin, thick := s.seeded(ctx, "thin-copy"), s.seeded(ctx, "thick-copy"); thin != thinSum || thick != thickSum {
		s.Fatalf("after the sources went, thin-copy reads %q (source %q), thick-copy %q (source %q)", thin, thinSum, thick, thickSum)
	}
	s.Say("thin-copy and thick-copy read the bytes their sources had.")
}

// seeded waits for the Pod's /data/seed and returns its md5sum line.
func (s *Story) seeded(ctx context.Context, pod string) string {
	var sum string
	s.Within(ctx, "/data/seed in pod/"+pod, func(ctx context.Context) (bool, string, error) {
		out, err := s.Exec(ctx, pod, "md5sum", "/data/seed")
		if err != nil {
			return false, err.Error(), nil
		}
		sum = strings.TrimSpace(out)
		return true, sum, nil
	})
	s.Show("kubectl exec "+pod+" -- md5sum /data/seed", sum)
	return strings.Fields(sum)[0]
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
