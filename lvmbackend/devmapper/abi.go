package devmapper

import (
	"bytes"
	"encoding/binary"
)

// The layout below is include/uapi/linux/dm-ioctl.h, interface version 4.
// It is spelled out as byte offsets rather than mirrored in a Go struct so
// that the codec never depends on Go's struct layout, and so the tests can
// check every offset against golang.org/x/sys/unix.DmIoctl independently.
//
// All fields are in host byte order (the kernel copies the struct as is),
// hence binary.NativeEndian throughout.

// struct dm_ioctl.
const (
	sizeofDmIoctl = 312 // includes 7 bytes of trailing padding (data[7])

	offVersion     = 0   // __u32 version[3]
	offDataSize    = 12  // __u32 data_size: total buffer size in, bytes used out
	offDataStart   = 16  // __u32 data_start: payload offset from the struct start
	offTargetCount = 20  // __u32 target_count
	offOpenCount   = 24  // __s32 open_count
	offFlags       = 28  // __u32 flags
	offEventNr     = 32  // __u32 event_nr
	offPadding     = 36  // __u32 padding
	offDev         = 40  // __u64 dev, encoded like the kernel's huge_encode_dev
	offName        = 48  // char name[128]
	offUUID        = 176 // char uuid[129]
	offData        = 305 // char data[7]; the kernel's "minimum data size"

	nameLen = 128 // DM_NAME_LEN, including the terminating NUL
	uuidLen = 129 // DM_UUID_LEN, including the terminating NUL
)

// struct dm_target_spec, followed by its NUL-terminated params string.
const (
	sizeofTargetSpec = 40
	specOffStart     = 0  // __u64 sector_start
	specOffLength    = 8  // __u64 length
	specOffStatus    = 16 // __s32 status (unused on output)
	specOffNext      = 20 // __u32 next: on output, offset from the *payload start*; on DM_TABLE_LOAD input, from *this spec*
	specOffType      = 24 // char target_type[16]
	targetTypeLen    = 16 // DM_MAX_TYPE_NAME
)

// struct dm_name_list: dev, next (offset from *this record*), then name.
const (
	nameListOffDev  = 0
	nameListOffNext = 8
	nameListOffName = 12 // offsetof(struct dm_name_list, name); sizeof is 16
)

// Name list per-record flags (the second u32 after the name, 4.45+).
const (
	nameListHasUUID       = 1 << 0 // DM_NAME_LIST_FLAG_HAS_UUID
	nameListDoesntHaveUID = 1 << 1 // DM_NAME_LIST_FLAG_DOESNT_HAVE_UUID
)

// dm_ioctl.flags bits that this package sends or reads.
const (
	flagReadOnly        = 1 << 0  // DM_READONLY_FLAG (out)
	flagSuspend         = 1 << 1  // DM_SUSPEND_FLAG (out)
	flagStatusTable     = 1 << 4  // DM_STATUS_TABLE_FLAG (in)
	flagActivePresent   = 1 << 5  // DM_ACTIVE_PRESENT_FLAG (out)
	flagInactivePresent = 1 << 6  // DM_INACTIVE_PRESENT_FLAG (out)
	flagBufferFull      = 1 << 8  // DM_BUFFER_FULL_FLAG (out)
	flagSkipLockFS      = 1 << 10 // DM_SKIP_LOCKFS_FLAG (in): do not freeze the filesystem on a suspend
	flagNoFlush         = 1 << 11 // DM_NOFLUSH_FLAG (in)
	flagUUID            = 1 << 14 // DM_UUID_FLAG (in, for DM_LIST_DEVICES)
	// flagSecureData (DM_SECURE_DATA_FLAG, in): the kernel wipes its copy
	// of the ioctl buffer after use and clears the caller's buffer once it
	// has copied it in, so a crypt key in a table load (or in a table
	// query's reply) does not linger in kernel memory. The kernel strips
	// the flag before answering, so replies never echo it.
	flagSecureData      = 1 << 15
	flagDeferredRemove  = 1 << 17 // DM_DEFERRED_REMOVE (out)
	flagInternalSuspend = 1 << 18 // DM_INTERNAL_SUSPEND_FLAG (out)
)

// The interface version this package asks for. The kernel accepts a request
// when the major matches and the minor is not newer than its own, so asking
// for 4.0.0 works on every 4.x kernel; the commands used here all exist since
// 4.0. The reply carries the kernel's own version, which decides the reply
// layout where it changed (see list.go).
const (
	interfaceMajor = 4
	interfaceMinor = 0
	interfacePatch = 0
)

// Reply layout changes keyed on the kernel's interface minor version.
const (
	// minorListEventNr: DM_LIST_DEVICES records carry event_nr and a flags
	// word after the name (kernel 4.14; the 4.36 layout of 4.13 was
	// misaligned and is ignored, as libdevmapper does).
	minorListEventNr = 37
)

// Command numbers (the "nr" of the ioctl) from enum in dm-ioctl.h.
const (
	cmdVersion     = 0
	cmdListDevices = 2
	cmdDevCreate   = 3
	cmdDevRemove   = 4
	cmdDevSuspend  = 6 // suspend with DM_SUSPEND_FLAG, resume without
	cmdDevStatus   = 7
	cmdTableLoad   = 9
	cmdTableClear  = 10
	cmdTableStatus = 12
)

// iowr is the kernel's _IOWR(type, nr, size): direction bits (read|write)
// at the top, then the size, type and number. The encodings differ between
// architectures in the number of direction and size bits, but for a 312-byte
// struct they all produce the same value (x/sys/unix keeps DM_VERSION and
// friends in its architecture-independent file); abi_linux_test.go checks
// the result against those constants.
func iowr(typ, nr, size uintptr) uintptr {
	const (
		dirRead  = 2
		dirWrite = 1
	)
	return (dirRead|dirWrite)<<30 | size<<16 | typ<<8 | nr
}

const dmIoctlType = 0xfd // DM_IOCTL

var (
	ioctlVersion     = iowr(dmIoctlType, cmdVersion, sizeofDmIoctl)
	ioctlListDevices = iowr(dmIoctlType, cmdListDevices, sizeofDmIoctl)
	ioctlDevStatus   = iowr(dmIoctlType, cmdDevStatus, sizeofDmIoctl)
	ioctlTableStatus = iowr(dmIoctlType, cmdTableStatus, sizeofDmIoctl)
	ioctlDevCreate   = iowr(dmIoctlType, cmdDevCreate, sizeofDmIoctl)
	ioctlDevRemove   = iowr(dmIoctlType, cmdDevRemove, sizeofDmIoctl)
	ioctlDevSuspend  = iowr(dmIoctlType, cmdDevSuspend, sizeofDmIoctl)
	ioctlTableLoad   = iowr(dmIoctlType, cmdTableLoad, sizeofDmIoctl)
	ioctlTableClear  = iowr(dmIoctlType, cmdTableClear, sizeofDmIoctl)
)

// ioctlNames are used in errors only.
var ioctlNames = map[uintptr]string{
	ioctlVersion:     "DM_VERSION",
	ioctlListDevices: "DM_LIST_DEVICES",
	ioctlDevStatus:   "DM_DEV_STATUS",
	ioctlTableStatus: "DM_TABLE_STATUS",
	ioctlDevCreate:   "DM_DEV_CREATE",
	ioctlDevRemove:   "DM_DEV_REMOVE",
	ioctlDevSuspend:  "DM_DEV_SUSPEND", // only ever sent as a resume
	ioctlTableLoad:   "DM_TABLE_LOAD",
	ioctlTableClear:  "DM_TABLE_CLEAR",
}

// request is what a query puts into the dm_ioctl header.
type request struct {
	name  string
	flags uint32
	// dev names the device by number (encodeDev form) when name is empty.
	dev uint64
	// uuid is sent with DM_DEV_CREATE only: on every other command the
	// kernel refuses a request that carries both a name and a uuid.
	uuid string
	// targets is the table of a DM_TABLE_LOAD, encoded after the header
	// (encodeTargets); the buffer must have room for tableSize(targets).
	targets []Target
}

// encodeRequest writes a request header at the start of buf, which must be
// at least sizeofDmIoctl long and zeroed in the header. data_size tells the
// kernel how much room there is for its reply: all of buf.
func encodeRequest(buf []byte, r request) {
	ne := binary.NativeEndian
	ne.PutUint32(buf[offVersion:], interfaceMajor)
	ne.PutUint32(buf[offVersion+4:], interfaceMinor)
	ne.PutUint32(buf[offVersion+8:], interfacePatch)
	ne.PutUint32(buf[offDataSize:], uint32(len(buf)))
	ne.PutUint32(buf[offDataStart:], sizeofDmIoctl)
	ne.PutUint32(buf[offFlags:], r.flags)
	ne.PutUint64(buf[offDev:], r.dev)
	copy(buf[offName:offName+nameLen-1], r.name)
	copy(buf[offUUID:offUUID+uuidLen-1], r.uuid)
	if len(r.targets) > 0 {
		ne.PutUint32(buf[offTargetCount:], uint32(len(r.targets)))
		encodeTargets(buf[sizeofDmIoctl:], r.targets)
	}
}

// specSize is the room one target takes in a DM_TABLE_LOAD payload: the
// dm_target_spec, the params and their NUL, padded so the next spec is
// 8-byte aligned.
func specSize(t Target) int { return align8(sizeofTargetSpec + len(t.Params) + 1) }

func tableSize(targets []Target) int {
	n := 0
	for _, t := range targets {
		n += specSize(t)
	}
	return n
}

// encodeTargets lays targets out the way DM_TABLE_LOAD reads them: each
// dm_target_spec followed by its NUL-terminated params, next holding the
// distance from this spec to the following one (specSize). The last spec's
// next points just past the table; the kernel reads target_count specs and
// ignores it. buf must be zeroed and hold tableSize(targets) bytes.
func encodeTargets(buf []byte, targets []Target) {
	ne := binary.NativeEndian
	off := 0
	for _, t := range targets {
		size := specSize(t)
		ne.PutUint64(buf[off+specOffStart:], t.Start)
		ne.PutUint64(buf[off+specOffLength:], t.Length)
		ne.PutUint32(buf[off+specOffNext:], uint32(size))
		copy(buf[off+specOffType:off+specOffType+targetTypeLen-1], t.Type)
		copy(buf[off+sizeofTargetSpec:], t.Params)
		off += size
	}
}

// header is the decoded dm_ioctl of a reply.
type header struct {
	version     Version
	dataSize    uint32
	dataStart   uint32
	targetCount uint32
	openCount   int32
	flags       uint32
	eventNr     uint32
	dev         uint64
	name        string
	uuid        string
}

func decodeHeader(buf []byte) header {
	ne := binary.NativeEndian
	return header{
		version: Version{
			Major: ne.Uint32(buf[offVersion:]),
			Minor: ne.Uint32(buf[offVersion+4:]),
			Patch: ne.Uint32(buf[offVersion+8:]),
		},
		dataSize:    ne.Uint32(buf[offDataSize:]),
		dataStart:   ne.Uint32(buf[offDataStart:]),
		targetCount: ne.Uint32(buf[offTargetCount:]),
		openCount:   int32(ne.Uint32(buf[offOpenCount:])),
		flags:       ne.Uint32(buf[offFlags:]),
		eventNr:     ne.Uint32(buf[offEventNr:]),
		dev:         ne.Uint64(buf[offDev:]),
		name:        cString(buf[offName : offName+nameLen]),
		uuid:        cString(buf[offUUID : offUUID+uuidLen]),
	}
}

// payload returns the bounds of the reply's data area within buf, or
// ok=false when the reply carries none. The kernel sets data_size to the
// bytes it actually wrote (header only: offsetof(data) = 305), so a reply
// whose data_size does not reach past data_start has no payload.
func (h header) payload(bufLen int) (start, end int, ok bool) {
	// Compared as uint64 so 32-bit platforms cannot see negative offsets.
	if uint64(h.dataSize) > uint64(bufLen) || h.dataStart < offData || h.dataStart >= h.dataSize {
		return 0, 0, false
	}
	return int(h.dataStart), int(h.dataSize), true
}

// cString returns b up to its first NUL (all of b when there is none).
func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// align8 rounds an offset up the way the kernel's align_ptr does. Offsets
// here are relative to the start of the dm_ioctl, which the kernel keeps
// 8-byte aligned, so aligning the offset equals aligning the address.
func align8(off int) int { return (off + 7) &^ 7 }
