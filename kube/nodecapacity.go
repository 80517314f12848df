package kube

import (
	"encoding/json"
	"slices"
	"strings"
)

// DefaultCapacityAnnotation is the Node annotation that carries the node's
// local storage capacity. It is the key of Alibaba Cloud CSI's local storage
// plugin, and the value keeps that plugin's format (a JSON list of
// {"type":"lvm","name":<VG>,"capacity":<bytes>}), so that schedulers which
// read it keep working; "free" and "deviceClass" are lvm-agent's additions,
// which readers of the original format ignore.
const DefaultCapacityAnnotation = "csi.alibabacloud.com/storage-topology"

// StorageCapacity is one entry of the capacity annotation.
type StorageCapacity struct {
	// Type is always "lvm".
	Type string `json:"type"`
	// Name is the volume group as a create spec names it.
	Name string `json:"name"`
	// Capacity is the size in bytes: the VG's, or a thin pool's.
	Capacity uint64 `json:"capacity"`
	// Free is what lvmd can still allocate (thin: with overprovisioning).
	Free uint64 `json:"free"`
	// DeviceClass is the lvmd device class behind Name.
	DeviceClass string `json:"deviceClass"`
	// Clone is the kind of clone the agent makes in Name (CloneSnapshot,
	// CloneCopy), absent when it makes none: a provisioner sends a clone
	// only to an agent that says it can make it.
	Clone string `json:"clone,omitempty"`
	// Grow: the agent grows volumes of Name (the expand request); absent,
	// a provisioner never sends one (an agent of the original design would
	// never answer it, google/lvmd has no resize).
	Grow bool `json:"grow,omitempty"`
	// Wipe is WipeZero when every volume the agent answers created in Name
	// reads zeros where its own tenant has not written (thick: the agent
	// zeroes an LV before its removal; thin: the pool zeroes new chunks),
	// absent otherwise: a provisioner makes a volume of a class that asks
	// for zeros (wipe: zero, the default) only where the agent says so.
	Wipe string `json:"wipe,omitempty"`
	// Encryption is EncryptionLUKS2 when the agent makes encrypted volumes
	// in Name (it writes the node's block devices and loads dm-crypt
	// tables), absent otherwise: a provisioner sends a request with
	// EncryptionTag only to an agent that says so.
	Encryption string `json:"encryption,omitempty"`
	// LvmdUnreachable: the agent has not reached lvmd for a while; Free is
	// then 0, as nothing can be made here until lvmd is back.
	LvmdUnreachable bool `json:"lvmdUnreachable,omitempty"`
}

// WipeZero is StorageCapacity.Wipe's value, and the StorageClass parameter
// wipe's default.
const WipeZero = "zero"

// EncodeStorageTopology renders entries as the annotation's value, sorted
// by name and device class, so that equal reports give equal strings and an
// unchanged report is never written twice.
func EncodeStorageTopology(entries []StorageCapacity) string {
	entries = append([]StorageCapacity{}, entries...) // "[]" for none
	slices.SortFunc(entries, func(a, b StorageCapacity) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.DeviceClass, b.DeviceClass)
	})
	out, _ := json.Marshal(entries) // plain structs: cannot fail
	return string(out)
}

// DecodeStorageTopology reads the annotation's value. An entry of the
// original format (no "free") decodes with Free equal to its Capacity: an
// optimistic figure, which an InsufficientCapacity answer corrects.
func DecodeStorageTopology(value string) ([]StorageCapacity, error) {
	var raw []struct {
		StorageCapacity
		Free *uint64 `json:"free"`
	}
	if err := json.Unmarshal([]byte(value), &raw); err != nil {
		return nil, err
	}
	out := make([]StorageCapacity, len(raw))
	for i, e := range raw {
		out[i] = e.StorageCapacity
		out[i].Free = e.Capacity
		if e.Free != nil {
			out[i].Free = *e.Free
		}
	}
	return out, nil
}
