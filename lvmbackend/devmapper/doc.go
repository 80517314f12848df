// Package devmapper reads the Linux device-mapper state of a node, and
// makes the few devices the agent owns, by speaking the ioctl protocol of
// /dev/mapper/control directly, in pure Go.
//
// The agent uses it to see thin-pool fill levels and the mapped size of thin
// volumes without forking dmsetup or linking libdevmapper (the agent is built
// with CGO_ENABLED=0 and runs in a minimal container). The reads (Version,
// List, Info, Status, StatusAll, Table, Snapshot) are what they were: they
// change nothing on the node.
//
// It also writes, for the devices the agent owns and nothing else: the
// dm-crypt mappings over encrypted LVs. Create makes a device live (create,
// table load, resume), Reload grows one (table load, then one resume that
// swaps the tables), Remove takes one away. Nothing here writes to devices
// LVM made: LVM's own writes still go through lvmd. Tables may hold a key,
// so loads and table queries carry DM_SECURE_DATA_FLAG, the buffers that
// held one are zeroed after use, Table returns crypt keys zeroed (as
// `dmsetup table` shows them), and no error or String of a Target carries
// its params.
//
// Layout of the package:
//
//   - abi.go: struct dm_ioctl / dm_target_spec / dm_name_list offsets, flags
//     and ioctl numbers, the request/reply header codec and the
//     DM_TABLE_LOAD table encoding.
//   - control.go, sys_linux.go: Open, Close and the one ioctl round trip every
//     query uses, including the buffer growth on DM_BUFFER_FULL_FLAG.
//   - version.go, list.go, info.go, status.go, statusall.go: the queries.
//   - write.go: Create, Reload, Remove, and the checks of what they send.
//   - redact.go: zeroing keys in table lines, and Target's String.
//   - thinpool.go, thin.go, targets.go: parsers for the thin-pool and thin
//     status strings the kernel returns in Status, and for the thin-pool
//     table line (Table) that says whether a pool zeroes new blocks
//     (ThinPoolZeroing, in status.go).
//   - snapshot.go: the model the agent and `volume status` read (DevNum,
//     DeviceState, a pool's problems) and Snapshot, which builds it for
//     every device, each thin volume with its pool's device.
//
// Everything that touches the kernel goes through one function value, so the
// encoding and decoding are tested against hand-built kernel replies; the
// tests that need a real kernel live behind the "guest" build tag.
package devmapper
