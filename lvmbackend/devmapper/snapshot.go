package devmapper

import (
	"context"
	"fmt"
	"strings"
)

// DevNum is a block device's major:minor.
type DevNum struct{ Major, Minor uint32 }

func (n DevNum) String() string { return fmt.Sprintf("%d:%d", n.Major, n.Minor) }

// DeviceState is what device-mapper says about one device.
type DeviceState struct {
	Name      string // device-mapper name, e.g. "vg0-pvc--1a2b" (LVM doubles dashes)
	State     string // active, suspended or inactive
	OpenCount int32
	// ThinPool is set for a thin-pool target (LVM's "-tpool" layer).
	ThinPool *ThinPoolStatus
	// Thin is set for a thin volume; Pool is its pool's device.
	Thin *ThinStatus
	Pool DevNum
}

// PoolProblems lists what is wrong with a thin pool, in the words of the
// lvm_agent_dm_device_state metric: failed, ro, out_of_data_space,
// needs_check. None for a healthy pool or a device that is not a pool.
func (s DeviceState) PoolProblems() []string {
	p := s.ThinPool
	switch {
	case p == nil:
		return nil
	case p.State != StateOK:
		return []string{"failed"}
	}
	var out []string
	if p.Mode != "" && p.Mode != PoolModeReadWrite {
		out = append(out, string(p.Mode))
	}
	if p.NeedsCheck {
		out = append(out, "needs_check")
	}
	return out
}

// Snapshot reads the state of every device: one list, one status query per
// device and, for each thin volume, one table query for the device of its
// pool.
func (c *Control) Snapshot(ctx context.Context) (map[DevNum]DeviceState, error) {
	all, err := c.StatusAll(ctx)
	if err != nil {
		return nil, err
	}
	pools := map[string]DevNum{}
	for _, s := range all {
		if len(s.Targets) == 1 && s.Targets[0].Type == "thin" {
			if t, err := c.Table(ctx, s.Info.Name); err == nil && len(t.Targets) == 1 {
				if pool, err := thinPool(t.Targets[0].Params); err == nil {
					pools[s.Info.Name] = pool
				}
			}
		}
	}
	return deviceStates(all, pools), nil
}

// deviceStates turns statuses into DeviceStates; pools gives the pool
// device of each thin volume by name.
func deviceStates(all []DeviceStatus, pools map[string]DevNum) map[DevNum]DeviceState {
	out := make(map[DevNum]DeviceState, len(all))
	for _, s := range all {
		st := DeviceState{Name: s.Info.Name, State: "active", OpenCount: s.Info.OpenCount, Pool: pools[s.Info.Name]}
		switch {
		case s.Info.Suspended:
			st.State = "suspended"
		case !s.Info.LiveTable:
			st.State = "inactive"
		}
		if len(s.Targets) == 1 {
			switch t := s.Targets[0]; t.Type {
			case "thin-pool":
				if p, err := ParseThinPoolStatus(t.Params); err == nil {
					st.ThinPool = &p
				}
			case "thin":
				if p, err := ParseThinStatus(t.Params); err == nil {
					st.Thin = &p
				}
			}
		}
		out[DevNum{s.Info.Major, s.Info.Minor}] = st
	}
	return out
}

// thinPool reads the pool device from a thin target's table line (Table):
//
//	<pool dev> <device id> [<external origin dev>]
func thinPool(params string) (DevNum, error) {
	const target = "thin table"
	f := strings.Fields(params)
	if len(f) != 2 && len(f) != 3 {
		return DevNum{}, invalidStatus(target, "%d fields, want 2 or 3", len(f))
	}
	if _, err := parseUint(target, "device id", f[1]); err != nil {
		return DevNum{}, err
	}
	return parseDevNum(target, "pool device", f[0])
}

// parseDevNum parses "major:minor" as tables name devices.
func parseDevNum(target, what, s string) (DevNum, error) {
	ma, mi, ok := strings.Cut(s, ":")
	if !ok {
		return DevNum{}, invalidStatus(target, "%s %q: want major:minor", what, s)
	}
	major, err := parseUint(target, what, ma)
	if err != nil {
		return DevNum{}, err
	}
	minor, err := parseUint(target, what, mi)
	if err != nil {
		return DevNum{}, err
	}
	if major > 1<<32-1 || minor > 1<<32-1 {
		return DevNum{}, invalidStatus(target, "%s %q: out of range", what, s)
	}
	return DevNum{uint32(major), uint32(minor)}, nil
}
