package provisioner

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// StorageClass parameters.
const (
	ParamVolumeGroup = "volumeGroup"
	ParamFSType      = "fsType"
	ParamTags        = "tags"
	ParamStriping    = "striping"
)

// DefaultFSType is the filesystem of Filesystem-mode volumes when the class
// names none; kubelet makes it on first mount.
const DefaultFSType = "ext4"

// Params are a StorageClass's parameters, checked.
type Params struct {
	VolumeGroup string
	FSType      string
	Tags        []string
	Striping    bool
}

// ParseParams checks a StorageClass's parameters. An unknown parameter is an
// error rather than ignored: a misspelt "stripping" must not silently give
// a linear volume.
func ParseParams(in map[string]string) (Params, error) {
	p := Params{FSType: DefaultFSType}
	var unknown []string
	for k, v := range in {
		switch k {
		case ParamVolumeGroup:
			p.VolumeGroup = v
		case ParamFSType:
			if v != "" {
				p.FSType = v
			}
		case ParamTags:
			for _, t := range strings.Split(v, ",") {
				if t = strings.TrimSpace(t); t != "" {
					p.Tags = append(p.Tags, t)
				}
			}
		case ParamStriping:
			b, err := strconv.ParseBool(v)
			if err != nil {
				return p, fmt.Errorf("StorageClass parameter %s=%q is not a boolean", ParamStriping, v)
			}
			p.Striping = b
		default:
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return p, fmt.Errorf("unknown StorageClass parameter(s) %s (known: %s, %s, %s, %s)",
			strings.Join(unknown, ", "), ParamVolumeGroup, ParamFSType, ParamTags, ParamStriping)
	}
	if p.VolumeGroup == "" {
		return p, fmt.Errorf("StorageClass parameter %s is required", ParamVolumeGroup)
	}
	sort.Strings(p.Tags)
	return p, nil
}
