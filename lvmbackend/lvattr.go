package lvmbackend

import lvmpb "github.com/google/lvmd/proto"

// googleAttr rebuilds lvm's lv_attr string from the daemon's decoded
// attributes (the inverse of its parser's tables). The health character is
// always '-': the daemon's parser decodes it with the wrong table.
func googleAttr(a *lvmpb.LogicalVolume_Attributes) string {
	if a == nil {
		return ""
	}
	key := func(keys string, v int32) byte {
		if v <= 0 || int(v) > len(keys) {
			return '-' // MALFORMED_*: also what a plain linear LV's '-' decodes to
		}
		return keys[v-1]
	}
	flag := func(set bool, c byte) byte {
		if set {
			return c
		}
		return '-'
	}
	return string([]byte{
		key("mMoOrRsSpviIlcVtTe", int32(a.GetType())),
		key("wrR", int32(a.GetPermissions())),
		key("acilnACILN", int32(a.GetAllocation())),
		flag(a.GetFixedMinor(), 'm'),
		key("asISmMdi", int32(a.GetState())),
		flag(a.GetOpen(), 'o'),
		key("mrstuv", int32(a.GetTargetType())),
		flag(a.GetZeroing(), 'z'),
		'-',
		flag(a.GetActivationSkipped(), 's'),
	})
}
