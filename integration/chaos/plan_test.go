package chaos

import (
	"fmt"
	"math/rand"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lvm-agent/lvm-agent/agent"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

// The fake lvmd's device classes: large enough that only the "too big"
// requests run out of space.
const (
	classSize    = 1 << 40 // 1 TiB
	thinOverprov = 4
)

func classes() []lvmdfake.Class {
	return []lvmdfake.Class{
		{Name: "vg1", SizeBytes: classSize},
		{Name: "thin", VG: "vg1", SizeBytes: classSize, Thin: true, Overprovision: thinOverprov},
	}
}

// kind is what a volume's provisioner does, and so the answers it expects.
type kind int

const (
	// kindFull: created, bound to a PV (claimRef with the claim's UID), the
	// claim deleted, then the PV's volume deleted. Ends with no LV.
	kindFull kind = iota
	// kindKeep: created and still in use at the end: exactly one LV.
	kindKeep
	// kindAbandon: the claim is deleted shortly after its request, often
	// while the create is in flight. Ends with no LV: an LV made for it is
	// an orphan, for the collector.
	kindAbandon
	// kindInvalid: a hostile spec: failed/InvalidSpec.
	kindInvalid
	// kindConflict: names a foreign LV: failed/NameConflict, LV untouched.
	kindConflict
	// kindTooBig: more than the VG holds: failed/InsufficientCapacity.
	kindTooBig
	// kindProtected: a PV asks to delete a protected LV: failed/Protected.
	kindProtected
	// kindRecreate: created, the claim deleted, and a claim of the same
	// name made again, which asks for an LV of another name: created. The
	// first LV is an orphan, for the collector; the second stays.
	kindRecreate
	// kindRetry: asks for more than the VG holds (failed), then asks again
	// for a size that fits: created, one LV.
	kindRetry
	// kindRenamed: created, then asked again under another LV name:
	// failed/VolumeMismatch, and still its one first LV.
	kindRenamed
	// kindResized: created, then asked again for more than its LV holds:
	// failed/VolumeMismatch, the LV unchanged.
	kindResized
	// kindStealer: created, then a PV bound to the live claim asks for its
	// LV's deletion: failed/ClaimInUse, the LV stays.
	kindStealer
	// kindTerminating: the claim is deleted (the API server's pvc-protection
	// finalizer keeps it), then asks for a volume: failed/ClaimTerminating.
	kindTerminating
	// kindLegacy: a PV of the original agent (no ownership tag on its LV,
	// no claim left) asks for deletion; the agents run with
	// --allow-untagged-delete: deleted.
	kindLegacy
	// kindMisdirected: created, then a PV bound to the live claim, whose
	// node affinity names another node but whose volume.node label names
	// this one, asks for its LV's deletion: the label never makes an agent
	// the owner, so no agent answers, and the LV stays.
	kindMisdirected
	// kindPointer: a PV that no live claim owns (no claimRef, a claimRef
	// without a UID, or one with a gone claim's UID) asks for the deletion
	// of a live kindKeep volume's LV, once it is created: failed (ClaimInUse,
	// or NameConflict for the UID that is not the LV's), and the LV stays.
	kindPointer
	numKinds
)

var kindNames = [numKinds]string{"full", "keep", "abandon", "invalid", "conflict", "too-big", "protected",
	"recreate", "retry", "renamed", "resized", "stealer", "terminating", "legacy", "misdirected", "pointer"}

func (k kind) String() string { return kindNames[k] }

// weights of the kinds in a plan, in percent.
var kindWeights = [numKinds]int{35, 18, 7, 4, 3, 3, 3, 4, 4, 3, 3, 3, 3, 2, 2, 3}

// hostileSpecs are the specs of kindInvalid volumes.
var hostileSpecs = []string{
	`{"volumeGroup":"vg1","name":"-rf","size":4096}`,
	`{"volumeGroup":"vg1","name":"../../etc/passwd","size":4096}`,
	`{"volumeGroup":"vg1","name":"data_tmeta","size":4096}`,
	`{"volumeGroup":"vg1","name":"snapshot1","size":4096}`,
	`{"volumeGroup":"vg1","name":"ok","size":0}`,
	`{"volumeGroup":"../vg1","name":"ok","size":4096}`,
	`{"volumeGroup":"vg1","name":"ok","size":4096,"tags":["a b"]}`,
	`{"volumeGroup":"vg1","name":"ok","size":9223372036854775807}`,
	`not json`,
	`{"volumeGroup":"vg1","name":"ok","NAME":"evil","size":4096}`,
	`{"volumeGroup":"vg1","name":"ok","size":4096,"name":"evil"}`,
	`{"volumeGroup":"vg1","name":"data_cvol","size":4096}`,
}

// volume is one volume's plan and, once run, what happened to it.
type volume struct {
	i         int
	kind      kind
	ns, pvc   string
	pv        string
	class, lv string
	size      int64
	spec      string        // kindInvalid: the raw spec annotation
	start     time.Duration // after the run's start
	dwell     time.Duration // between the provisioner's steps
	target    *seededLV     // kindConflict, kindProtected: the LV named
	// oldLV is kindRecreate's first LV; again is the spec of the second
	// request of kindRetry (its first asks for tooBig), kindRenamed and
	// kindResized.
	oldLV string
	again kube.CreateSpec
	// victim is the live volume whose LV kindPointer names; ref is the
	// claimRef of its PV (nil: none).
	victim *volume
	ref    *corev1.ObjectReference

	uid types.UID
	// released is when the provisioner let go of the LV: asked for its
	// deletion (kindFull), or deleted the claim (kindAbandon). No LV of a
	// volume may be removed before.
	released time.Time
	// first is when kindRecreate's first claim was deleted; firstAnswered
	// when it was answered created (before, its LV may be made again).
	first, firstAnswered time.Time
	// err is the provisioner's own failure: a request it could not finish.
	err error
}

func (v *volume) String() string { return fmt.Sprintf("%s/%s (%s)", v.ns, v.pvc, v.kind) }

// createSpec is the spec a provisioner writes for kinds that use the helper.
func (v *volume) createSpec() kube.CreateSpec {
	return kube.CreateSpec{VolumeGroup: v.class, Name: v.lv, Size: v.size}
}

// lvSize is the size LVM gives the LV: lvmd's unit, then whole extents.
func (v *volume) lvSize() uint64 {
	s, _ := lvmbackend.RoundSize(v.size)
	return (uint64(s) + lvmdfake.ExtentSize - 1) / lvmdfake.ExtentSize * lvmdfake.ExtentSize
}

// wantCreate and wantDelete are the final answers the provisioner expects
// on the PVC and the PV ("" when it asks nothing, or cannot see the answer).
func (v *volume) wantCreate() (state, reason string) {
	switch v.kind {
	case kindFull, kindKeep, kindRecreate, kindRetry, kindStealer, kindMisdirected:
		return kube.StateCreated, ""
	case kindRenamed, kindResized:
		return kube.StateFailed, kube.ReasonVolumeMismatch
	case kindTerminating:
		return kube.StateFailed, kube.ReasonClaimTerminating
	case kindInvalid:
		return kube.StateFailed, kube.ReasonInvalidSpec
	case kindConflict:
		return kube.StateFailed, kube.ReasonNameConflict
	case kindTooBig:
		return kube.StateFailed, kube.ReasonInsufficientCapacity
	}
	return "", ""
}

func (v *volume) wantDelete() (state, reason string) {
	switch v.kind {
	case kindFull, kindLegacy:
		return kube.StateDeleted, ""
	case kindProtected:
		return kube.StateFailed, kube.ReasonProtected
	case kindStealer:
		return kube.StateFailed, kube.ReasonClaimInUse
	case kindPointer:
		if v.ref != nil && v.ref.UID != "" {
			return kube.StateFailed, kube.ReasonNameConflict
		}
		return kube.StateFailed, kube.ReasonClaimInUse
	}
	return "", ""
}

// keeps reports whether the volume ends with exactly its one LV v.lv,
// which nothing may ever remove.
func (v *volume) keeps() bool {
	switch v.kind {
	case kindKeep, kindRecreate, kindRetry, kindRenamed, kindResized, kindStealer, kindMisdirected:
		return true
	}
	return false
}

// seededLV is an LV made before the run: outside the agent's ownership
// (foreign), or ours but protected. Neither may change.
type seededLV struct {
	class, name string
	size        uint64
	tags        []string
}

func seededLVs() (foreign, protected []*seededLV) {
	foreignTags := [][]string{nil, {"made-by-hand"}, {"app=db", "team:storage"}, {"lvm-agent.pvcx"},
		{agent.OwnerTagPrefix}, {"lvm-agent.orphan"}}
	for i, tags := range foreignTags {
		class := []string{"vg1", "thin"}[i%2]
		foreign = append(foreign, &seededLV{class: class, name: fmt.Sprintf("foreign-%d", i), size: 8 << 20, tags: tags})
	}
	for i := 0; i < 4; i++ {
		protected = append(protected, &seededLV{class: "vg1", name: fmt.Sprintf("protected-%d", i), size: 4 << 20,
			tags: []string{agent.OwnerTag(types.UID(fmt.Sprintf("ghost-%d", i))), agent.ProtectedTag}})
	}
	return foreign, protected
}

// makePlan draws n volumes in overlapping waves. The same seed gives the
// same plan: kinds, names, sizes, classes and start times.
func makePlan(rng *rand.Rand, n int, waveGap time.Duration, foreign, protected []*seededLV) []*volume {
	waveSize := max(1, (n+9)/10) // ten waves
	vols := make([]*volume, 0, n)
	for i := 0; i < n; i++ {
		v := &volume{i: i, kind: drawKind(rng, i),
			ns: fmt.Sprintf("chaos-%d", i%5), pvc: fmt.Sprintf("vol-%04d", i), pv: fmt.Sprintf("pv-chaos-%04d", i),
			class: []string{"vg1", "thin"}[rng.Intn(2)], lv: fmt.Sprintf("chaos-%04d", i),
			size:  int64(1+rng.Intn(64)) << 20,
			start: time.Duration(i/waveSize)*waveGap + time.Duration(rng.Int63n(int64(waveGap))),
			dwell: time.Duration(rng.Intn(400)) * time.Millisecond,
		}
		switch v.kind {
		case kindInvalid:
			v.spec = hostileSpecs[rng.Intn(len(hostileSpecs))]
		case kindConflict:
			v.target = foreign[rng.Intn(len(foreign))]
			v.class, v.lv = v.target.class, v.target.name
		case kindTooBig:
			v.class, v.size = "vg1", 2*classSize
		case kindProtected:
			v.target = protected[rng.Intn(len(protected))]
			v.class, v.lv = v.target.class, v.target.name
		case kindRecreate:
			v.oldLV = v.lv + "-old"
		case kindRetry:
			v.again = v.createSpec()
		case kindRenamed:
			v.again = v.createSpec()
			v.again.Name = v.lv + "-renamed"
		case kindResized:
			v.again = v.createSpec()
			v.again.Size = int64(v.lvSize()) + 1
		case kindLegacy:
			v.class, v.lv = "vg1", fmt.Sprintf("legacy-%04d", i)
		}
		vols = append(vols, v)
	}
	var keep []*volume
	for _, v := range vols {
		if v.kind == kindKeep {
			keep = append(keep, v)
		}
	}
	for _, v := range vols {
		if v.kind != kindPointer {
			continue
		}
		v.victim = keep[rng.Intn(len(keep))] // drawKind makes volume 1 a kindKeep
		v.class, v.lv = v.victim.class, v.victim.lv
		gone := fmt.Sprintf("gone-claim-%d", v.i)
		v.ref = []*corev1.ObjectReference{nil, {Namespace: v.ns, Name: gone},
			{Namespace: v.ns, Name: gone, UID: types.UID(gone + "-uid")}}[rng.Intn(3)]
	}
	return vols
}

// drawKind gives the first volumes one of each kind, so that even a short
// run covers them all, then draws by weight.
func drawKind(rng *rand.Rand, i int) kind {
	if i < int(numKinds) {
		return kind(i)
	}
	n := rng.Intn(100)
	for k, w := range kindWeights {
		if n < w {
			return kind(k)
		}
		n -= w
	}
	return kindFull
}
