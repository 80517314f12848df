package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The encryption story: a Filesystem and a Block claim of
// deploy/examples/storageclass-encrypted.yaml, its key made as
// docs/install.md says. What a Pod writes is found through the volume's
// mapping and never on the raw LV; cryptsetup reads the header lvm-agent
// wrote, and opens a copy of the disk with the class's key; the claims'
// data outlives their Pods and a grow; and once the claims are deleted,
// the extents their LVs had hold no header that any key opens, and no
// marker.

const (
	cryptClass  = "lvm-encrypted"
	cryptSecret = "lvm-class-key"
)

func cryptVolumes(ctx context.Context, s *Story) {
	s.Step("A random key in a Secret, and an encrypted class",
		"The Secret is the one deploy/examples/storageclass-encrypted.yaml names: 64 random bytes, made as docs/install.md says.",
		"The key unlocks each volume's keyslot; every volume has its own random volume key.")
	keyFile := cryptKey(ctx, s)
	s.Kubectl(ctx, "apply", "-f", s.Deploy+"/examples/storageclass-encrypted.yaml")

	s.Step("A Filesystem PVC crypt-fs of 64Mi and a Block PVC crypt-blk of 16Mi, each filled with markers by its Pod",
		fmt.Sprintf("Each marker is %q, 16 bytes: the node counts them through the volume's mapping and on the raw LV.", marker))
	s.PVC(ctx, Claim{Name: "crypt-fs", Class: cryptClass, Size: "64Mi"})
	s.RunPod(ctx, PodSpec{Name: "crypt-writer", Claim: "crypt-fs", Script: `/bin/busybox yes '` + markerLine +
		`' | head -c 4194304 >/data/markers && md5sum /data/markers >/data/markers.md5 && sync`})
	s.BlockPVC(ctx, "crypt-blk", cryptClass, "16Mi", "")
	s.Pod(ctx, "crypt-blk", "crypt-blk", fillScript)
	s.PodOutput(ctx, "crypt-blk")
	s.WaitReady(ctx, "crypt-writer")
	s.Within(ctx, "/data/markers.md5 in pod/crypt-writer", func(ctx context.Context) (bool, string, error) {
		out, err := s.Exec(ctx, "crypt-writer", "cat", "/data/markers.md5")
		if err != nil {
			return false, err.Error(), nil
		}
		return strings.HasSuffix(strings.TrimSpace(out), "/data/markers"), out, nil
	})
	sum := firstLine(s.ExecShow(ctx, "crypt-writer", "md5sum", "/data/markers"))

	fs, blk := s.Bound(ctx, "crypt-fs"), s.Bound(ctx, "crypt-blk")
	for _, v := range []Volume{fs, blk} {
		raw := "/dev/" + s.VG + "/" + v.LV.Name
		if !strings.HasPrefix(v.Device, "/dev/mapper/luks-") {
			s.Fatalf("pv/%s of pvc/%s names %s, want its mapping /dev/mapper/luks-…", v.PV, v.Claim, v.Device)
		}
		mapped, _ := s.NodeMarkers(v.Device)
		onLV, _ := s.NodeMarkers(raw)
		fmt.Fprintf(s.out, "crypt: pvc/%s: %d markers through its mapping %s, %d on its raw LV %s\n", v.Claim, mapped, v.Device, onLV, raw)
		if mapped == 0 || onLV != 0 {
			s.Fatalf("pvc/%s: %d markers through %s and %d on the raw LV %s: want some, and none", v.Claim, mapped, v.Device, onLV, raw)
		}
	}

	s.Step("cryptsetup reads the header lvm-agent wrote, and opens a copy of the disk with the class's key",
		"The copy is the raw LV, as a disk that leaves the node would hold it; cryptsetup maps it through a loop device.")
	raw := "/dev/" + s.VG + "/" + blk.LV.Name
	s.Run(ctx, "cryptsetup", "luksDump", raw)
	img := filepath.Join(os.TempDir(), "crypt-blk.img")
	s.Cleanup(func(context.Context) { os.Remove(img) })
	s.Run(ctx, "dd", "if="+raw, "of="+img, "bs=1M", "status=none")
	s.Run(ctx, "cryptsetup", "open", "--readonly", "--key-file", keyFile, img, "crypt-check")
	s.Cleanup(func(ctx context.Context) {
		if _, err := os.Stat("/dev/mapper/crypt-check"); err == nil {
			s.RunMay(ctx, "cryptsetup", "close", "crypt-check")
		}
	})
	viaCryptsetup, _ := s.NodeMarkers("/dev/mapper/crypt-check")
	viaAgent, _ := s.NodeMarkers(blk.Device)
	fmt.Fprintf(s.out, "crypt: the copy of pvc/crypt-blk's LV opened by cryptsetup: %d markers (lvm-agent's mapping: %d)\n", viaCryptsetup, viaAgent)
	if viaCryptsetup != viaAgent {
		s.Fatalf("cryptsetup reads %d markers in the copy, lvm-agent's mapping %d", viaCryptsetup, viaAgent)
	}
	s.Run(ctx, "cryptsetup", "close", "crypt-check")

	s.Step("The Filesystem claim grows to 96Mi under its running Pod, and the data outlives its Pods",
		"The LV grows, then the mapping, then kubelet's ext4, online; then the Pods are deleted and made again.")
	s.Resize(ctx, "crypt-fs", "96Mi")
	s.ClaimCapacity(ctx, "crypt-fs", "96Mi")
	s.DeletePod(ctx, "crypt-writer")
	s.DeletePod(ctx, "crypt-blk")
	s.RunPod(ctx, PodSpec{Name: "crypt-reader", Claim: "crypt-fs", Script: "true"})
	s.WaitReady(ctx, "crypt-reader")
	if got := firstLine(s.ExecShow(ctx, "crypt-reader", "md5sum", "/data/markers")); got != sum {
		s.Fatalf("pod/crypt-reader reads %q, the first Pod wrote %q", got, sum)
	}
	df := s.ExecShow(ctx, "crypt-reader", "sh", "-c", "df -kP /data | tail -n 1")
	if f := strings.Fields(df); len(f) < 2 || atoi(f[1]) < 90000 {
		s.Fatalf("pod/crypt-reader: df says %q, want about 96 MiB (over 90000 KiB)", df)
	}
	s.Pod(ctx, "crypt-blk-again", "crypt-blk", countScript("device", 0))
	again := parseCounts(s.PodOutput(ctx, "crypt-blk-again"))["device"]
	fmt.Fprintf(s.out, "crypt: pvc/crypt-blk read again by a new Pod: %d markers in %d MiB (written: %d)\n", again.markers, again.mib, viaAgent)
	if again.markers != viaAgent {
		s.Fatalf("a new Pod reads %d markers on pvc/crypt-blk, %d were written", again.markers, viaAgent)
	}

	s.Step("The claims deleted: nothing on their extents opens, and no marker is left",
		"The delete destroys the header's keyslots and both header copies before the LV goes (wipe: none: no zeroing).",
		"An LV made by hand on each deleted LV's extents, untouched by lvcreate (-Zn -Wn), is what a copy of the disk holds now.")
	s.DeletePod(ctx, "crypt-reader")
	s.DeletePod(ctx, "crypt-blk-again")
	s.DeletePVC(ctx, "crypt-fs")
	s.DeletePVC(ctx, "crypt-blk")
	for _, v := range []Volume{fs, blk} {
		old := "crypt-old-" + v.Claim
		s.Cleanup(func(ctx context.Context) {
			if _, ok := s.LVs(ctx).Named(old); ok {
				s.Lvm(ctx, "lvremove", "-y", s.VG+"/"+old)
			}
		})
		args := []string{"lvcreate", "-y", "-Zn", "-Wn", "-l", fmt.Sprint(count(v.LV.Extents)), "-n", old, s.VG}
		for _, e := range v.LV.Extents {
			args = append(args, e.String())
		}
		s.Lvm(ctx, args...)
		dev := "/dev/" + s.VG + "/" + old
		n, _ := s.NodeMarkers(dev)
		_, dumpErr := s.RunMay(ctx, "cryptsetup", "luksDump", dev)
		_, openErr := s.RunMay(ctx, "cryptsetup", "open", "--test-passphrase", "--key-file", keyFile, dev)
		fmt.Fprintf(s.out, "crypt: pvc/%s deleted: its extents (%v) hold %d markers; cryptsetup luksDump: %v; open with the class's key: %v\n",
			v.Claim, v.LV.Extents, n, errText(dumpErr), errText(openErr))
		if n != 0 || dumpErr == nil || openErr == nil {
			s.Fatalf("the extents of deleted pvc/%s: %d markers, luksDump %v, open %v: want 0 and both refused", v.Claim, n, errText(dumpErr), errText(openErr))
		}
		s.Lvm(ctx, "lvremove", "-y", s.VG+"/"+old)
	}
}

func atoi(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

func errText(err error) string {
	if err == nil {
		return "succeeded"
	}
	return "refused (" + err.Error() + ")"
}
