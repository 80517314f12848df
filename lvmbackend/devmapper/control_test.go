package devmapper

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBufferFullRetry: the kernel answers a too-small buffer with success,
// DM_BUFFER_FULL_FLAG and no payload; the client must ask again with a
// bigger buffer and use only the second answer.
func TestBufferFullRetry(t *testing.T) {
	full := kernelReply(kernelHeader{version: v4_48, dataSize: 305, flags: dmUUIDFlag | dmBufferFull}, nil)
	k := replies(t, full, goldenListReplyNew())
	devs, err := k.control().List(context.Background())
	require.NoError(t, err)
	require.Len(t, devs, 3)
	assert.Equal(t, "big-minor", devs[2].Name)

	require.Equal(t, 2, k.callCount())
	assert.Equal(t, uint32(16384), k.call(0).dataSize())
	assert.Equal(t, uint32(32768), k.call(1).dataSize(), "doubled")
	assert.Len(t, k.call(1).in, 32768)
	assert.Equal(t, uint32(dmUUIDFlag), k.call(1).flags(), "the retry is the same request; the kernel clears BUFFER_FULL itself")
}

func TestBufferFullRetryOnStatusWithPartialPayload(t *testing.T) {
	// retrieve_status sets BUFFER_FULL after writing the targets that fit
	// and reports the full target_count; none of it may be used.
	partial := kernelReply(kernelHeader{version: v4_48, targetCount: 2, flags: dmNoFlushFlag | dmActivePresent | dmBufferFull, name: "vg0-mixed"},
		cat(u64(0), u64(8192), u32(0), u32(48), str("linear"), pad(10), str("\x00")))
	k := replies(t, partial, goldenTwoTargetStatusReply())
	got, err := k.control().Status(context.Background(), "vg0-mixed")
	require.NoError(t, err)
	require.Len(t, got.Targets, 2)
	assert.Equal(t, "striped", got.Targets[1].Type)
}

func TestBufferFullGivesUpAtCap(t *testing.T) {
	full := kernelReply(kernelHeader{version: v4_48, dataSize: 305, flags: dmBufferFull}, nil)
	k := &fakeKernel{t: t, respond: func(int, call) ([]byte, error) { return full, nil }}
	_, err := k.control().List(context.Background())
	require.ErrorIs(t, err, ErrReplyTooLarge)

	// 16 KiB doubling to 32 MiB is 12 attempts.
	require.Equal(t, 12, k.callCount())
	assert.Equal(t, uint32(32<<20), k.call(11).dataSize())
}

func TestReplyDataSizeBeyondBufferIsMalformed(t *testing.T) {
	k := replies(t, kernelReply(kernelHeader{version: v4_48, dataSize: 1 << 20}, nil))
	_, err := k.control().List(context.Background())
	require.ErrorIs(t, err, ErrMalformed)
}

func TestIoctlErrorKinds(t *testing.T) {
	tests := []struct {
		name     string
		errno    syscall.Errno
		version  [3]uint32 // what the kernel wrote back before failing
		wantKind error
	}{
		{"missing device", syscall.ENXIO, v4_48, ErrNotFound},
		{"no CAP_SYS_ADMIN", syscall.EACCES, v4_48, ErrPermission},
		{"not a dm control node", syscall.ENOTTY, [3]uint32{}, ErrUnsupported},
		{"interface 5", syscall.EINVAL, [3]uint32{5, 0, 0}, ErrUnsupported},
		{"EINVAL from a 4.x kernel", syscall.EINVAL, v4_48, nil},
		{"EBUSY", syscall.EBUSY, v4_48, ErrBusy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := &fakeKernel{t: t, respond: func(int, call) ([]byte, error) {
				return kernelReply(kernelHeader{version: tt.version}, nil)[:12], tt.errno
			}}
			_, err := k.control().Info(context.Background(), "vg0-lv0")
			require.Error(t, err)
			assert.ErrorIs(t, err, tt.errno, "the errno stays reachable")
			var e *Error
			require.ErrorAs(t, err, &e)
			assert.Equal(t, "DM_DEV_STATUS", e.Op)
			assert.Equal(t, "vg0-lv0", e.Target)
			if tt.wantKind == nil {
				assert.Nil(t, e.Kind)
				return
			}
			assert.ErrorIs(t, err, tt.wantKind)
		})
	}
}

func TestVersion(t *testing.T) {
	k := replies(t, kernelReply(kernelHeader{version: v4_48}, nil)[:312])
	v, err := k.control().Version(context.Background())
	require.NoError(t, err)
	assert.Equal(t, Version{4, 48, 0}, v)
	assert.Equal(t, "4.48.0", v.String())
	assert.True(t, v.AtLeast(4, 45))
	assert.False(t, v.AtLeast(4, 49))
	assert.True(t, v.AtLeast(3, 99))
	assert.Equal(t, uintptr(0xc138fd00), k.call(0).req, "DM_VERSION")
}

func TestCheckVersionRefusesOtherMajor(t *testing.T) {
	k := replies(t, kernelReply(kernelHeader{version: [3]uint32{5, 0, 0}}, nil)[:312])
	err := k.control().checkVersion(context.Background())
	require.ErrorIs(t, err, ErrUnsupported)
}

func TestClosedControl(t *testing.T) {
	closes := 0
	k := replies(t)
	c := newControl("fake", k.ioctl, func() error { closes++; return nil })
	assert.Equal(t, "fake", c.Path())
	require.NoError(t, c.Close())
	require.NoError(t, c.Close())
	assert.Equal(t, 1, closes)

	_, err := c.List(context.Background())
	require.ErrorIs(t, err, ErrClosed)
	_, err = c.Info(context.Background(), "x")
	require.ErrorIs(t, err, ErrClosed)
	assert.Zero(t, k.callCount())
}

func TestCancelledContextStopsBeforeIoctl(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	k := replies(t)
	_, err := k.control().List(ctx)
	require.ErrorIs(t, err, context.Canceled)
	assert.Zero(t, k.callCount())
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	regular := filepath.Join(dir, "regular")
	require.NoError(t, os.WriteFile(regular, nil, 0o600))

	tests := []struct {
		name     string
		path     string
		wantKind error
		wantErr  error
	}{
		{"missing node", filepath.Join(dir, "control"), ErrNoControl, fs.ErrNotExist},
		{"missing directory", "/nonexistent/mapper/control", ErrNoControl, fs.ErrNotExist},
		// A node that opens but is not dm: the first ioctl says ENOTTY.
		{"regular file", regular, ErrUnsupported, syscall.ENOTTY},
		{"character device that is not dm", "/dev/null", ErrUnsupported, syscall.ENOTTY},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Open(tt.path)
			require.Error(t, err)
			assert.Nil(t, c)
			assert.ErrorIs(t, err, tt.wantKind)
			assert.ErrorIs(t, err, tt.wantErr)
			var e *Error
			require.ErrorAs(t, err, &e)
			assert.Equal(t, tt.path, e.Target, "the error names the node")
			t.Log(err)
		})
	}
}

// Open of the default path, wherever the tests run: without the node (the
// development host and CI have no device-mapper) Open says ErrNoControl, and
// so it does when the node exists but no driver is behind it (installing
// lvm2 or dmsetup makes the node on a host without dm-mod: ENODEV); as a
// user on a host that has it, ErrPermission (the node is root's, mode
// 0600); as root (the test guest), it opens.
func TestOpenDefaultPath(t *testing.T) {
	c, err := Open("")
	_, statErr := os.Stat(DefaultControlPath)
	_, driverErr := os.Stat("/sys/class/misc/device-mapper")
	switch {
	case errors.Is(statErr, fs.ErrNotExist):
		require.ErrorIs(t, err, ErrNoControl)
		assert.Contains(t, err.Error(), DefaultControlPath)
	case errors.Is(driverErr, fs.ErrNotExist):
		require.ErrorIs(t, err, ErrNoControl)
		assert.ErrorIs(t, err, syscall.ENODEV)
	case os.Geteuid() != 0:
		require.ErrorIs(t, err, ErrPermission)
		assert.ErrorIs(t, err, fs.ErrPermission)
	default:
		require.NoError(t, err)
		assert.NoError(t, c.Close())
	}
}

func TestErrorMessage(t *testing.T) {
	e := &Error{Op: "DM_DEV_STATUS", Target: "vg0-lv0", Kind: ErrNotFound, Err: syscall.ENXIO}
	assert.Equal(t, "devmapper: DM_DEV_STATUS vg0-lv0: device-mapper device not found: no such device or address", e.Error())
	assert.Equal(t, "devmapper: DM_LIST_DEVICES: boom", (&Error{Op: "DM_LIST_DEVICES", Err: errors.New("boom")}).Error())
}

func TestOpenErrorKinds(t *testing.T) {
	tests := []struct {
		errno syscall.Errno
		want  error
	}{
		{syscall.ENOENT, ErrNoControl},
		{syscall.ENODEV, ErrNoControl}, // node present, dm-mod not loaded
		{syscall.ENXIO, ErrNoControl},
		{syscall.EACCES, ErrPermission}, // also a nodev mount
		{syscall.EPERM, ErrPermission},
		{syscall.EISDIR, nil},
	}
	for _, tt := range tests {
		err := &fs.PathError{Op: "open", Path: "/dev/mapper/control", Err: tt.errno}
		assert.Equal(t, tt.want, openErrorKind(err), tt.errno.Error())
	}
}
