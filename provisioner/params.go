package provisioner

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/lvm-agent/lvm-agent/kube"
)

// StorageClass parameters.
const (
	ParamVolumeGroup = "volumeGroup"
	ParamFSType      = "fsType"
	ParamTags        = "tags"
	ParamStriping    = "striping"
	// ParamOnNodeLoss says what becomes of a claim whose node is lost for
	// good (nodeloss_release.go): OnNodeLossRecreate or OnNodeLossKeep.
	ParamOnNodeLoss = "onNodeLoss"
	// ParamWipe says whether a new volume of the class must read zeros
	// where its own tenant has not written: WipeZero (the default) or
	// WipeNone.
	ParamWipe = "wipe"
	// ParamEncryption asks for volumes encrypted at rest: "luks2", or ""
	// (the default, plain volumes).
	ParamEncryption = "encryption"
	// ParamEncryptionSecret names the Secret whose data field "key" (a
	// random key of at least 32 bytes) unlocks the class's volumes:
	// "name" in kube.DefaultKeyNamespace, or "namespace/name".
	ParamEncryptionSecret = "encryptionSecret"
)

// Values of ParamWipe.
const (
	// WipeZero: the class's volumes are made only on nodes whose agent
	// says it zeroes them (its capacity entry's "wipe": a thick LV zeroed
	// before its removal, a thin pool that zeroes new chunks).
	WipeZero = kube.WipeZero
	// WipeNone: no zeroing asked (a single-tenant node, or a volume whose
	// data is encrypted): the LVs carry kube.NoWipeTag, so that the agent
	// removes them at once and takes a thin pool that does not zero.
	WipeNone = "none"
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
	Wipe        string
	// Key is the key Secret of an encrypted class (Encrypted).
	Key       kube.KeyRef
	Encrypted bool
}

// ParseParams checks a StorageClass's parameters. An unknown parameter is an
// error rather than ignored: a misspelt "stripping" must not silently give
// a linear volume.
func ParseParams(in map[string]string) (Params, error) {
	p := Params{FSType: DefaultFSType, OnNodeLoss: OnNodeLossRecreate, Wipe: WipeZero}
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
		case ParamWipe:
			if v != WipeZero && v != WipeNone {
				return p, fmt.Errorf("StorageClass parameter %s=%q is neither %q nor %q", ParamWipe, v, WipeZero, WipeNone)
			}
			p.Wipe = v
		case ParamEncryption:
			if v != "" && v != kube.EncryptionLUKS2 {
				return p, fmt.Errorf("StorageClass parameter %s=%q is not %q (the one format served)", ParamEncryption, v, kube.EncryptionLUKS2)
			}
			p.Encrypted = v != ""
		case ParamEncryptionSecret:
			ref, err := kube.ParseKeyRef(v)
			if err != nil {
				return p, fmt.Errorf("StorageClass parameter %s: %w", ParamEncryptionSecret, err)
			}
			p.Key = ref
		default:
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return p, fmt.Errorf("unknown StorageClass parameter(s) %s (known: %s)",
			strings.Join(unknown, ", "), strings.Join(knownParams, ", "))
	}
	switch {
	case p.Encrypted && p.Key.Name == "":
		return p, fmt.Errorf("StorageClass parameter %s=%s needs %s, the Secret that holds the class's key", ParamEncryption, kube.EncryptionLUKS2, ParamEncryptionSecret)
	case !p.Encrypted && p.Key.Name != "":
		return p, fmt.Errorf("StorageClass parameter %s is set, but %s is not %s: the class's volumes would not be encrypted", ParamEncryptionSecret, ParamEncryption, kube.EncryptionLUKS2)
	}
	if p.VolumeGroup == "" {
		return p, fmt.Errorf("StorageClass parameter %s is required", ParamVolumeGroup)
	}
	sort.Strings(p.Tags)
	return p, nil
}

// Parameters returns every StorageClass parameter ParseParams knows, in the
// order its errors list them (a copy: docs/install.md's list is checked
// against it).
func Parameters() []string { return slices.Clone(knownParams) }

// knownParams are every StorageClass parameter, in the order errors list them.
var knownParams = []string{ParamVolumeGroup, ParamFSType, ParamTags, ParamStriping, ParamOnNodeLoss, ParamWipe, ParamEncryption, ParamEncryptionSecret}

// ErrNoEncryption: the class asks for encrypted volumes and the node's
// agent does not say it makes them.
var ErrNoEncryption = errors.New("the class asks for encrypted volumes (encryption: luks2), and the node's agent does not say it makes them")

// ErrNoWipe: the class asks for zeroed volumes (wipe: zero) and the
// node's agent does not say it zeroes them in the class's volume group.
var ErrNoWipe = errors.New("the class asks for volumes that read zeros (wipe: zero, the default), and the node's agent does not say it makes them")

// Serves tells whether a node whose agent says e of the class's volume
// group may hold the class's volumes: one that asks for zeros only where
// the agent says it zeroes them. An agent of the original design, an older
// lvm-agent, and one that cannot write the node's block devices
// (unprivileged, or a systemd unit without DeviceAllow) say nothing of it.
// The CSIStorageCapacity objects follow the same rule, so the scheduler
// does not pick such a node.
func (p Params) Serves(e kube.StorageCapacity) error {
	if p.Wipe == WipeZero && e.Wipe != kube.WipeZero {
		return fmt.Errorf("%w (no \"wipe\":\"zero\" in its entry for volume group %s): run its agent with the node's block devices (deploy/base does), or set %s: %s on the class to accept another volume's bytes", ErrNoWipe, p.VolumeGroup, ParamWipe, WipeNone)
	}
	if p.Encrypted && e.Encryption != kube.EncryptionLUKS2 {
		return fmt.Errorf("%w (no \"encryption\":\"luks2\" in its entry for volume group %s): run an lvm-agent that encrypts, with the node's block devices and device-mapper (deploy/base does)", ErrNoEncryption, p.VolumeGroup)
	}
	return nil
}

// LVTags are the LVM tags of the class's volumes: its own,
// kube.NoWipeTag for wipe: none, and the key's kube.EncryptionTag for an
// encrypted class.
func (p Params) LVTags() []string {
	tags := append([]string(nil), p.Tags...)
	if p.Wipe == WipeNone {
		tags = append(tags, kube.NoWipeTag)
	}
	if p.Encrypted {
		tags = append(tags, kube.EncryptionTag(p.Key))
	}
	return tags
}
