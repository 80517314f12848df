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
	AnnDevice       = Prefix + "volume.device"
	LabelNode       = Prefix + "volume.node"
	AnnSelectedNode = "volume.kubernetes.io/selected-node"
)

// Lifecycle states.
const (
	StateCreating = "creating"
	StateCreated  = "created"
	StateDeleting = "deleting"
	StateDeleted  = "deleted"
	StateFailed   = "failed"
)

// Reasons written with StateFailed.
const (
	ReasonInvalidSpec          = "InvalidSpec"
	ReasonInsufficientCapacity = "InsufficientCapacity"
	ReasonUnknownVolumeGroup   = "UnknownVolumeGroup"
	ReasonNameConflict         = "NameConflict"
	ReasonProtected            = "Protected"
)

// RetainedTag is the LVM tag the provisioner puts on the LVs of StorageClasses
// with reclaimPolicy Retain: the orphan collector never removes such an LV.
const RetainedTag = "lvm-agent.retained"

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
