package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// make bench-crypt: what encryption costs, beside a plain class that is the
// same otherwise (thick LVs in vg1, wipe: none). Rounds alternate plain and
// encrypted: a Block claim and its Pod created together, timed to Bound
// (the provisioner's request, the agent's lvcreate, header and mapping,
// the PV) and to the Pod's end; the Pod writes its device whole with
// direct I/O, and dd's rate is the sequential write throughput. After the
// rounds, with the encrypted volumes still open, the agent's RSS at rest.

const plainNoWipe = "lvm-plain-nowipe"

func benchCrypt(ctx context.Context, s *Story) {
	const rounds, size = 4, 64
	cryptKey(ctx, s)
	s.Kubectl(ctx, "apply", "-f", s.Deploy+"/examples/storageclass-encrypted.yaml")
	wait, grow, reclaim := storagev1.VolumeBindingWaitForFirstConsumer, true, corev1.PersistentVolumeReclaimDelete
	_, err := s.Kube.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: plainNoWipe}, Provisioner: "lvm.lvm-agent.io", VolumeBindingMode: &wait,
		AllowVolumeExpansion: &grow, ReclaimPolicy: &reclaim, Parameters: map[string]string{"volumeGroup": "vg1", "fsType": "ext4", "wipe": "none"},
	}, metav1.CreateOptions{})
	s.Must(err, "creating storageclass/%s", plainNoWipe)
	s.Cleanup(func(ctx context.Context) {
		s.Kube.StorageV1().StorageClasses().Delete(ctx, plainNoWipe, metav1.DeleteOptions{})
	})
	s.Show("kubectl apply -f "+plainNoWipe+".yaml   # storageclass-encrypted.yaml without its encryption", "storageclass.storage.k8s.io/"+plainNoWipe+" created")

	// The agent at rest before any encrypted volume, for the row below.
	before := agentRSS()
	s.Step(fmt.Sprintf("%d rounds: a Block claim of %dMi and its Pod, plain then encrypted", rounds, size),
		"Each Pod writes its whole device once, direct I/O, 1 MiB blocks: dd's rate is the throughput.")
	bound := map[string][]float64{}
	rate := map[string][]float64{}
	for i := range rounds {
		for _, class := range []string{plainNoWipe, cryptClass} {
			name := fmt.Sprintf("bench-%s-%d", map[string]string{plainNoWipe: "plain", cryptClass: "crypt"}[class], i)
			start := time.Now()
			s.BlockPVC(ctx, name, class, fmt.Sprintf("%dMi", size), "")
			s.Pod(ctx, name, name, fmt.Sprintf("/bin/busybox time dd if=/dev/zero of=/dev/xvda bs=1M count=%d oflag=direct 2>&1", size))
			s.Within(ctx, "pvc/"+name+" Bound", func(ctx context.Context) (bool, string, error) {
				pvc, err := s.Kube.CoreV1().PersistentVolumeClaims(s.NS).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return false, err.Error(), nil
				}
				return pvc.Status.Phase == corev1.ClaimBound, string(pvc.Status.Phase), nil
			})
			bound[class] = append(bound[class], time.Since(start).Seconds())
			out := s.PodOutput(ctx, name)
			secs, ok := ddSeconds(out)
			if !ok {
				s.Fatalf("pod/%s: no dd summary in %q", name, out)
			}
			rate[class] = append(rate[class], float64(size)/secs)
		}
	}
	s.Say("lvm-agent's own RSS at rest, %d encrypted volumes open, after 20 s:", rounds)
	time.Sleep(20 * time.Second) // at rest is a span of time, not an event
	rss := agentRSS()

	fmt.Fprintf(s.out, "\nbench-crypt: %d rounds, %d MiB Block claims, thick LVs in vg1 (medians; each round's figures in brackets)\n", rounds, size)
	fmt.Fprintf(s.out, "| | plain | encrypted | encrypted ÷ plain |\n|---|---:|---:|---:|\n")
	bp, bc := median(bound[plainNoWipe]), median(bound[cryptClass])
	fmt.Fprintf(s.out, "| PVC and Pod created → Bound, s | %.1f %v | %.1f %v | %.2f |\n", bp, round1(bound[plainNoWipe]), bc, round1(bound[cryptClass]), bc/bp)
	rp, rc := median(rate[plainNoWipe]), median(rate[cryptClass])
	fmt.Fprintf(s.out, "| sequential write in the Pod, MiB/s | %.1f %v | %.1f %v | %.2f |\n", rp, round1(rate[plainNoWipe]), rc, round1(rate[cryptClass]), rc/rp)
	fmt.Fprintf(s.out, "| lvm-agent RSS at rest, MiB (before the rounds; after them, %d encrypted volumes open) | %.1f | %.1f | %.2f |\n", rounds, before, rss, rss/before)
	fmt.Fprintf(s.out, "CPU: %s\n", cpuModel())

	s.Step("The claims deleted")
	for i := range rounds {
		for _, kind := range []string{"plain", "crypt"} {
			name := fmt.Sprintf("bench-%s-%d", kind, i)
			s.DeletePod(ctx, name)
			s.DeletePVC(ctx, name)
		}
	}
}

// cryptKey makes the encrypted example class's Secret, a random key, as
// docs/install.md says, and returns the key's file (removed at the end).
func cryptKey(ctx context.Context, s *Story) string {
	keyFile := filepath.Join(os.TempDir(), "lvm-class-key")
	s.Run(ctx, "sh", "-c", "head -c 64 /dev/urandom >"+keyFile)
	s.Cleanup(func(context.Context) { os.Remove(keyFile) })
	s.Kubectl(ctx, "-n", "lvm-agent", "create", "secret", "generic", cryptSecret, "--from-file=key="+keyFile)
	s.Cleanup(func(ctx context.Context) {
		s.Kubectl(ctx, "-n", "lvm-agent", "delete", "secret", cryptSecret, "--ignore-not-found")
	})
	return keyFile
}

// ddSeconds reads the real time busybox's time printed for the dd
// ("real\t0m 1.23s"; busybox's dd prints no rate of its own).
func ddSeconds(out string) (float64, bool) {
	m := regexp.MustCompile(`real\s+(?:(\d+)m\s*)?([0-9.]+)s`).FindStringSubmatch(out)
	if m == nil {
		return 0, false
	}
	mins, _ := strconv.ParseFloat(m[1], 64)
	secs, err := strconv.ParseFloat(m[2], 64)
	v := mins*60 + secs
	return v, err == nil && v > 0
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	w := slices.Clone(v)
	slices.Sort(w)
	if n := len(w); n%2 == 0 {
		return (w[n/2-1] + w[n/2]) / 2
	}
	return w[len(w)/2]
}

func round1(v []float64) []string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = strconv.FormatFloat(x, 'f', 1, 64)
	}
	return out
}

// agentRSS is the node agent's resident memory in MiB: the lvm-agent
// process with --lvmd-socket (the provisioner runs the same binary
// without it), read from /proc.
func agentRSS() float64 {
	for _, pid := range nodeProcs("lvm-agent", "--lvmd-socket") {
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for _, l := range bytes.Split(status, []byte("\n")) {
			if f := strings.Fields(string(l)); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				return kb / 1024
			}
		}
	}
	return 0
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	model, aes := "?", "no AES instructions"
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			model = strings.TrimSpace(v)
		}
		if strings.HasPrefix(l, "flags") && slices.Contains(strings.Fields(l), "aes") {
			aes = "AES instructions"
		}
	}
	return model + ", " + aes
}
