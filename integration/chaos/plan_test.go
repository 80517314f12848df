package chaos

import (
	"fmt"
	"math/rand"
	"time"

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
	numKinds
)

var kindNames = [numKinds]string{"full", "keep", "abandon", "invalid", "conflict", "too-big", "protected"}

func (k kind) String() string { return kindNames[k] }

// weights of the kinds in a plan, in percent.
var kindWeights = [numKinds]int{52, 25, 8, 5, 4, 3, 3}

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

	uid types.UID
	// released is when the provisioner let go of the LV: asked for its
	// deletion (kindFull), or deleted the claim (kindAbandon). No LV of a
	// volume may be removed before.
	released time.Time
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
	case kindFull, kindKeep:
		return kube.StateCreated, ""
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
	case kindFull:
		return kube.StateDeleted, ""
	case kindProtected:
		return kube.StateFailed, kube.ReasonProtected
	}
	return "", ""
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
		}
		vols = append(vols, v)
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
