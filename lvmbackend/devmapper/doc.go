// Package devmapper reads the Linux device-mapper state of a node by speaking
// the ioctl protocol of /dev/mapper/control directly, in pure Go.
//
// The agent uses it to see thin-pool fill levels and the mapped size of thin
// volumes without forking dmsetup or linking libdevmapper (the agent is built
// with CGO_ENABLED=0 and runs in a minimal container). It only ever reads:
// there is no create, load, suspend or remove here, so a bug in this package
// cannot change a node's storage.
//
// Layout of the package:
//
//   - abi.go: struct dm_ioctl / dm_target_spec / dm_name_list offsets, flags
//     and ioctl numbers, and the request/reply header codec.
//   - control.go, sys_linux.go: Open, Close and the one ioctl round trip every
//     query uses, including the buffer growth on DM_BUFFER_FULL_FLAG.
//   - version.go, list.go, info.go, status.go, statusall.go: the queries.
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
