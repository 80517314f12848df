package devmapper

// Golden kernel replies, written out byte by byte as dm-ioctl.c lays them
// out. Offsets in the comments are relative to the payload start
// (data_start = 312, itself 8-byte aligned, so payload-relative alignment
// equals the kernel's address alignment).

const (
	dmUUIDFlag       = 0x4000 // DM_UUID_FLAG, echoed back from the request
	dmNoFlushFlag    = 0x0800 // DM_NOFLUSH_FLAG, echoed back
	dmActivePresent  = 0x0020 // DM_ACTIVE_PRESENT_FLAG
	dmInactive       = 0x0040 // DM_INACTIVE_PRESENT_FLAG
	dmSuspendFlag    = 0x0002 // DM_SUSPEND_FLAG
	dmReadOnlyFlag   = 0x0001 // DM_READONLY_FLAG
	dmBufferFull     = 0x0100 // DM_BUFFER_FULL_FLAG
	nlHasUUID        = 1      // DM_NAME_LIST_FLAG_HAS_UUID
	nlDoesntHaveUUID = 2      // DM_NAME_LIST_FLAG_DOESNT_HAVE_UUID
)

var v4_48 = [3]uint32{4, 48, 0}

// goldenListPayloadNew is DM_LIST_DEVICES on a 5.15+ kernel asked with
// DM_UUID_FLAG: three records with event_nr, flags and (when the device has
// one) the uuid, each part 8-byte aligned.
func goldenListPayloadNew() []byte {
	return cat(
		// record 0 @0: vg0-pool, 253:2
		u64(0xfd02),                 // @0  dev
		u32(64),                     // @8  next: record 1 is 64 bytes on
		str("vg0-pool\x00"), pad(3), // @12 name, 9 bytes, pad to 24
		u32(3), u32(nlHasUUID), // @24 event_nr, flags
		str("LVM-0123456789abcdef-tpool"), // @32 uuid, 26 bytes
		str("\x00"), pad(5),               // @58 NUL, pad to 64
		// record 1 @64: vg0-thin1, 253:3, no uuid
		u64(0xfd03),                  // @64 dev
		u32(32),                      // @72 next: record 2 at 96
		str("vg0-thin1\x00"), pad(2), // @76 name, 10 bytes, pad to 88
		u32(0), u32(nlDoesntHaveUUID), // @88 event_nr, flags
		// record 2 @96: big-minor, 253:300 encoded as the kernel's new_encode_dev
		u64(0x10fd2c),                // @96  dev: minor low 8 bits, major, minor high bits << 12
		u32(0),                       // @104 next: last record
		str("big-minor\x00"), pad(2), // @108 name, pad to 120
		u32(7), u32(nlHasUUID), // @120 event_nr, flags
		str("CRYPT-LUKS2-x\x00"), pad(2), // @128 uuid, 14 bytes, pad to 144
	)
}

func goldenListReplyNew() []byte {
	return kernelReply(kernelHeader{version: v4_48, flags: dmUUIDFlag}, goldenListPayloadNew())
}

// goldenListReplyOld is DM_LIST_DEVICES on an interface older than 4.37:
// just dev, next and name per record.
func goldenListReplyOld() []byte {
	return kernelReply(kernelHeader{version: [3]uint32{4, 27, 0}, flags: dmUUIDFlag}, cat(
		// record 0 @0
		u64(0xfd00),                // dev 253:0
		u32(24),                    // next
		str("vg0-lv0\x00"), pad(4), // @12 name, pad to 24
		// record 1 @24
		u64(0xfd01),                // dev 253:1
		u32(0),                     // last
		str("vg0-lv1\x00"), pad(4), // @36 name, pad to 48
	))
}

// goldenListReplyNoUUID is DM_LIST_DEVICES on 4.37..4.44: event_nr and a
// zero flags word, no uuids even though DM_UUID_FLAG was sent.
func goldenListReplyNoUUID() []byte {
	return kernelReply(kernelHeader{version: [3]uint32{4, 39, 0}, flags: dmUUIDFlag}, cat(
		u64(0xfd05),                 // dev 253:5
		u32(0),                      // last
		str("vg1-data\x00"), pad(3), // @12 name, 9 bytes, pad to 24
		u32(12), u32(0), // @24 event_nr 12, no flags
	))
}

const goldenThinPoolParams = "1 191/1024 5120/16384 - rw discard_passdown queue_if_no_space - 256 "

// goldenThinPoolStatusReply is DM_TABLE_STATUS of an LVM thin-pool's
// -tpool device: one thin-pool target, with the header filled in like
// DM_DEV_STATUS would.
func goldenThinPoolStatusReply() []byte {
	return kernelReply(kernelHeader{
		version:     v4_48,
		dataSize:    421, // 312 + 40 (spec) + 68 (params) + 1 (NUL): the kernel does not pad the last one
		targetCount: 1,
		openCount:   2,
		flags:       dmNoFlushFlag | dmActivePresent,
		eventNr:     5,
		dev:         0xfd02,
		name:        "vg0-pool-tpool",
		uuid:        "LVM-0123456789abcdef-tpool",
	}, cat(
		u64(0),                   // @0  sector_start
		u64(2097152),             // @8  length: 1 GiB in sectors
		u32(0),                   // @16 status
		u32(112),                 // @20 next: from the payload start, aligned
		str("thin-pool"), pad(7), // @24 target_type[16]
		str(goldenThinPoolParams), // @40 params, 68 bytes
		str("\x00"),               // @108 NUL; payload used = 109
	))
}

// goldenTwoTargetStatusReply is DM_TABLE_STATUS of a device made of a
// linear target (empty status) followed by a striped one.
func goldenTwoTargetStatusReply() []byte {
	return kernelReply(kernelHeader{
		version:     v4_48,
		dataSize:    417, // 312 + 105
		targetCount: 2,
		flags:       dmNoFlushFlag | dmActivePresent | dmReadOnlyFlag,
		eventNr:     0,
		dev:         0xfd07,
		name:        "vg0-mixed",
	}, cat(
		// target 0 @0
		u64(0), u64(8192), u32(0),
		u32(48),                // next: 40 + 1 rounded up to 48
		str("linear"), pad(10), // target_type[16]
		str("\x00"), pad(7), // @40 empty params, pad to 48
		// target 1 @48
		u64(8192), u64(16384), u32(0),
		u32(112),               // next: past the end, as the kernel writes it for the last spec too
		str("striped"), pad(9), // target_type[16]
		str("2 8:16 8:32 1 AA\x00"), // @88 params, 17 bytes; payload used = 105
	))
}

// goldenNoTableStatusReply is DM_TABLE_STATUS of a device whose table is
// loaded but not yet resumed: no live table, so header only, target_count
// 0 and data_size the kernel's minimum.
func goldenNoTableStatusReply() []byte {
	return kernelReply(kernelHeader{
		version:  v4_48,
		dataSize: 305,
		flags:    dmNoFlushFlag | dmSuspendFlag | dmInactive,
		dev:      0xfd09,
		name:     "empty",
	}, nil)
}
