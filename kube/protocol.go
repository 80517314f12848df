// Package kube holds everything the agent knows about Kubernetes: the
// annotation protocol's keys and parsing, ownership of objects by node,
// informers, events, and the only code that writes annotations (patch.go).
package kube

import (
	"crypto/sha256"
	"encoding/hex"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Prefix of every protocol key.
const Prefix = "pv.csi.alibabacloud.com/"

// Protocol keys (PROTOCOL.md).
const (
	AnnLifecycle = Prefix + "volume.lifecycle"
	AnnSpec      = Prefix + "volume.spec"
	AnnError     = Prefix + "volume.error"
	AnnReason    = Prefix + "volume.reason"
	// AnnDevice is written by the agent with "created": the LV's device
	// path on the node, so that a provisioner never derives it.
	AnnDevice = Prefix + "volume.device"
	// AnnSize is written by the agent with "expanded": the LV's size in
	// bytes after the grow, as LVM rounded it (whole extents).
	AnnSize         = Prefix + "volume.size"
	LabelNode       = Prefix + "volume.node"
	AnnSelectedNode = "volume.kubernetes.io/selected-node"
	// AnnResizeNudge is written by the provisioner on a running Pod whose
	// claim waits for kubelet to grow its filesystem: "CLAIM=SIZE". A
	// changed annotation makes kubelet sync the Pod at once, which grows
	// the filesystem, instead of at its next periodic sync (up to 90 s).
	AnnResizeNudge = Prefix + "volume.resize-nudge"
)

// Lifecycle states.
const (
	StateCreating = "creating"
	StateCreated  = "created"
	StateDeleting = "deleting"
	StateDeleted  = "deleted"
	StateFailed   = "failed"
	// StateExpanding asks, on a PV, for its LV to grow to the spec's size;
	// the agent answers StateExpanded (with AnnSize) or StateFailed.
	StateExpanding = "expanding"
	StateExpanded  = "expanded"
)

// Reasons written with StateFailed.
const (
	ReasonInvalidSpec          = "InvalidSpec"
	ReasonInsufficientCapacity = "InsufficientCapacity"
	ReasonUnknownVolumeGroup   = "UnknownVolumeGroup"
	ReasonNameConflict         = "NameConflict"
	ReasonProtected            = "Protected"
	// ReasonClaimInUse: a delete whose PV's claimRef names a PVC that still
	// exists with that UID; the LV stays (delete the claim first).
	ReasonClaimInUse = "ClaimInUse"
	// ReasonVolumeMismatch: the claim already has an LV of ours that cannot
	// answer this create: smaller than asked, or under another name.
	ReasonVolumeMismatch = "VolumeMismatch"
	// ReasonNotPlainVolume: a delete of an LV that is not a plain volume
	// without dependents (a thin pool, an origin with snapshots, a snapshot,
	// a cache or raid LV); lvremove -f would take more than the one LV.
	ReasonNotPlainVolume = "NotPlainVolume"
	// ReasonClaimTerminating: a create for a PVC that is being deleted.
	ReasonClaimTerminating = "ClaimTerminating"
	// ReasonVolumeNotFound: a grow of an LV that does not exist.
	ReasonVolumeNotFound = "VolumeNotFound"
	// ReasonResizeNotSupported: a grow on a node whose lvmd cannot resize
	// (google/lvmd has no resize call).
	ReasonResizeNotSupported = "ResizeNotSupported"
	// ReasonCloneNotSupported: a clone this node cannot make (a snapshot
	// in a thick device class or of a thick LV, on google/lvmd, or a copy
	// by an agent that cannot read device-mapper).
	ReasonCloneNotSupported = "CloneNotSupported"
	// ReasonPoolNotZeroing: a thin volume asked for in a thin pool that
	// does not zero new chunks (its table says skip_block_zeroing), so a
	// new volume could read a deleted one's bytes; refused unless the
	// spec's tags carry NoWipeTag (the class's wipe: none).
	ReasonPoolNotZeroing = "PoolNotZeroing"
	// ReasonKeyUnavailable: an encrypted volume's key Secret is missing,
	// out of the agent's reach or holds no usable key, or the key does not
	// open the volume; nothing is made (ErrKeyUnavailable).
	ReasonKeyUnavailable = "KeyUnavailable"
)

// PVRequest reports whether state is an open request on a PV: a delete or a grow.
func PVRequest(state string) bool { return state == StateDeleting || state == StateExpanding }

// RetainedTag is the LVM tag the provisioner puts on the LVs of StorageClasses
// with reclaimPolicy Retain: the orphan collector never removes such an LV.
const RetainedTag = "lvm-agent.retained"

// NoWipeTag is the LVM tag the provisioner puts on the LVs of StorageClasses
// with wipe: none: the agent removes such a thick LV without zeroing it
// first (every other thick LV is zeroed before its removal).
const NoWipeTag = "lvm-agent.nowipe"

// DefaultDriver is the CSI driver whose PVs the agent serves by default.
const DefaultDriver = "localplugin.csi.alibabacloud.com"

// DefaultProvisioner is the name of lvm-agent's own provisioner: the
// StorageClasses' provisioner, its CSIDriver object, and the value of
// AnnProvisionedBy on the local PVs it makes, which the agent serves by default.
const DefaultProvisioner = "lvm.lvm-agent.io"

// AnnProvisionedBy names the provisioner of a dynamically provisioned PV
// (set by Kubernetes' provisioner library): with a local PV's node affinity
// it makes the PV an agent's.
const AnnProvisionedBy = "pv.kubernetes.io/provisioned-by"

// NodeLabelValue is the value of LabelNode for a node: the name itself when
// it is a valid label value, otherwise "h-" and the first 40 hex digits of
// its SHA-256, so that every node name has a selectable form.
func NodeLabelValue(node string) string {
	if len(validation.IsValidLabelValue(node)) == 0 {
		return node
	}
	sum := sha256.Sum256([]byte(node))
	return "h-" + hex.EncodeToString(sum[:])[:40]
}
