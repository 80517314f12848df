package devmapper

import "context"

// Info is a device's state as DM_DEV_STATUS (and DM_TABLE_STATUS, which
// carries the same header) reports it.
type Info struct {
	Name         string
	UUID         string
	Major, Minor uint32
	// OpenCount is how many openers the block device has right now.
	OpenCount int32
	// EventNr increments on every target event (e.g. thin-pool low water).
	EventNr uint32
	// TargetCount is the number of targets in the live table.
	TargetCount uint32

	LiveTable       bool // a table is active (DM_ACTIVE_PRESENT_FLAG)
	InactiveTable   bool // a table is loaded but not yet resumed
	Suspended       bool
	InternalSuspend bool // suspended by the kernel itself, e.g. a thin volume while its pool is suspended
	ReadOnly        bool
	DeferredRemove  bool // removal scheduled for the last close
}

// Attr renders the flags the way `dmsetup info -c` shows its Stat column:
// [L-][I-][s-][rw].
func (i Info) Attr() string {
	b := []byte("----")
	if i.LiveTable {
		b[0] = 'L'
	}
	if i.InactiveTable {
		b[1] = 'I'
	}
	if i.Suspended {
		b[2] = 's'
	}
	b[3] = 'w'
	if i.ReadOnly {
		b[3] = 'r'
	}
	return string(b)
}

func infoFromHeader(h header) Info {
	major, minor := decodeDev(h.dev)
	return Info{
		Name:            h.name,
		UUID:            h.uuid,
		Major:           major,
		Minor:           minor,
		OpenCount:       h.openCount,
		EventNr:         h.eventNr,
		TargetCount:     h.targetCount,
		LiveTable:       h.flags&flagActivePresent != 0,
		InactiveTable:   h.flags&flagInactivePresent != 0,
		Suspended:       h.flags&flagSuspend != 0,
		InternalSuspend: h.flags&flagInternalSuspend != 0,
		ReadOnly:        h.flags&flagReadOnly != 0,
		DeferredRemove:  h.flags&flagDeferredRemove != 0,
	}
}

// Info returns the state of the device called name (DM_DEV_STATUS). A
// missing device is an *Error with Kind ErrNotFound.
func (c *Control) Info(ctx context.Context, name string) (Info, error) {
	if err := checkName("DM_DEV_STATUS", name); err != nil {
		return Info{}, err
	}
	return c.devStatus(ctx, request{name: name})
}

// InfoByDevice returns the state of the device with these numbers, name
// included: one DM_DEV_STATUS that names the device by dev_t (the kernel
// looks a device up by number when the request carries no name or uuid),
// instead of a List and an Info. A missing device is an *Error with Kind
// ErrNotFound.
func (c *Control) InfoByDevice(ctx context.Context, major, minor uint32) (Info, error) {
	return c.devStatus(ctx, request{dev: encodeDev(major, minor)})
}

func (c *Control) devStatus(ctx context.Context, req request) (Info, error) {
	// DM_DEV_STATUS returns the header only, so the header is the buffer.
	r, err := c.roundTrip(ctx, ioctlDevStatus, req, sizeofDmIoctl)
	if err != nil {
		return Info{}, err
	}
	defer r.release()
	return infoFromHeader(r.hdr), nil
}
