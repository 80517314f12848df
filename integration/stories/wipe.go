package main

import (
	"context"
	"fmt"
	"regexp"
	"strconv"

	corev1 "k8s.io/api/core/v1"
)

// The wipe story (issue 64): a deleted volume's bytes never show in a
// volume made after it, on a Block claim that reads its device raw. A thick
// LV's extents keep whatever was written to them, so lvm-agent zeroes a
// thick LV before its extents go back to the volume group, and zeroes a
// thick clone's tail beyond its source's size; a thin pool hands out zeroed
// blocks. Each check is made where the new volume is on the old one's
// extents, or the story says it cannot tell.
//
// The classes: lvm-thick (deploy/examples) and lvm-thin-ext4 (lvmd's device
// class "thin", as the clone story makes it).

const (
	thickClass = "lvm-thick"
	thinClass  = "lvm-thin-ext4"
)

func wipeThick(ctx context.Context, s *Story) {
	wipeAgain(ctx, s, thickClass, "wipe-a", "wipe-b", 32)
}

func wipeThin(ctx context.Context, s *Story) {
	wipeAgain(ctx, s, thinClass, "wipe-thin-a", "wipe-thin-b", 16)
}

// wipeAgain: a volume filled with markers and deleted, then a new one of
// the same size and class, read whole: 0 markers. Small volumes: under
// emulation each MiB filled and read costs seconds (a thin pool's most).
func wipeAgain(ctx context.Context, s *Story, class, first, second string, mib int64) {
	size := fmt.Sprintf("%dMi", mib)
	if class == thinClass {
		s.Class(ctx, thinClass, "thin", "ext4", corev1.PersistentVolumeReclaimDelete)
	} else {
		s.ThickClass(ctx)
	}
	s.Step(fmt.Sprintf("A Block PVC %s of %s in %s: its Pod fills the whole device with markers", first, size, class),
		fmt.Sprintf("Each marker is %q, 16 bytes. The node counts them on the LV the PV names and reads where its extents are.", marker))
	s.BlockPVC(ctx, first, class, size, "")
	s.Pod(ctx, first, first, fillScript)
	s.PodOutput(ctx, first)
	old := s.Bound(ctx, first)
	written, _ := s.NodeMarkers(old.Device)
	if written == 0 {
		s.Fatalf("pvc/%s: 0 markers on %s (LV %s) after its Pod filled it: the fill did not reach the LV", first, old.Device, old.LV.Name)
	}

	s.Step("The Pod and the PVC deleted: the PV and the LV go",
		"The LV's extents (thick) or its blocks of the pool (thin) are free for the next volume.")
	s.DeletePod(ctx, first)
	s.DeletePVC(ctx, first)
	s.ShowLVs(s.LVs(ctx))

	s.Step(fmt.Sprintf("A new Block PVC %s of the same size and class: its Pod reads the whole device", second),
		"It must find none of the markers. A thick LV's extents are compared with the deleted one's: the check",
		"means something where they overlap.")
	s.BlockPVC(ctx, second, class, size, "")
	s.Pod(ctx, second, second, countScript("device", 0))
	out := s.PodOutput(ctx, second)
	now := s.Bound(ctx, second)
	read, ok := parseCounts(out)["device"]
	if !ok {
		s.Fatalf("pod/%s printed no count of markers: %q", second, out)
	}
	onNode, _ := s.NodeMarkers(now.Device)
	thick := class == thickClass
	reused := "thin: blocks of the pool, no extents of its own"
	if thick {
		reused = fmt.Sprintf("%d of %d extents reused (LV %s on %v, LV %s on %v)", overlap(old.LV.Extents, now.LV.Extents),
			count(now.LV.Extents), old.LV.Name, old.LV.Extents, now.LV.Name, now.LV.Extents)
	}
	fmt.Fprintf(s.out, "wipe: %s: %d markers written to %s; %s's Pod read %d MiB: %d markers (the node: %d); %s\n",
		class, written, first, second, read.mib, read.markers, onNode, reused)
	switch {
	case read.markers > 0 || onNode > 0:
		s.Fatalf("pvc/%s (LV %s) shows %d markers of the deleted pvc/%s (the node reads %d): its bytes were not wiped",
			second, now.LV.Name, read.markers, first, onNode)
	case read.mib != mib:
		s.Fatalf("pod/%s read %d MiB of its device, want %d", second, read.mib, mib)
	case thick && overlap(old.LV.Extents, now.LV.Extents) == 0:
		s.Fatalf("LV %s (pvc/%s) is on %v, none of LV %s's %v: 0 markers proves nothing", now.LV.Name, second,
			now.LV.Extents, old.LV.Name, old.LV.Extents)
	}
}

// wipeClone: a thick clone larger than its source, its tail on extents
// left dirty by an LV that is not lvm-agent's: the tail reads zeros.
func wipeClone(ctx context.Context, s *Story) {
	const source, dirtyLV = "lvm-agent clone source", "wipe-dirty"
	s.ThickClass(ctx)
	s.Step("A source: a Block PVC wipe-src of 16Mi in "+thickClass+"; its Pod zeroes the device and writes a line at its start",
		"The Pod is deleted then: a thick clone is copied only while no Pod uses its source.")
	s.BlockPVC(ctx, "wipe-src", thickClass, "16Mi", "")
	s.Pod(ctx, "wipe-src", "wipe-src", `n=$(blockdev --getsize64 /dev/xvda) && head -c "$n" /dev/zero >/dev/xvda && `+
		`echo '`+source+`' | dd of=/dev/xvda conv=notrunc 2>/dev/null && sync && echo "zeroed $n bytes, then a line at the start"`)
	s.PodOutput(ctx, "wipe-src")
	s.Bound(ctx, "wipe-src")
	s.DeletePod(ctx, "wipe-src")

	s.Step("Dirty extents: an LV that is not lvm-agent's, made by hand, filled with markers, removed without a wipe",
		"Made after the source, so where the clone will go next: its tail, beyond the source's 16Mi, lands on them.")
	s.Cleanup(func(ctx context.Context) {
		if _, ok := s.LVs(ctx).Named(dirtyLV); ok {
			s.Lvm(ctx, "lvremove", "-y", s.VG+"/"+dirtyLV)
		}
	})
	s.Lvm(ctx, "lvcreate", "-y", "-L", "32m", "-n", dirtyLV, s.VG)
	lvs := s.LVs(ctx)
	dirty, ok := lvs.Named(dirtyLV)
	if !ok || len(dirty.Extents) == 0 {
		s.Fatalf("LV %s/%s: not listed, or without extents, after lvcreate", s.VG, dirtyLV)
	}
	s.ShowLVs(lvs)
	s.NodeFill("/dev/" + s.VG + "/" + dirtyLV)
	filled, _ := s.NodeMarkers("/dev/" + s.VG + "/" + dirtyLV)
	s.Lvm(ctx, "lvremove", "-y", s.VG+"/"+dirtyLV)

	s.Step("A clone wipe-clone of 32Mi of the 16Mi source: the source's bytes, then zeros",
		"lvm-agent copies the source's 16Mi and must zero the rest. Its Pod reads the start, the whole device and the tail.")
	s.BlockPVC(ctx, "wipe-clone", thickClass, "32Mi", "wipe-src")
	s.Pod(ctx, "wipe-clone", "wipe-clone", fmt.Sprintf(`echo "head: $(head -c %d /dev/xvda)"; `, len(source))+
		countScript("device", 0)+"; "+countScript("tail", 16))
	out := s.PodOutput(ctx, "wipe-clone")
	clone := s.Bound(ctx, "wipe-clone")
	counts := parseCounts(out)
	whole, ok1 := counts["device"]
	tail, ok2 := counts["tail"]
	head := regexp.MustCompile(`(?m)^head: (.*)$`).FindStringSubmatch(out)
	if !ok1 || !ok2 || head == nil {
		s.Fatalf("pod/wipe-clone printed no head line or no count of markers: %q", out)
	}
	onNode, _ := s.NodeMarkers(clone.Device)
	tailExtents := skip(clone.LV.Extents, (16<<20)/clone.LV.ExtentSize)
	reused := overlap(tailExtents, dirty.Extents)
	fmt.Fprintf(s.out, "wipe: clone: %d markers written to LV %s; wipe-clone's Pod read %d MiB: %d markers, %d in the %d MiB "+
		"beyond the source's 16 (the node: %d); %d of the tail's %d extents were %s's (tail %v, %s on %v); starts %s\n",
		filled, dirtyLV, whole.mib, whole.markers, tail.markers, tail.mib, onNode, reused, count(tailExtents), dirtyLV,
		tailExtents, dirtyLV, dirty.Extents, strconv.Quote(head[1]))
	switch {
	case whole.markers > 0 || tail.markers > 0 || onNode > 0:
		s.Fatalf("pvc/wipe-clone (LV %s) shows %d markers (%d in its tail; the node reads %d) of LV %s: its tail was not zeroed",
			clone.LV.Name, whole.markers, tail.markers, onNode, dirtyLV)
	case whole.mib != 32 || tail.mib != 16:
		s.Fatalf("pod/wipe-clone read %d MiB of its device and %d of its tail, want 32 and 16", whole.mib, tail.mib)
	case reused == 0:
		s.Fatalf("the tail of LV %s (pvc/wipe-clone) is on %v, none of LV %s's %v: 0 markers proves nothing",
			clone.LV.Name, tailExtents, dirtyLV, dirty.Extents)
	case head[1] != source:
		s.Fatalf("pvc/wipe-clone starts with %q, want its source's %q", head[1], source)
	}
}
