package devmapper

import (
	"bytes"
	"context"
	"encoding/binary"
)

// Device is one entry of the kernel's device list.
type Device struct {
	Name         string
	Major, Minor uint32
	// EventNr is the device's event counter; meaningful only when
	// EventNrKnown (kernel interface 4.37 or newer).
	EventNr      uint32
	EventNrKnown bool
	// UUID is the device's uuid, "" when it has none. UUIDKnown is false
	// when the kernel predates uuids in the list (interface 4.45, Linux
	// 5.15); Info then has the answer.
	UUID      string
	UUIDKnown bool
}

// List returns every device-mapper device (DM_LIST_DEVICES), in the
// kernel's order (sorted by name).
func (c *Control) List(ctx context.Context) ([]Device, error) {
	// DM_UUID_FLAG asks 4.45+ kernels to append each uuid; older kernels
	// ignore the flag and never set the per-record uuid flags.
	r, err := c.roundTrip(ctx, ioctlListDevices, request{flags: flagUUID}, initialBufferSize)
	if err != nil {
		return nil, err
	}
	defer r.release()
	return decodeNameList(r.buf, r.hdr, true)
}

// decodeNameList walks the dm_name_list records of a DM_LIST_DEVICES reply.
//
// Record layout (offsets from the record start, which is 8-byte aligned):
//
//	0  u64 dev
//	8  u32 next      offset of the next record from this one; 0 = last
//	12 char name[]   NUL-terminated
//	   then, from interface 4.37, at the next 8-byte boundary:
//	   u32 event_nr, u32 flags
//	   then, when flags has DM_NAME_LIST_FLAG_HAS_UUID, at the next
//	   8-byte boundary: char uuid[], NUL-terminated
//
// Old and new layouts differ only in what follows the name; `next` always
// says where the following record is, so the walk never depends on
// guessing the layout right. Extras are read only when they lie inside the
// record.
func decodeNameList(buf []byte, h header, askedUUID bool) ([]Device, error) {
	const op = "DM_LIST_DEVICES"
	start, end, ok := h.payload(len(buf))
	if !ok {
		return nil, nil // no payload: no devices
	}
	ne := binary.NativeEndian
	// The kernel writes dev = 0 into the first record when there is
	// nothing to list; libdevmapper checks the same.
	if end-start < nameListOffName || ne.Uint64(buf[start+nameListOffDev:]) == 0 {
		return nil, nil
	}
	hasEventNr := h.version.AtLeast(interfaceMajor, minorListEventNr)

	var devs []Device
	for off := start; ; {
		if off+nameListOffName > end {
			return nil, malformed(op, "", "record at %d overruns payload end %d", off, end)
		}
		dev := ne.Uint64(buf[off+nameListOffDev:])
		rel := uint64(ne.Uint32(buf[off+nameListOffNext:]))
		nameStart := off + nameListOffName
		recEnd := end
		if rel != 0 {
			// next must move past this record's name; anything else is a
			// corrupt or looping list.
			if rel <= nameListOffName || rel > uint64(end-off) {
				return nil, malformed(op, "", "record at %d has next %d (payload end %d)", off, rel, end)
			}
			recEnd = off + int(rel)
		}
		nul := bytes.IndexByte(buf[nameStart:recEnd], 0)
		if nul < 0 {
			return nil, malformed(op, "", "unterminated name at %d", nameStart)
		}
		major, minor := decodeDev(dev)
		d := Device{Name: string(buf[nameStart : nameStart+nul]), Major: major, Minor: minor}

		if hasEventNr {
			ev := align8(nameStart + nul + 1)
			if ev+8 > recEnd {
				return nil, malformed(op, d.Name, "event_nr at %d outside record ending %d", ev, recEnd)
			}
			d.EventNr = ne.Uint32(buf[ev:])
			d.EventNrKnown = true
			flags := ne.Uint32(buf[ev+4:])
			switch {
			case !askedUUID:
			case flags&nameListHasUUID != 0:
				u := align8(ev + 8)
				if u >= recEnd {
					return nil, malformed(op, d.Name, "uuid at %d outside record ending %d", u, recEnd)
				}
				n := bytes.IndexByte(buf[u:recEnd], 0)
				if n < 0 {
					return nil, malformed(op, d.Name, "unterminated uuid at %d", u)
				}
				d.UUID = string(buf[u : u+n])
				d.UUIDKnown = true
			case flags&nameListDoesntHaveUID != 0:
				d.UUIDKnown = true
			}
		}
		devs = append(devs, d)
		if rel == 0 {
			return devs, nil
		}
		off = recEnd
	}
}

// decodeDev splits the kernel's huge_encode_dev (new_encode_dev) form:
// minor bits 0-7 and 20-31 (shifted), major bits 8-19.
func decodeDev(dev uint64) (major, minor uint32) {
	major = uint32((dev & 0xfff00) >> 8)
	minor = uint32(dev&0xff) | uint32((dev>>12)&0xfff00)
	return major, minor
}

// encodeDev is decodeDev's inverse.
func encodeDev(major, minor uint32) uint64 {
	return uint64(minor&0xff) | uint64(major&0xfff)<<8 | uint64(minor&^0xff)<<12
}
