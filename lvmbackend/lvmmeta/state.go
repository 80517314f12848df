package lvmmeta

import (
	"errors"
	"fmt"
	"slices"
)

// FoundPV is one device with an LVM label.
type FoundPV struct {
	Device string
	*PVMetadata
}

// State is every VG found on a set of devices, each at its newest
// committed seqno.
type State struct {
	VGs map[string]*VG
	PVs []FoundPV
}

// Combine picks each VG's newest committed copy among its PVs and checks
// that the VG is whole: every PV it lists was found, once. lvm commits a
// change PV by PV, so copies may differ by a seqno while a commit is in
// flight; the highest seqno is the committed state.
func Combine(pvs []FoundPV) (*State, error) {
	st := &State{VGs: map[string]*VG{}, PVs: pvs}
	byUUID := map[string]*VG{}
	crcs := map[string]uint32{}
	devs := map[string]string{}
	for _, pv := range pvs {
		if d, dup := devs[pv.Label.PVUUID]; dup {
			return nil, fmt.Errorf("%w: PV %s is on both %s and %s", ErrUnsupported, pv.Label.PVUUID, d, pv.Device)
		}
		devs[pv.Label.PVUUID] = pv.Device
		vg := pv.VG
		if vg == nil {
			continue
		}
		cur := byUUID[vg.UUID]
		switch {
		case cur == nil || vg.Seqno > cur.Seqno:
			byUUID[vg.UUID], crcs[vg.UUID] = vg, pv.textCRC
		case vg.Seqno == cur.Seqno && pv.textCRC != crcs[vg.UUID]:
			return nil, corrupt("VG "+vg.Name, "PVs hold different texts for seqno %d", vg.Seqno)
		}
	}
	for _, vg := range byUUID {
		if other, dup := st.VGs[vg.Name]; dup {
			return nil, fmt.Errorf("%w: two VGs called %s (%s, %s)", ErrUnsupported, vg.Name, vg.UUID, other.UUID)
		}
		for _, pv := range vg.PVs {
			if _, ok := devs[pv.UUID]; !ok {
				return nil, fmt.Errorf("%w: VG %s: PV %s (%s) was not found", ErrUnsupported, vg.Name, pv.UUID, pv.Device)
			}
		}
		st.VGs[vg.Name] = vg
	}
	return st, nil
}

// Supported says whether the reader can stand in for lvm on this VG:
// shared (lvmlockd) VGs and VGs owned by a system ID take locks or host
// checks that only lvm does, and an exported or partial VG is not in use.
func (vg *VG) Supported() error {
	switch {
	case vg.LockType != "" && vg.LockType != "none":
		return fmt.Errorf("%w: VG %s has lock_type %q (lvmlockd)", ErrUnsupported, vg.Name, vg.LockType)
	case vg.SystemID != "":
		return fmt.Errorf("%w: VG %s has system_id %q", ErrUnsupported, vg.Name, vg.SystemID)
	case slices.Contains(vg.Status, "EXPORTED"):
		return fmt.Errorf("%w: VG %s is exported", ErrUnsupported, vg.Name)
	case slices.Contains(vg.Flags, "PARTIAL") || slices.Contains(vg.Status, "PARTIAL"):
		return fmt.Errorf("%w: VG %s is partial", ErrUnsupported, vg.Name)
	}
	return nil
}

// VG returns a supported VG by name: a missing VG wraps ErrNoVG.
func (st *State) VG(name string) (*VG, error) {
	vg, ok := st.VGs[name]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNoVG, name)
	}
	if err := vg.Supported(); err != nil {
		return nil, err
	}
	return vg, nil
}

// ErrNoVG: no scanned device holds the VG.
var ErrNoVG = errors.New("volume group not found on the scanned devices")
