package devmapper

import (
	"strings"
)

// StripedStatus is the status line of a striped target:
//
//	<#stripes> <dev>... 1 <health>
//
// where health has one character per stripe, 'A' (alive) or 'D' (the kernel
// has seen I/O errors on it). LVM uses striped for LVs with -i > 1.
type StripedStatus struct {
	// Devices are the stripes' devices as "major:minor".
	Devices []string
	// Alive[i] is false when stripe i has seen I/O errors.
	Alive []bool
}

// TargetType implements TargetStatus.
func (StripedStatus) TargetType() string { return "striped" }

// Degraded reports whether any stripe has seen I/O errors.
func (s StripedStatus) Degraded() bool {
	for _, a := range s.Alive {
		if !a {
			return true
		}
	}
	return false
}

// ParseStripedStatus parses the status params of a striped target.
func ParseStripedStatus(params string) (StripedStatus, error) {
	const target = "striped"
	f := strings.Fields(params)
	// The shortest valid line is "1 <dev> 1 A".
	if len(f) < 4 {
		return StripedStatus{}, invalidStatus(target, "%d fields, want at least 4", len(f))
	}
	n, err := parseUint(target, "stripe count", f[0])
	if err != nil {
		return StripedStatus{}, err
	}
	// Compare before converting so a huge count cannot size anything.
	if n != uint64(len(f)-3) {
		return StripedStatus{}, invalidStatus(target, "%d stripes in %d fields", n, len(f))
	}
	stripes := int(n)
	if f[stripes+1] != "1" {
		return StripedStatus{}, invalidStatus(target, "status group count %q, want 1", f[stripes+1])
	}
	health := f[stripes+2]
	if len(health) != stripes {
		return StripedStatus{}, invalidStatus(target, "health %q for %d stripes", health, stripes)
	}
	s := StripedStatus{
		Devices: append([]string(nil), f[1:stripes+1]...),
		Alive:   make([]bool, stripes),
	}
	for i := 0; i < stripes; i++ {
		switch health[i] {
		case 'A':
			s.Alive[i] = true
		case 'D':
		default:
			return StripedStatus{}, invalidStatus(target, "health %q: want A or D", health)
		}
	}
	return s, nil
}
