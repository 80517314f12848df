package devmapper

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The kernel's numbers for the write commands, written out rather than
// taken from abi.go (abi_linux_test.go checks those against x/sys/unix).
const (
	reqCreate      = 0xc138fd03
	reqRemove      = 0xc138fd04
	reqSuspend     = 0xc138fd06
	reqTableLoad   = 0xc138fd09
	reqTableClear  = 0xc138fd0a
	reqTableStatus = 0xc138fd0c

	dmSkipLockFS  = 0x0400 // DM_SKIP_LOCKFS_FLAG
	dmSecureData  = 0x8000 // DM_SECURE_DATA_FLAG
	dmStatusTable = 0x0010 // DM_STATUS_TABLE_FLAG
)

// secretMarker stands for a key in params; it must never show up in an
// error, a String or a buffer after use.
const secretMarker = "SECRET-KEY-MARKER-0123456789abcdef"

func cryptParams(key string) string { return "aes-xts-plain64 " + key + " 0 7:0 0" }

func (c call) uuid() string        { return cString(c.in[176 : 176+129]) }
func (c call) targetCount() uint32 { return binary.NativeEndian.Uint32(c.in[20:]) }

// step is one expected ioctl and the fake kernel's answer to it.
type step struct {
	req   uintptr
	reply []byte
	err   error
	check func(t *testing.T, c call) // optional
}

// script answers the n-th ioctl with steps[n] after checking it is the
// expected command; control asserts at cleanup that every step ran.
func script(t *testing.T, steps ...step) *fakeKernel {
	k := &fakeKernel{t: t, respond: func(n int, c call) ([]byte, error) {
		if n >= len(steps) {
			t.Fatalf("unexpected ioctl %d: %#x", n, c.req)
		}
		s := steps[n]
		assert.Equal(t, fmt.Sprintf("%#x", s.req), fmt.Sprintf("%#x", c.req), "ioctl %d", n)
		if s.check != nil {
			s.check(t, c)
		}
		return s.reply, s.err
	}}
	t.Cleanup(func() { assert.Equal(t, len(steps), k.callCount(), "ioctls issued") })
	return k
}

// hdr is a header-only kernel reply.
func hdr(h kernelHeader) []byte {
	h.version = v4_48
	return kernelReply(h, nil)
}

// failed is what the buffer holds after a failed secure ioctl: the kernel
// cleared it on copy-in and copies nothing back.
func failed() []byte { return make([]byte, 312) }

var twoTargets = []Target{
	{Start: 0, Length: 8192, Type: "linear", Params: "8:16 2048"},
	{Start: 8192, Length: 16384, Type: "striped", Params: "2 128 8:32 0 8:48 0"},
}

// goldenTwoTargetLoad is the DM_TABLE_LOAD request for twoTargets: each
// spec's next is the distance to the following spec, params padded with
// NULs to the next 8-byte boundary.
func goldenTwoTargetLoad(name string, flags uint32) []byte {
	return kernelReply(kernelHeader{
		version:     [3]uint32{4, 0, 0},
		dataSize:    432, // 312 + 56 + 64
		targetCount: 2,
		flags:       flags,
		name:        name,
	}, cat(
		// spec 0 @0
		u64(0), u64(8192), u32(0),
		u32(56),                // next: 40 + 10 = 50, aligned to 56
		str("linear"), pad(10), // target_type[16]
		str("8:16 2048\x00"), pad(6), // @40 params, 9 bytes + NUL, pad to 56
		// spec 1 @56
		u64(8192), u64(16384), u32(0),
		u32(64),                // next: 40 + 20 = 60, aligned to 64
		str("striped"), pad(9), // target_type[16]
		str("2 128 8:32 0 8:48 0\x00"), pad(4), // @96 params, 19 bytes + NUL, pad to 120
	))
}

func TestCreateSequence(t *testing.T) {
	for _, readOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("readOnly=%v", readOnly), func(t *testing.T) {
			const name, uuid = "vg0-lv0_crypt", "CRYPT-LUKS2-0123-vg0-lv0_crypt"
			loadFlags := uint32(dmSecureData)
			if readOnly {
				loadFlags |= dmReadOnlyFlag
			}
			k := script(t,
				step{req: reqCreate, reply: hdr(kernelHeader{flags: dmSuspendFlag, dev: 0xfd05, name: name, uuid: uuid}),
					check: func(t *testing.T, c call) {
						assert.Equal(t, name, c.name())
						assert.Equal(t, uuid, c.uuid(), "the uuid goes with the create")
						assert.Zero(t, c.flags())
						assert.Equal(t, uint32(312), c.dataSize(), "header only")
					}},
				step{req: reqTableLoad, reply: hdr(kernelHeader{flags: dmSuspendFlag | dmInactive, dev: 0xfd05, name: name, uuid: uuid}),
					check: func(t *testing.T, c call) {
						assert.Equal(t, goldenTwoTargetLoad(name, loadFlags), c.in, "the whole request, byte for byte")
						assert.Empty(t, c.uuid(), "the kernel refuses name and uuid together outside create")
					}},
				step{req: reqSuspend, reply: hdr(kernelHeader{flags: dmActivePresent, targetCount: 2, dev: 0xfd05, name: name, uuid: uuid}),
					check: func(t *testing.T, c call) {
						assert.Equal(t, name, c.name())
						assert.Zero(t, c.flags(), "no DM_SUSPEND_FLAG: a resume")
					}},
			)
			info, err := k.control().Create(context.Background(), name, uuid, twoTargets, readOnly)
			require.NoError(t, err)
			assert.Equal(t, Info{Name: name, UUID: uuid, Major: 253, Minor: 5, TargetCount: 2, LiveTable: true}, info)
		})
	}
}

func TestCreateRemovesHalfMadeDevice(t *testing.T) {
	const name = "vg0-lv0_crypt"
	created := step{req: reqCreate, reply: hdr(kernelHeader{flags: dmSuspendFlag, dev: 0xfd05, name: name})}
	loaded := step{req: reqTableLoad, reply: hdr(kernelHeader{flags: dmSuspendFlag | dmInactive, name: name})}
	removed := step{req: reqRemove, reply: hdr(kernelHeader{name: name}), check: func(t *testing.T, c call) {
		assert.Equal(t, name, c.name())
		assert.Zero(t, c.flags(), "not deferred")
	}}
	targets := []Target{{Start: 0, Length: 8, Type: "crypt", Params: cryptParams(secretMarker)}}

	t.Run("load fails", func(t *testing.T) {
		k := script(t, created, step{req: reqTableLoad, reply: failed(), err: syscall.EINVAL}, removed)
		_, err := k.control().Create(context.Background(), name, "", targets, false)
		require.ErrorIs(t, err, syscall.EINVAL)
		var e *Error
		require.ErrorAs(t, err, &e)
		assert.Equal(t, "DM_TABLE_LOAD", e.Op)
		assert.NotContains(t, err.Error(), secretMarker)
	})
	t.Run("resume fails", func(t *testing.T) {
		k := script(t, created, loaded, step{req: reqSuspend, reply: hdr(kernelHeader{}), err: syscall.EINVAL}, removed)
		_, err := k.control().Create(context.Background(), name, "", targets, false)
		require.ErrorIs(t, err, syscall.EINVAL)
		assert.NotContains(t, err.Error(), secretMarker)
	})
	t.Run("context ends after the create", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		k := script(t, step{req: reqCreate, reply: created.reply, check: func(*testing.T, call) { cancel() }}, removed)
		_, err := k.control().Create(ctx, name, "", targets, false)
		require.ErrorIs(t, err, context.Canceled)
	})
	t.Run("removal fails too", func(t *testing.T) {
		k := script(t, created, step{req: reqTableLoad, reply: failed(), err: syscall.EINVAL},
			step{req: reqRemove, reply: hdr(kernelHeader{}), err: syscall.EBUSY})
		_, err := k.control().Create(context.Background(), name, "", targets, false)
		require.ErrorIs(t, err, syscall.EINVAL, "the load's error decides")
		assert.NotErrorIs(t, err, ErrBusy, "a failed cleanup must not read as a busy device")
		assert.Contains(t, err.Error(), "removing the half-made device also failed")
		assert.NotContains(t, err.Error(), secretMarker)
	})
	t.Run("name taken: the other device stays", func(t *testing.T) {
		k := script(t, step{req: reqCreate, reply: hdr(kernelHeader{}), err: syscall.EBUSY})
		_, err := k.control().Create(context.Background(), name, "", targets, false)
		require.ErrorIs(t, err, ErrExists)
		assert.NotErrorIs(t, err, ErrBusy)
	})
}

func TestReload(t *testing.T) {
	const name = "vg0-lv0_crypt"
	live := func(length uint64, flags uint32) []byte {
		params := "\x00" // a crypt target's status line is empty
		return kernelReply(kernelHeader{version: v4_48, targetCount: 1, flags: dmActivePresent | flags, dev: 0xfd05, name: name},
			cat(u64(0), u64(length), u32(0), u32(48), str("crypt"), pad(11), str(params), pad(7)))
	}
	status := func(length uint64, flags uint32) step {
		return step{req: reqTableStatus, reply: live(length, flags), check: func(t *testing.T, c call) {
			assert.Equal(t, uint32(dmNoFlushFlag|dmSecureData), c.flags(), "status, not table; secure since it is a crypt device")
		}}
	}
	load := func(flags uint32) step {
		return step{req: reqTableLoad, reply: hdr(kernelHeader{flags: dmActivePresent | dmInactive, name: name}), check: func(t *testing.T, c call) {
			assert.Equal(t, flags, c.flags())
			assert.Equal(t, uint32(1), c.targetCount())
			assert.Equal(t, uint64(32768), binary.NativeEndian.Uint64(c.in[312+8:]), "new length")
			assert.Contains(t, string(c.in[312+40:]), secretMarker, "the key goes to the kernel")
		}}
	}
	resume := func(flags uint32) step {
		return step{req: reqSuspend, reply: hdr(kernelHeader{flags: dmActivePresent, name: name}), check: func(t *testing.T, c call) {
			assert.Equal(t, flags, c.flags())
		}}
	}
	grown := []Target{{Start: 0, Length: 32768, Type: "crypt", Params: cryptParams(secretMarker)}}

	t.Run("grow: resume without lockfs and flush", func(t *testing.T) {
		k := script(t, status(16384, 0), load(dmSecureData), resume(dmSkipLockFS|dmNoFlushFlag))
		require.NoError(t, k.control().Reload(context.Background(), name, grown))
	})
	t.Run("read-only device stays read-only", func(t *testing.T) {
		k := script(t, status(16384, dmReadOnlyFlag), load(dmSecureData|dmReadOnlyFlag), resume(dmSkipLockFS|dmNoFlushFlag))
		require.NoError(t, k.control().Reload(context.Background(), name, grown))
	})
	t.Run("same size or shrink: freeze and flush", func(t *testing.T) {
		for _, old := range []uint64{32768, 65536} {
			k := script(t, status(old, 0), load(dmSecureData), resume(0))
			require.NoError(t, k.control().Reload(context.Background(), name, grown))
		}
	})
	clear := step{req: reqTableClear, reply: hdr(kernelHeader{name: name}), check: func(t *testing.T, c call) {
		assert.Equal(t, name, c.name())
	}}
	t.Run("resume fails: inactive table cleared, old table resumed", func(t *testing.T) {
		k := script(t, status(16384, 0), load(dmSecureData),
			step{req: reqSuspend, reply: hdr(kernelHeader{}), err: syscall.EINVAL}, clear, resume(0))
		err := k.control().Reload(context.Background(), name, grown)
		require.ErrorIs(t, err, syscall.EINVAL)
		var e *Error
		require.ErrorAs(t, err, &e)
		assert.Equal(t, "DM_DEV_SUSPEND", e.Op)
		assert.NotContains(t, err.Error(), secretMarker)
	})
	t.Run("context ends during the load", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		l := load(dmSecureData)
		check := l.check
		l.check = func(t *testing.T, c call) { check(t, c); cancel() }
		k := script(t, status(16384, 0), l, clear, resume(0))
		require.ErrorIs(t, k.control().Reload(ctx, name, grown), context.Canceled)
	})
	t.Run("restore fails too", func(t *testing.T) {
		k := script(t, status(16384, 0), load(dmSecureData),
			step{req: reqSuspend, reply: hdr(kernelHeader{}), err: syscall.EINVAL},
			step{req: reqTableClear, reply: hdr(kernelHeader{}), err: syscall.ENXIO},
			step{req: reqSuspend, reply: hdr(kernelHeader{}), err: syscall.ENXIO})
		err := k.control().Reload(context.Background(), name, grown)
		require.ErrorIs(t, err, syscall.EINVAL)
		assert.NotErrorIs(t, err, ErrNotFound)
		assert.Contains(t, err.Error(), "restoring the old table also failed")
		assert.NotContains(t, err.Error(), secretMarker)
	})
	t.Run("missing device: nothing loaded", func(t *testing.T) {
		k := script(t, step{req: reqTableStatus, reply: hdr(kernelHeader{}), err: syscall.ENXIO})
		require.ErrorIs(t, k.control().Reload(context.Background(), name, grown), ErrNotFound)
	})
}

func TestRemove(t *testing.T) {
	tests := []struct {
		errno error
		want  error
	}{
		{nil, nil},
		{syscall.EBUSY, ErrBusy},
		{syscall.ENXIO, ErrNotFound},
	}
	for _, tt := range tests {
		k := script(t, step{req: reqRemove, reply: hdr(kernelHeader{name: "x"}), err: tt.errno, check: func(t *testing.T, c call) {
			assert.Equal(t, "x", c.name())
			assert.Zero(t, c.flags())
		}})
		err := k.control().Remove(context.Background(), "x")
		if tt.want == nil {
			require.NoError(t, err)
			continue
		}
		require.ErrorIs(t, err, tt.want)
		require.ErrorIs(t, err, tt.errno)
	}
}

func TestInvalidTablesSendNothing(t *testing.T) {
	crypt := func(start, length uint64) Target {
		return Target{Start: start, Length: length, Type: "crypt", Params: cryptParams(secretMarker)}
	}
	tests := []struct {
		name    string
		targets []Target
	}{
		{"no targets", nil},
		{"empty type", []Target{{Length: 8}}},
		{"type of 16 bytes", []Target{{Length: 8, Type: "0123456789abcdef"}}},
		{"type with NUL", []Target{{Length: 8, Type: "cry\x00pt"}}},
		{"params with NUL", []Target{{Length: 8, Type: "crypt", Params: cryptParams(secretMarker) + "\x00"}}},
		{"first target not at 0", []Target{crypt(8, 8)}},
		{"gap", []Target{crypt(0, 8), crypt(16, 8)}},
		{"overlap", []Target{crypt(0, 8), crypt(4, 8)}},
		{"empty target", []Target{crypt(0, 0)}},
		{"overflow", []Target{crypt(0, 8), crypt(8, ^uint64(0)-7)}},
		{"too big", []Target{{Length: 8, Type: "crypt", Params: strings.Repeat("k", maxTableSize)}}},
		{"too big together", []Target{
			{Length: 8, Type: "linear", Params: strings.Repeat("k", maxTableSize/2)},
			{Start: 8, Length: 8, Type: "linear", Params: strings.Repeat("k", maxTableSize/2)},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := script(t)
			_, err := k.control().Create(context.Background(), "dev", "", tt.targets, false)
			require.ErrorIs(t, err, ErrInvalidTable)
			assert.NotContains(t, err.Error(), secretMarker)
			err = k.control().Reload(context.Background(), "dev", tt.targets)
			require.ErrorIs(t, err, ErrInvalidTable)
			assert.NotContains(t, err.Error(), secretMarker)
		})
	}
	// A table right at the limit is fine: 312 + 40 + params + NUL.
	ok := []Target{{Length: 8, Type: "linear", Params: strings.Repeat("k", maxTableSize-312-40-1)}}
	require.NoError(t, validateTargets("dev", ok))
}

func TestCreateRefusesNames(t *testing.T) {
	targets := []Target{{Length: 8, Type: "zero"}}
	for _, tc := range []struct{ name, uuid string }{
		{"", ""}, {"a/b", ""}, {".", ""}, {"..", ""}, {"control", ""},
		{strings.Repeat("n", 128), ""}, {"ok", strings.Repeat("u", 129)}, {"ok", "u\x00"},
	} {
		k := script(t)
		_, err := k.control().Create(context.Background(), tc.name, tc.uuid, targets, false)
		require.ErrorIs(t, err, ErrInvalidName, "%q %q", tc.name, tc.uuid)
	}
	require.ErrorIs(t, script(t).control().Remove(context.Background(), ""), ErrInvalidName)
	require.ErrorIs(t, script(t).control().Reload(context.Background(), "", targets), ErrInvalidName)
}

// recordBuffers wraps a fake kernel so the test can look at the caller's
// buffers after the call returned.
func recordBuffers(k *fakeKernel) (*Control, *[][]byte) {
	var bufs [][]byte
	return newControl("fake", func(req uintptr, buf []byte) error {
		bufs = append(bufs, buf)
		return k.ioctl(req, buf)
	}, nil), &bufs
}

func TestSecretsAreWipedAfterUse(t *testing.T) {
	const name = "vg0-lv0_crypt"
	key := strings.Repeat("ab", 64)

	t.Run("table load buffer", func(t *testing.T) {
		k := script(t,
			step{req: reqCreate, reply: hdr(kernelHeader{name: name})},
			step{req: reqTableLoad, reply: hdr(kernelHeader{name: name}), check: func(t *testing.T, c call) {
				assert.Contains(t, string(c.in), key)
			}},
			step{req: reqSuspend, reply: hdr(kernelHeader{name: name})},
		)
		ctl, bufs := recordBuffers(k)
		_, err := ctl.Create(context.Background(), name, "", []Target{{Length: 8, Type: "crypt", Params: cryptParams(key)}}, false)
		require.NoError(t, err)
		require.Len(t, *bufs, 3)
		assert.Equal(t, make([]byte, len((*bufs)[1])), (*bufs)[1], "the load buffer is zeroed")
	})
	t.Run("table reply buffer", func(t *testing.T) {
		k := script(t, step{req: reqTableStatus, reply: cryptTableReply(name, cryptParams(key))})
		ctl, bufs := recordBuffers(k)
		st, err := ctl.Table(context.Background(), name)
		require.NoError(t, err)
		require.Len(t, st.Targets, 1)
		assert.Equal(t, cryptParams(strings.Repeat("0", 128)), st.Targets[0].Params)
		require.Len(t, *bufs, 1)
		assert.False(t, bytes.Contains((*bufs)[0], []byte(key)))
		assert.Equal(t, make([]byte, len((*bufs)[0])), (*bufs)[0], "the reply buffer is zeroed")
	})
}

// cryptTableReply is DM_TABLE_STATUS with DM_STATUS_TABLE_FLAG of a device
// with one crypt target of 16384 sectors: the kernel prints the key.
func cryptTableReply(name, params string) []byte {
	n := 40 + len(params) + 1
	return kernelReply(kernelHeader{version: v4_48, targetCount: 1, flags: dmStatusTable | dmActivePresent, dev: 0xfd05, name: name},
		cat(u64(0), u64(16384), u32(0), u32(uint32((n+7)&^7)), str("crypt"), pad(11), str(params+"\x00")))
}

func TestTableRedactsKeys(t *testing.T) {
	key := strings.Repeat("0f", 32)
	zeros := strings.Repeat("0", 64)
	tests := []struct {
		typ, params, want string
	}{
		{"crypt", "aes-xts-plain64 " + key + " 0 253:2 32768", "aes-xts-plain64 " + zeros + " 0 253:2 32768"},
		{"crypt", "aes-xts-plain64 " + key + " 0 253:2 32768 1 allow_discards", "aes-xts-plain64 " + zeros + " 0 253:2 32768 1 allow_discards"},
		{"crypt", "capi:xts(aes)-plain64 :64:logon:cryptsetup:0f-d0 0 7:0 4096", "capi:xts(aes)-plain64 :64:logon:cryptsetup:0f-d0 0 7:0 4096"},
		{"crypt", "aes-xts-plain64 " + key, "aes-xts-plain64 " + zeros},
		{"crypt", "aes-xts-plain64", "aes-xts-plain64"},
		{"crypt", "", ""},
		{"integrity", "7:0 0 32 J 3 internal_hash:hmac(sha256):" + key + " journal_crypt:ctr(aes):" + key + " journal_mac:hmac(sha256):" + key,
			"7:0 0 32 J 3 internal_hash:hmac(sha256):" + zeros + " journal_crypt:ctr(aes):" + zeros + " journal_mac:hmac(sha256):" + zeros},
		{"integrity", "7:0 0 4 J 1 internal_hash:crc32c", "7:0 0 4 J 1 internal_hash:crc32c"},
		{"linear", "7:0 " + key, "7:0 " + key},
	}
	for _, tt := range tests {
		p := []byte(tt.params)
		redactKeys(tt.typ, p)
		assert.Equal(t, tt.want, string(p), "%s %s", tt.typ, tt.params)
	}

	// Through Table, on a reply that has the key.
	k := script(t, step{req: reqTableStatus, reply: cryptTableReply("c", tests[1].params), check: func(t *testing.T, c call) {
		assert.Equal(t, uint32(dmStatusTable|dmSecureData), c.flags())
	}})
	st, err := k.control().Table(context.Background(), "c")
	require.NoError(t, err)
	require.Len(t, st.Targets, 1)
	assert.Equal(t, tests[1].want, st.Targets[0].Params)
}

func TestTargetFormattingHidesParams(t *testing.T) {
	tg := Target{Start: 0, Length: 8, Type: "crypt", Params: cryptParams(secretMarker)}
	for _, s := range []string{
		fmt.Sprint(tg), fmt.Sprintf("%v %+v %#v %s", tg, tg, tg, tg),
		fmt.Sprintf("%v %+v %#v", []Target{tg}, []Target{tg}, []Target{tg}),
		fmt.Sprintf("%v %+v", DeviceStatus{Targets: []Target{tg}}, DeviceStatus{Targets: []Target{tg}}),
	} {
		assert.NotContains(t, s, secretMarker)
		assert.Contains(t, s, "crypt")
	}
	assert.Equal(t, "0 8 crypt <58 bytes of params>", tg.String())
}

// kernelReadTable walks a DM_TABLE_LOAD buffer the way dm-ioctl.c's
// populate_table and next_target do: the first spec at data_start from the
// header, each following one at next bytes from the one before; a spec and
// a NUL must fit before data_size, next must be 8-aligned, params must be
// NUL-terminated within the buffer.
func kernelReadTable(buf []byte) ([]Target, error) {
	ne := binary.NativeEndian
	size := int(ne.Uint32(buf[12:]))
	if size != len(buf) {
		return nil, fmt.Errorf("data_size %d, buffer %d", size, len(buf))
	}
	count := int(ne.Uint32(buf[20:]))
	if count == 0 {
		return nil, errors.New("no targets specified")
	}
	var out []Target
	last, next := 0, int(ne.Uint32(buf[16:]))
	for range count {
		if size-last-40 <= next {
			return nil, errors.New("target spec extends beyond end of parameters")
		}
		if next%8 != 0 {
			return nil, fmt.Errorf("next %d not 8-byte aligned", next)
		}
		spec := last + next
		n := bytes.IndexByte(buf[spec+40:], 0)
		if n < 0 {
			return nil, errors.New("unterminated params")
		}
		out = append(out, Target{
			Start:  ne.Uint64(buf[spec:]),
			Length: ne.Uint64(buf[spec+8:]),
			Type:   cString(buf[spec+24 : spec+40]),
			Params: string(buf[spec+40 : spec+40+n]),
		})
		last, next = spec, int(ne.Uint32(buf[spec+20:]))
	}
	return out, nil
}

func TestEncodedTableReadsBackAsTheKernelReadsIt(t *testing.T) {
	for _, targets := range [][]Target{
		twoTargets,
		{{Length: 8, Type: "zero"}},
		{{Length: 8, Type: "0123456789abcde", Params: "1234567"}}, // 40 + 8: exactly aligned
		{{Length: 1, Type: "error"}, {Start: 1, Length: 2, Type: "crypt", Params: cryptParams(strings.Repeat("ab", 32))}, {Start: 3, Length: 4, Type: "zero"}},
	} {
		buf := encodeLoad(targets)
		got, err := kernelReadTable(buf)
		require.NoError(t, err)
		assert.Equal(t, targets, got)
	}
}

func encodeLoad(targets []Target) []byte {
	buf := make([]byte, 312+tableSize(targets))
	encodeRequest(buf, request{name: "dev", flags: flagSecureData, targets: targets})
	return buf
}
