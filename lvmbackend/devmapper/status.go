package devmapper

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
)

// Target is one line of a device's table: Length sectors (512 bytes) of the
// device starting at sector Start are handled by a target of Type ("crypt",
// "linear", ...). Params is the target's status string (Status) or its
// table line (Table), verbatim but for keys (redactKeys), including any
// trailing space the target emits; for Create and Reload, the table line
// as the kernel takes it.
//
// Params may hold a secret (a crypt key given to Create or Reload): this
// package never puts Params into an error or a log, and String and
// GoString leave them out, so printing a Target with %v, %+v or %#v cannot
// leak one.
type Target struct {
	Start  uint64
	Length uint64
	Type   string
	Params string
}

// DeviceStatus is a device's header state and its targets, both from one
// DM_TABLE_STATUS reply.
type DeviceStatus struct {
	Info    Info
	Targets []Target
}

// Status returns the runtime status of every target of the device's live
// table (DM_TABLE_STATUS), e.g. thin-pool fill levels (ParseThinPoolStatus,
// ParseThinStatus). A device without a live table has no targets.
//
// The query carries DM_NOFLUSH_FLAG. Without it a thin-pool commits its
// metadata before answering, which is disk I/O a monitoring poll should not
// cause and which blocks when the pool's devices hang. The counters are at
// most one commit period (1 s) old. This matches `dmsetup status --noflush`.
func (c *Control) Status(ctx context.Context, name string) (DeviceStatus, error) {
	return c.tableStatus(ctx, name, flagNoFlush)
}

// Table returns the live table of the device (DM_TABLE_STATUS with
// DM_STATUS_TABLE_FLAG), like `dmsetup table`, and like it without keys:
// the kernel prints a crypt target's key in hex in its table line, and
// Table replaces every digit of it with '0' (a key held in the kernel
// keyring, ":<size>:<type>:<description>", is a reference and stays), as
// it does with the keys of an integrity target (redactKeys). The query
// carries DM_SECURE_DATA_FLAG, and the reply buffer is zeroed after use,
// so the key the kernel sent is not left in memory either.
func (c *Control) Table(ctx context.Context, name string) (DeviceStatus, error) {
	return c.tableStatus(ctx, name, flagStatusTable|flagSecureData)
}

func (c *Control) tableStatus(ctx context.Context, name string, flags uint32) (DeviceStatus, error) {
	if err := checkName("DM_TABLE_STATUS", name); err != nil {
		return DeviceStatus{}, err
	}
	r, err := c.roundTrip(ctx, ioctlTableStatus, request{name: name, flags: flags}, initialBufferSize)
	if err != nil {
		return DeviceStatus{}, err
	}
	defer r.release()
	targets, err := decodeTargets(r.buf, r.hdr)
	if err != nil {
		return DeviceStatus{}, err
	}
	return DeviceStatus{Info: infoFromHeader(r.hdr), Targets: targets}, nil
}

// decodeTargets walks the dm_target_spec records of a DM_TABLE_STATUS
// reply. Each record is a 40-byte dm_target_spec followed by a
// NUL-terminated params string; on output, spec.next is the offset of the
// following spec from the start of the payload (not from this spec, which
// is what DM_TABLE_LOAD input uses), always 8-byte aligned.
//
// target_count in the header says how many specs there are; a device with
// no live table reports 0 and no payload.
//
// Keys in the params are overwritten in buf (redactKeys) before the params
// are copied out, whatever the query: no Target this package returns holds
// one.
func decodeTargets(buf []byte, h header) ([]Target, error) {
	const op = "DM_TABLE_STATUS"
	if h.targetCount == 0 {
		return nil, nil
	}
	start, end, ok := h.payload(len(buf))
	if !ok {
		return nil, malformed(op, h.name, "%d targets but no payload", h.targetCount)
	}
	// A hostile target_count must not size an allocation: every spec
	// takes at least sizeofTargetSpec+1 bytes of payload. (Compared as
	// uint64: on 32-bit platforms int(targetCount) can be negative.)
	capacity := (end - start) / (sizeofTargetSpec + 1)
	if uint64(h.targetCount) < uint64(capacity) {
		capacity = int(h.targetCount)
	}
	targets := make([]Target, 0, capacity)
	ne := binary.NativeEndian
	off := start
	for i := uint32(0); i < h.targetCount; i++ {
		if off+sizeofTargetSpec > end {
			return nil, malformed(op, h.name, "target %d at %d overruns payload end %d", i, off, end)
		}
		paramsStart := off + sizeofTargetSpec
		n := bytes.IndexByte(buf[paramsStart:end], 0)
		if n < 0 {
			return nil, malformed(op, h.name, "target %d: unterminated params", i)
		}
		typ := cString(buf[off+specOffType : off+specOffType+targetTypeLen])
		params := buf[paramsStart : paramsStart+n]
		redactKeys(typ, params)
		targets = append(targets, Target{
			Start:  ne.Uint64(buf[off+specOffStart:]),
			Length: ne.Uint64(buf[off+specOffLength:]),
			Type:   typ,
			Params: string(params),
		})
		if i+1 == h.targetCount {
			break
		}
		rel := uint64(ne.Uint32(buf[off+specOffNext:]))
		if rel > uint64(end-start) {
			return nil, malformed(op, h.name, "target %d: next spec at payload offset %d, payload is %d bytes", i, rel, end-start)
		}
		// The next spec must start after this one's params, or the walk
		// could revisit records forever.
		next := start + int(rel)
		if next < paramsStart+n+1 {
			return nil, malformed(op, h.name, "target %d: next spec at %d overlaps params ending at %d", i, next, paramsStart+n+1)
		}
		off = next
	}
	return targets, nil
}

// ThinPoolZeroing reports whether the thin pool whose LVM device-mapper
// name is name (lvmmeta.DMName(vg, pool): "vg-pool", dashes in either name
// doubled) zeroes newly provisioned blocks: ZeroesNewBlocks of its table
// (ParseThinPoolTable).
//
// LVM puts the thin-pool target on one of two devices. A pool that has
// ever had a thin volume (a non-zero transaction id) has it on the
// "<name>-tpool" layer, active while the pool or any of its thin volumes
// is; "<name>" is then a linear device over that layer, or absent. A pool
// that never had one is activated without the layer: "<name>" is the
// thin-pool target. So "<name>-tpool" is read first, then "<name>".
//
// When neither is an active device with a thin-pool target (inactive pool,
// not a pool, no such LV), the error is an *Error with Kind ErrNotFound and
// cause ErrNotThinPool. Other kernel errors are returned as they come; a
// table that does not parse is an error matching ErrInvalidStatus.
func (c *Control) ThinPoolZeroing(ctx context.Context, name string) (bool, error) {
	const op = "DM_TABLE_STATUS"
	if err := checkName(op, name); err != nil {
		return false, err
	}
	for _, dev := range [2]string{name + "-tpool", name} {
		t, err := c.Table(ctx, dev)
		switch {
		case errors.Is(err, ErrNotFound), errors.Is(err, ErrInvalidName):
			// ErrInvalidName: "<name>-tpool" is too long for the
			// kernel, so LVM cannot have made it.
			continue
		case err != nil:
			return false, err
		case len(t.Targets) != 1 || t.Targets[0].Type != "thin-pool":
			continue
		}
		p, err := ParseThinPoolTable(t.Targets[0].Params)
		if err != nil {
			return false, &Error{Op: op, Target: dev, Err: err}
		}
		return p.ZeroesNewBlocks, nil
	}
	return false, &Error{Op: op, Target: name, Kind: ErrNotFound, Err: fmt.Errorf("%w in %s-tpool or %s", ErrNotThinPool, name, name)}
}
