package devmapper

import (
	"context"
	"encoding/binary"
	"strings"
	"syscall"
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
	assert.Equal(t, uint32(0x8010), k.call(0).flags(), "DM_STATUS_TABLE_FLAG and DM_SECURE_DATA_FLAG, no DM_NOFLUSH_FLAG")
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

// tableReply is DM_TABLE_STATUS with DM_STATUS_TABLE_FLAG of a device with
// one target of type typ (at most 15 bytes) and table params.
func tableReply(name, typ, params string) []byte {
	return kernelReply(kernelHeader{version: v4_48, targetCount: 1, flags: 0x10 | dmActivePresent, dev: 0xfd02, name: name}, cat(
		u64(0), u64(2097152), u32(0), u32(0), // next unused: one target
		str(typ), pad(16-len(typ)),
		str(params), str("\x00"),
	))
}

// poolKernel answers DM_TABLE_STATUS from a table per device name; a name
// without one gets ENXIO, as from the kernel for a missing device.
func poolKernel(t *testing.T, tables map[string][2]string) *fakeKernel {
	return &fakeKernel{t: t, respond: func(_ int, c call) ([]byte, error) {
		assert.Equal(t, uintptr(0xc138fd0c), c.req, "DM_TABLE_STATUS")
		assert.Equal(t, uint32(0x8010), c.flags(), "DM_STATUS_TABLE_FLAG | DM_SECURE_DATA_FLAG")
		tb, ok := tables[c.name()]
		if !ok {
			return kernelReply(kernelHeader{version: v4_48}, nil)[:312], syscall.ENXIO
		}
		return tableReply(c.name(), tb[0], tb[1]), nil
	}}
}

func TestThinPoolZeroing(t *testing.T) {
	const zeroing, skipping = "253:0 253:1 128 0 0 ", "253:0 253:1 128 0 1 skip_block_zeroing "
	tests := []struct {
		name   string
		tables map[string][2]string
		want   bool
		reads  []string // devices queried, in order
	}{
		{
			name: "used pool: the -tpool layer, -Z y",
			tables: map[string][2]string{
				"vg0-pool-tpool": {"thin-pool", zeroing},
				"vg0-pool":       {"linear", "253:2 0"},
			},
			want: true, reads: []string{"vg0-pool-tpool"},
		},
		{
			name:   "used pool: the -tpool layer, -Z n, only thin volumes active",
			tables: map[string][2]string{"vg0-pool-tpool": {"thin-pool", skipping}},
			want:   false, reads: []string{"vg0-pool-tpool"},
		},
		{
			name:   "new pool: no layer, the pool device is the thin-pool, -Z y",
			tables: map[string][2]string{"vg0-pool": {"thin-pool", zeroing}},
			want:   true, reads: []string{"vg0-pool-tpool", "vg0-pool"},
		},
		{
			name:   "new pool: no layer, -Z n",
			tables: map[string][2]string{"vg0-pool": {"thin-pool", skipping}},
			want:   false, reads: []string{"vg0-pool-tpool", "vg0-pool"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := poolKernel(t, tt.tables)
			got, err := k.control().ThinPoolZeroing(context.Background(), "vg0-pool")
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			var reads []string
			for i := range k.callCount() {
				reads = append(reads, k.call(i).name())
			}
			assert.Equal(t, tt.reads, reads)
		})
	}
}

func TestThinPoolZeroingNotAPool(t *testing.T) {
	for name, tables := range map[string]map[string][2]string{
		"no such device":        nil,
		"linear LV":             {"vg0-pool": {"linear", "8:16 2048"}},
		"-tpool without a pool": {"vg0-pool-tpool": {"linear", "8:16 2048"}, "vg0-pool": {"linear", "253:2 0"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := poolKernel(t, tables).control().ThinPoolZeroing(context.Background(), "vg0-pool")
			require.ErrorIs(t, err, ErrNotThinPool)
			require.ErrorIs(t, err, ErrNotFound)
			var e *Error
			require.ErrorAs(t, err, &e)
			assert.Equal(t, "vg0-pool", e.Target)
		})
	}

	t.Run("no live table", func(t *testing.T) {
		k := &fakeKernel{t: t, respond: func(_ int, c call) ([]byte, error) {
			if c.name() == "vg0-pool" {
				return goldenNoTableStatusReply(), nil
			}
			return kernelReply(kernelHeader{version: v4_48}, nil)[:312], syscall.ENXIO
		}}
		_, err := k.control().ThinPoolZeroing(context.Background(), "vg0-pool")
		require.ErrorIs(t, err, ErrNotThinPool)
	})
}

func TestThinPoolZeroingErrors(t *testing.T) {
	t.Run("unparsable table", func(t *testing.T) {
		k := poolKernel(t, map[string][2]string{"vg0-pool-tpool": {"thin-pool", "253:0 253:1 128 0 2 skip_block_zeroing"}})
		_, err := k.control().ThinPoolZeroing(context.Background(), "vg0-pool")
		require.ErrorIs(t, err, ErrInvalidStatus)
		assert.NotErrorIs(t, err, ErrNotThinPool)
		var e *Error
		require.ErrorAs(t, err, &e)
		assert.Equal(t, "vg0-pool-tpool", e.Target)
	})
	t.Run("permission is not a missing pool", func(t *testing.T) {
		k := &fakeKernel{t: t, respond: func(int, call) ([]byte, error) {
			return kernelReply(kernelHeader{version: v4_48}, nil)[:312], syscall.EACCES
		}}
		_, err := k.control().ThinPoolZeroing(context.Background(), "vg0-pool")
		require.ErrorIs(t, err, ErrPermission)
		assert.NotErrorIs(t, err, ErrNotThinPool)
		assert.Equal(t, 1, k.callCount(), "no fallback to the pool device")
	})
	t.Run("invalid name", func(t *testing.T) {
		k := replies(t)
		_, err := k.control().ThinPoolZeroing(context.Background(), "")
		require.ErrorIs(t, err, ErrInvalidName)
		assert.Zero(t, k.callCount())
	})
	t.Run("-tpool name too long for the kernel: only the pool device", func(t *testing.T) {
		name := strings.Repeat("a", 127)
		k := poolKernel(t, map[string][2]string{name: {"thin-pool", "253:0 253:1 128 0 1 skip_block_zeroing"}})
		got, err := k.control().ThinPoolZeroing(context.Background(), name)
		require.NoError(t, err)
		assert.False(t, got)
		assert.Equal(t, 1, k.callCount())
	})
}
