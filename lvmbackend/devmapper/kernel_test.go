package devmapper

import (
	"encoding/binary"
	"sync"
	"testing"
)

// This file holds the test side of the wire: byte builders for kernel
// replies and a fake kernel behind the ioctl function. The builders
// deliberately use literal offsets rather than the package's constants, so
// a wrong constant in abi.go shows up as a failing golden test instead of
// agreeing with itself.

func u32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }
func u64(v uint64) []byte { return binary.NativeEndian.AppendUint64(nil, v) }
func pad(n int) []byte    { return make([]byte, n) }
func str(s string) []byte { return []byte(s) }

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// kernelHeader is what the kernel writes into struct dm_ioctl.
type kernelHeader struct {
	version     [3]uint32
	dataSize    uint32 // 0: 312 + len(payload)
	dataStart   uint32 // 0: 312
	targetCount uint32
	openCount   int32
	flags       uint32
	eventNr     uint32
	dev         uint64
	name, uuid  string
}

// kernelReply lays out a reply the way dm-ioctl.c does: the 312-byte
// struct dm_ioctl, then the payload at data_start.
func kernelReply(h kernelHeader, payload []byte) []byte {
	if h.dataStart == 0 {
		h.dataStart = 312
	}
	if h.dataSize == 0 {
		h.dataSize = 312 + uint32(len(payload))
	}
	buf := make([]byte, 312)
	ne := binary.NativeEndian
	ne.PutUint32(buf[0:], h.version[0])
	ne.PutUint32(buf[4:], h.version[1])
	ne.PutUint32(buf[8:], h.version[2])
	ne.PutUint32(buf[12:], h.dataSize)
	ne.PutUint32(buf[16:], h.dataStart)
	ne.PutUint32(buf[20:], h.targetCount)
	ne.PutUint32(buf[24:], uint32(h.openCount))
	ne.PutUint32(buf[28:], h.flags)
	ne.PutUint32(buf[32:], h.eventNr)
	ne.PutUint64(buf[40:], h.dev)
	copy(buf[48:48+127], h.name)
	copy(buf[176:176+128], h.uuid)
	return append(buf, payload...)
}

// call is one ioctl the fake kernel saw: the request number and a copy of
// the buffer as the caller filled it in.
type call struct {
	req uintptr
	in  []byte
}

func (c call) name() string { return cString(c.in[48 : 48+128]) }

func (c call) dataSize() uint32 { return binary.NativeEndian.Uint32(c.in[12:]) }
func (c call) flags() uint32    { return binary.NativeEndian.Uint32(c.in[28:]) }

// fakeKernel answers ioctls with scripted replies. respond gets the call
// number (0-based) and the request; it returns the reply bytes to copy over
// the caller's buffer, or an errno. Like the kernel, it never writes past
// the buffer the caller offered.
type fakeKernel struct {
	t       testing.TB
	respond func(n int, c call) ([]byte, error)

	mu    sync.Mutex
	calls []call
}

func (k *fakeKernel) ioctl(req uintptr, buf []byte) error {
	k.mu.Lock()
	c := call{req: req, in: append([]byte(nil), buf...)}
	n := len(k.calls)
	k.calls = append(k.calls, c)
	k.mu.Unlock()

	out, err := k.respond(n, c)
	if len(out) > len(buf) {
		k.t.Fatalf("fake kernel: reply of %d bytes for a %d-byte buffer; script a DM_BUFFER_FULL_FLAG reply instead", len(out), len(buf))
	}
	copy(buf, out)
	return err
}

func (k *fakeKernel) control() *Control { return newControl("fake", k.ioctl, nil) }

func (k *fakeKernel) callCount() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.calls)
}

func (k *fakeKernel) call(i int) call {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.calls[i]
}

// replies answers the n-th call with the n-th reply.
func replies(t testing.TB, rs ...[]byte) *fakeKernel {
	return &fakeKernel{t: t, respond: func(n int, _ call) ([]byte, error) {
		if n >= len(rs) {
			t.Fatalf("fake kernel: unexpected call %d", n)
		}
		return rs[n], nil
	}}
}
