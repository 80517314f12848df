package devmapper

import (
	"context"
	"encoding/binary"
	"fmt"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func thinStatusReply(name string, minor uint64, params string) []byte {
	payload := cat(u64(0), u64(2097152), u32(0), u32(0), str("thin"), pad(12), str(params+"\x00"))
	return kernelReply(kernelHeader{
		version: v4_48, targetCount: 1, openCount: 1, flags: dmNoFlushFlag | dmActivePresent,
		dev: 0xfd00 | minor, name: name,
	}, payload)
}

// byName answers DM_LIST_DEVICES with list and DM_TABLE_STATUS from
// status, keyed by the requested name; names missing there get ENXIO, as
// for a device removed since the list.
func byName(t testing.TB, list []byte, status map[string][]byte) *fakeKernel {
	return &fakeKernel{t: t, respond: func(_ int, c call) ([]byte, error) {
		switch c.req {
		case ioctlListDevices:
			return list, nil
		case ioctlTableStatus:
			if r, ok := status[c.name()]; ok {
				return r, nil
			}
			return kernelReply(kernelHeader{version: v4_48}, nil)[:12], syscall.ENXIO
		}
		t.Fatalf("unexpected ioctl %#x", c.req)
		return nil, nil
	}}
}

func TestStatusAll(t *testing.T) {
	k := byName(t, goldenListReplyNew(), map[string][]byte{
		"vg0-pool":  goldenThinPoolStatusReply(), // reused golden: its header names vg0-pool-tpool
		"big-minor": thinStatusReply("big-minor", 0x2c|0x100000, "2048 2047"),
		// vg0-thin1 vanished between the list and its status query.
	})
	got, err := k.control().StatusAll(context.Background())
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, "vg0-pool-tpool", got[0].Info.Name)
	assert.Equal(t, "thin-pool", got[0].Targets[0].Type)
	assert.Equal(t, "big-minor", got[1].Info.Name)
	assert.Equal(t, "2048 2047", got[1].Targets[0].Params)

	assert.Equal(t, 4, k.callCount(), "one list and one status per device, no separate info")
	for i, name := range []string{"vg0-pool", "vg0-thin1", "big-minor"} {
		assert.Equal(t, name, k.call(i+1).name())
		assert.Equal(t, uint32(dmNoFlushFlag), k.call(i+1).flags())
	}
}

func TestStatusAllFailsOnOtherErrors(t *testing.T) {
	k := &fakeKernel{t: t, respond: func(n int, c call) ([]byte, error) {
		if c.req == ioctlListDevices {
			return goldenListReplyOld(), nil
		}
		return kernelReply(kernelHeader{version: v4_48}, nil)[:12], syscall.EIO
	}}
	_, err := k.control().StatusAll(context.Background())
	require.ErrorIs(t, err, syscall.EIO)
}

func TestStatusAllStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	k := &fakeKernel{t: t, respond: func(n int, c call) ([]byte, error) {
		if c.req == ioctlListDevices {
			cancel() // cancelled while the list is in flight
			return goldenListReplyOld(), nil
		}
		t.Fatal("no status query after cancel")
		return nil, nil
	}}
	_, err := k.control().StatusAll(ctx)
	require.ErrorIs(t, err, context.Canceled)
}

// listReply builds a 5.15-layout device list of n devices named
// dev-000...; test-side encoding for the benchmark only.
func listReply(n int) ([]byte, []string) {
	var payload []byte
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("vg0-thin-%03d", i)
		rec := cat(u64(0xfd00|uint64(i)), u32(0), str(names[i]+"\x00"))
		rec = append(rec, pad((8-len(rec)%8)%8)...)
		rec = append(rec, cat(u32(uint32(i)), u32(nlDoesntHaveUUID))...)
		if i < n-1 {
			binary.NativeEndian.PutUint32(rec[8:], uint32(len(rec)))
		}
		payload = append(payload, rec...)
	}
	return kernelReply(kernelHeader{version: v4_48, flags: dmUUIDFlag}, payload), names
}

func TestListReplyBuilder(t *testing.T) {
	list, names := listReply(5)
	devs, err := replies(t, list).control().List(context.Background())
	require.NoError(t, err)
	require.Len(t, devs, 5)
	for i, d := range devs {
		assert.Equal(t, names[i], d.Name)
		assert.Equal(t, uint32(i), d.Minor)
		assert.Equal(t, uint32(i), d.EventNr)
	}
}

// BenchmarkStatusAll measures the client side of a poll of 100 thin
// volumes: encoding, decoding and allocation, with the kernel replaced by
// a copy of canned replies.
func BenchmarkStatusAll(b *testing.B) {
	list, names := listReply(100)
	status := make(map[string][]byte, len(names))
	for i, n := range names {
		status[n] = thinStatusReply(n, uint64(i), "1310720 20971519")
	}
	ioctl := func(req uintptr, buf []byte) error {
		if req == ioctlListDevices {
			copy(buf, list)
			return nil
		}
		copy(buf, status[cString(buf[48:176])])
		return nil
	}
	c := newControl("bench", ioctl, nil)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		got, err := c.StatusAll(ctx)
		if err != nil || len(got) != 100 {
			b.Fatalf("StatusAll: %d devices, %v", len(got), err)
		}
	}
}
