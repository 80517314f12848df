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
	// ParamOnNodeLoss says what becomes of a claim whose node is lost for
	// good (nodeloss.go): OnNodeLossRecreate or OnNodeLossKeep.
	ParamOnNodeLoss = "onNodeLoss"
)

// Values of ParamOnNodeLoss.
const (
	// OnNodeLossRecreate (the default): a claim a StatefulSet's
	// volumeClaimTemplates made is deleted, so that the StatefulSet makes a
	// new one for its replica on another node. Other claims are kept.
	OnNodeLossRecreate = "recreate"
	// OnNodeLossKeep: every claim is kept, with an event that says how to
	// release it.
	OnNodeLossKeep = "keep"
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
	OnNodeLoss  string
}

// ParseParams checks a StorageClass's parameters. An unknown parameter is an
// error rather than ignored: a misspelt "stripping" must not silently give
// a linear volume.
func ParseParams(in map[string]string) (Params, error) {
	p := Params{FSType: DefaultFSType, OnNodeLoss: OnNodeLossRecreate}
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
		case ParamOnNodeLoss:
			if v != OnNodeLossRecreate && v != OnNodeLossKeep {
				return p, fmt.Errorf("StorageClass parameter %s=%q is neither %q nor %q", ParamOnNodeLoss, v, OnNodeLossRecreate, OnNodeLossKeep)
			}
			p.OnNodeLoss = v
		default:
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return p, fmt.Errorf("unknown StorageClass parameter(s) %s (known: %s, %s, %s, %s, %s)",
			strings.Join(unknown, ", "), ParamVolumeGroup, ParamFSType, ParamTags, ParamStriping, ParamOnNodeLoss)
	}
	if p.VolumeGroup == "" {
		return p, fmt.Errorf("StorageClass parameter %s is required", ParamVolumeGroup)
	}
	sort.Strings(p.Tags)
	return p, nil
}
