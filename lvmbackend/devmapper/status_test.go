package devmapper

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStatusDecodesGoldenReplies(t *testing.T) {
	tests := []struct {
		name  string
		reply []byte
		want  DeviceStatus
	}{
		{
			name:  "thin-pool",
			reply: goldenThinPoolStatusReply(),
			want: DeviceStatus{
				Info: Info{
					Name: "vg0-pool-tpool", UUID: "LVM-0123456789abcdef-tpool",
					Major: 253, Minor: 2, OpenCount: 2, EventNr: 5, TargetCount: 1,
					LiveTable: true,
				},
				Targets: []Target{{Start: 0, Length: 2097152, Type: "thin-pool", Params: goldenThinPoolParams}},
			},
		},
		{
			name:  "linear then striped",
			reply: goldenTwoTargetStatusReply(),
			want: DeviceStatus{
				Info: Info{Name: "vg0-mixed", Major: 253, Minor: 7, TargetCount: 2, LiveTable: true, ReadOnly: true},
				Targets: []Target{
					{Start: 0, Length: 8192, Type: "linear", Params: ""},
					{Start: 8192, Length: 16384, Type: "striped", Params: "2 8:16 8:32 1 AA"},
				},
			},
		},
		{
			name:  "no live table",
			reply: goldenNoTableStatusReply(),
			want: DeviceStatus{
				Info: Info{Name: "empty", Major: 253, Minor: 9, Suspended: true, InactiveTable: true},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := replies(t, tt.reply)
			got, err := k.control().Status(context.Background(), tt.want.Info.Name)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// TestStatusRequestBytes pins the request header down to the byte: the
// kernel rejects or misreads anything else.
func TestStatusRequestBytes(t *testing.T) {
	k := replies(t, goldenThinPoolStatusReply())
	_, err := k.control().Status(context.Background(), "vg0-pool-tpool")
	require.NoError(t, err)

	want := make([]byte, 312)
	ne := binary.NativeEndian
	ne.PutUint32(want[0:], 4)      // version[0]
	ne.PutUint32(want[4:], 0)      // version[1]: 4.0.0 is accepted by every 4.x kernel
	ne.PutUint32(want[12:], 16384) // data_size: the whole buffer
	ne.PutUint32(want[16:], 312)   // data_start
	ne.PutUint32(want[28:], 0x800) // flags: DM_NOFLUSH_FLAG
	copy(want[48:], "vg0-pool-tpool")

	c := k.call(0)
	assert.Equal(t, uintptr(0xc138fd0c), c.req, "DM_TABLE_STATUS")
	require.Len(t, c.in, 16384)
	assert.Equal(t, want, c.in[:312])
	assert.Equal(t, make([]byte, 16384-312), c.in[312:], "payload area is zeroed")
}

func TestTableSetsStatusTableFlag(t *testing.T) {
	reply := kernelReply(kernelHeader{version: v4_48, targetCount: 1, flags: 0x10 | dmActivePresent, dev: 0xfd02, name: "vg0-pool-tpool"}, cat(
		u64(0), u64(2097152), u32(0), u32(64),
		str("thin-pool"), pad(7),
		str("253:0 253:1 128 0 1 skip_block_zeroing \x00"), // 40 bytes + NUL at 40..81
	))
	k := replies(t, reply)
	got, err := k.control().Table(context.Background(), "vg0-pool-tpool")
	require.NoError(t, err)
	require.Len(t, got.Targets, 1)
	assert.Equal(t, "253:0 253:1 128 0 1 skip_block_zeroing ", got.Targets[0].Params)
	assert.Equal(t, uint32(0x10), k.call(0).flags(), "DM_STATUS_TABLE_FLAG, no DM_NOFLUSH_FLAG")
}

func TestDecodeTargetsRejectsMalformed(t *testing.T) {
	spec := func(next uint32, typ, params string) []byte {
		return cat(u64(0), u64(8), u32(0), u32(next), str(typ), pad(16-len(typ)), str(params))
	}
	tests := []struct {
		name    string
		count   uint32
		payload []byte
	}{
		{"targets but no payload", 1, nil},
		{"second spec missing", 2, spec(48, "linear", "\x00")},
		{"next points backwards", 2, cat(spec(0, "linear", "\x00"), pad(7), spec(0, "linear", "\x00"))},
		{"next points into params", 2, cat(spec(40, "linear", "\x00"), pad(7), spec(0, "linear", "\x00"))},
		{"unterminated params", 1, spec(0, "thin", "1024 2047")},
		{"spec cut short", 1, cat(u64(0), u64(8))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := replies(t, kernelReply(kernelHeader{version: v4_48, targetCount: tt.count, name: "d"}, tt.payload))
			_, err := k.control().Status(context.Background(), "d")
			require.ErrorIs(t, err, ErrMalformed)
		})
	}
}

func TestDecodeTargetsHugeCountDoesNotAllocate(t *testing.T) {
	// A corrupt target_count must fail on the payload, not size a slice.
	buf := kernelReply(kernelHeader{version: v4_48, targetCount: 0xffffffff}, cat(u64(0), u64(8), u32(0), u32(48), str("linear"), pad(10), str("\x00")))
	allocs := testing.AllocsPerRun(10, func() {
		_, err := decodeTargets(buf, decodeHeader(buf))
		require.ErrorIs(t, err, ErrMalformed)
	})
	assert.Less(t, allocs, 20.0)
}

func TestInfoDecodesHeader(t *testing.T) {
	reply := kernelReply(kernelHeader{
		version: v4_48, dataSize: 305, targetCount: 1, openCount: 1,
		flags:   dmActivePresent | dmSuspendFlag | 0x40000 /* internal suspend */ | 0x20000, /* deferred remove */
		eventNr: 9, dev: 0xfd03, name: "vg0-thin1", uuid: "LVM-abc",
	}, nil)
	k := replies(t, reply)
	got, err := k.control().Info(context.Background(), "vg0-thin1")
	require.NoError(t, err)
	assert.Equal(t, Info{
		Name: "vg0-thin1", UUID: "LVM-abc", Major: 253, Minor: 3, OpenCount: 1, EventNr: 9, TargetCount: 1,
		LiveTable: true, Suspended: true, InternalSuspend: true, DeferredRemove: true,
	}, got)
	assert.Equal(t, "L-sw", got.Attr())

	c := k.call(0)
	assert.Equal(t, uintptr(0xc138fd07), c.req, "DM_DEV_STATUS")
	assert.Len(t, c.in, 312, "DM_DEV_STATUS needs the header only")
	assert.Equal(t, "vg0-thin1", c.name())
}

// InfoByDevice names the device by dev_t and no name; the kernel's reply
// carries the name.
func TestInfoByDevice(t *testing.T) {
	k := replies(t, kernelReply(kernelHeader{version: v4_48, dataSize: 305, flags: dmActivePresent, dev: 0x10fd2c, name: "vg0-lv300"}, nil))
	got, err := k.control().InfoByDevice(context.Background(), 253, 300)
	require.NoError(t, err)
	assert.Equal(t, Info{Name: "vg0-lv300", Major: 253, Minor: 300, LiveTable: true}, got)

	c := k.call(0)
	assert.Equal(t, uintptr(0xc138fd07), c.req, "DM_DEV_STATUS")
	assert.Empty(t, c.name())
	assert.Equal(t, uint64(0x10fd2c), binary.NativeEndian.Uint64(c.in[40:]), "dev")
}

func TestInfoAttr(t *testing.T) {
	tests := []struct {
		info Info
		want string
	}{
		{Info{}, "---w"},
		{Info{LiveTable: true}, "L--w"},
		{Info{LiveTable: true, InactiveTable: true, Suspended: true, ReadOnly: true}, "LIsr"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, tt.info.Attr())
	}
}

func TestDeviceNameValidation(t *testing.T) {
	long := make([]byte, 128)
	for i := range long {
		long[i] = 'a'
	}
	tests := []struct {
		name string
		ok   bool
	}{
		{"", false},
		{string(long[:127]), true},
		{string(long), false},
		{"a\x00b", false},
	}
	for _, tt := range tests {
		k := &fakeKernel{t: t, respond: func(int, call) ([]byte, error) {
			return kernelReply(kernelHeader{version: v4_48, dataSize: 305}, nil), nil
		}}
		c := k.control()
		_, infoErr := c.Info(context.Background(), tt.name)
		_, statusErr := c.Status(context.Background(), tt.name)
		if tt.ok {
			assert.NoError(t, infoErr)
			assert.NoError(t, statusErr)
			continue
		}
		assert.ErrorIs(t, infoErr, ErrInvalidName)
		assert.ErrorIs(t, statusErr, ErrInvalidName)
		assert.Zero(t, k.callCount(), "an invalid name never reaches the kernel")
	}
}

func TestGoldenStatusReplyLengths(t *testing.T) {
	// Guards the hand arithmetic in golden_test.go.
	assert.Len(t, goldenThinPoolStatusReply(), 421)
	assert.Len(t, goldenTwoTargetStatusReply(), 417)
}
