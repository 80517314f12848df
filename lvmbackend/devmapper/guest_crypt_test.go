//go:build guest

package devmapper

// TestGuestCrypt drives the write side against a real kernel: a dm-crypt
// mapping over a loop device, made, grown and removed by Create, Reload and
// Remove, checked through the block devices themselves and against
// dmsetup. Needs dm-crypt and the aes/xts ciphers in the guest kernel.

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestGuestCrypt(t *testing.T) {
	ctl := openGuest(t, "dmsetup", "losetup")
	ctx := context.Background()
	name := fmt.Sprintf("lvmagent-dmtest-%d-crypt", os.Getpid())
	uuid := "LVMAGENT-TEST-CRYPT-" + name
	t.Cleanup(func() {
		if err := ctl.Remove(context.Background(), name); err != nil && !errors.Is(err, ErrNotFound) {
			dmsetupCleanup(t, "remove", "--retry", name)
		}
	})

	img := filepath.Join(t.TempDir(), "crypt.img")
	loop := loopDevice(t, img, 8<<20)
	var st unix.Stat_t
	require.NoError(t, unix.Stat(loop, &st))
	key := make([]byte, 64) // aes-xts-plain64 with a 512-bit key: AES-256-XTS
	for i := range key {
		key[i] = byte(i)
	}
	keyHex := hex.EncodeToString(key)
	table := func(sectors uint64) []Target {
		return []Target{{Length: sectors, Type: "crypt",
			Params: fmt.Sprintf("aes-xts-plain64 %s 0 %d:%d 0", keyHex, unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)))}}
	}
	marker := bytes.Repeat([]byte("lvm-agent devmapper crypt marker "), 4096/32)[:4096]

	var info Info
	t.Run("CreateEncrypts", func(t *testing.T) {
		var err error
		info, err = ctl.Create(ctx, name, uuid, table(16384), false)
		require.NoError(t, err)
		assert.True(t, info.LiveTable)
		assert.False(t, info.Suspended)
		assert.Equal(t, uuid, info.UUID)

		writeAt(t, devNode(t, info), marker, 0)
		assert.Equal(t, marker, readAt(t, devNode(t, info), 0, len(marker)))
		raw, err := os.ReadFile(img)
		require.NoError(t, err)
		assert.False(t, bytes.Contains(raw, marker[:64]), "plaintext reached the loop file")
		assert.NotEqual(t, make([]byte, len(marker)), raw[:len(marker)], "the ciphertext reached the loop file")

		_, err = ctl.Create(ctx, name, "", table(8), false)
		require.ErrorIs(t, err, ErrExists)
		again, err := ctl.Info(ctx, name)
		require.NoError(t, err, "a refused Create leaves the existing device alone")
		assert.True(t, again.LiveTable)
	})

	t.Run("TableRedactsKey", func(t *testing.T) {
		got, err := ctl.Table(ctx, name)
		require.NoError(t, err)
		require.Len(t, got.Targets, 1)
		fields := strings.Fields(got.Targets[0].Params)
		require.GreaterOrEqual(t, len(fields), 2)
		assert.Equal(t, strings.Repeat("0", len(keyHex)), fields[1])
		assert.NotContains(t, got.Targets[0].Params, keyHex)
		// dmsetup hides the key the same way, so the lines agree...
		assert.NoError(t, compareTargets(t, ctl.Table, name, "table"))
		// ...and the kernel does hand it out to whoever asks.
		assert.Contains(t, dmsetup(t, "", "table", "--showkeys", name), keyHex)
	})

	t.Run("RemoveAndRecreate", func(t *testing.T) {
		settle() // udev probes the device after its resume
		require.NoError(t, ctl.Remove(ctx, name))
		_, err := ctl.Info(ctx, name)
		require.ErrorIs(t, err, ErrNotFound)

		info, err = ctl.Create(ctx, name, uuid, table(16384), false)
		require.NoError(t, err)
		assert.Equal(t, marker, readAt(t, devNode(t, info), 0, len(marker)), "same key, same plaintext")
	})

	t.Run("ReloadGrows", func(t *testing.T) {
		require.NoError(t, os.Truncate(img, 16<<20))
		tool(t, "losetup", "", "-c", loop)
		// An open device stands in for the mounted filesystem the agent
		// grows under: the reload must not need it closed.
		held, err := os.OpenFile(devNode(t, info), os.O_RDWR, 0)
		require.NoError(t, err)
		defer held.Close()

		require.NoError(t, ctl.Reload(ctx, name, table(32768)))
		f, err := os.Open(devNode(t, info))
		require.NoError(t, err)
		size, err := f.Seek(0, io.SeekEnd)
		require.NoError(t, f.Close())
		require.NoError(t, err)
		assert.Equal(t, int64(32768*512), size)
		got, err := ctl.Table(ctx, name)
		require.NoError(t, err)
		require.Len(t, got.Targets, 1)
		assert.Equal(t, uint64(32768), got.Targets[0].Length)
		now, err := ctl.Info(ctx, name)
		require.NoError(t, err)
		assert.False(t, now.Suspended)
		assert.False(t, now.InactiveTable)

		assert.Equal(t, marker, readAt(t, devNode(t, info), 0, len(marker)), "old sectors unchanged")
		writeAt(t, devNode(t, info), marker, 12<<20) // in the grown part
		assert.Equal(t, marker, readAt(t, devNode(t, info), 12<<20, len(marker)))
		_, err = held.WriteAt(marker, 4096)
		require.NoError(t, err, "the open descriptor still works")
	})

	t.Run("RemoveBusyThenGone", func(t *testing.T) {
		f, err := os.Open(devNode(t, info))
		require.NoError(t, err)
		open, err := ctl.Info(ctx, name)
		require.NoError(t, err)
		assert.Positive(t, open.OpenCount)
		err = ctl.Remove(ctx, name)
		require.ErrorIs(t, err, ErrBusy)
		_, err = ctl.Info(ctx, name)
		require.NoError(t, err, "a busy device stays")

		require.NoError(t, f.Close())
		settle()
		require.NoError(t, ctl.Remove(ctx, name))
		_, err = ctl.Info(ctx, name)
		require.ErrorIs(t, err, ErrNotFound)
	})

	t.Run("FailedCreateLeavesNothing", func(t *testing.T) {
		bad := strings.Repeat("deadbeef", 3) // 12 bytes: no AES-XTS key size
		badName := name + "-bad"
		t.Cleanup(func() { _ = ctl.Remove(context.Background(), badName) })
		targets := table(8)
		targets[0].Params = strings.Replace(targets[0].Params, keyHex, bad, 1)
		_, err := ctl.Create(ctx, badName, "", targets, false)
		require.Error(t, err)
		assert.NotErrorIs(t, err, ErrExists)
		assert.NotContains(t, err.Error(), bad, "the key stays out of errors")
		_, err = ctl.Info(ctx, badName)
		require.ErrorIs(t, err, ErrNotFound, "the half-made device was removed")
	})
}

// devNode is the kernel's /dev node of a dm device, by its numbers:
// devtmpfs makes /dev/dm-N before DM_DEV_CREATE returns, unlike udev's
// /dev/mapper link.
func devNode(t *testing.T, info Info) string {
	t.Helper()
	uevent, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/uevent", info.Major, info.Minor))
	require.NoError(t, err)
	for _, line := range strings.Split(string(uevent), "\n") {
		if dev, ok := strings.CutPrefix(line, "DEVNAME="); ok {
			return "/dev/" + dev
		}
	}
	t.Fatalf("no DEVNAME for %d:%d in %q", info.Major, info.Minor, uevent)
	return ""
}

// writeAt writes b at off and fsyncs, so it has gone through dm-crypt to
// the loop file when writeAt returns.
func writeAt(t *testing.T, path string, b []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(b, off)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())
}

func readAt(t *testing.T, path string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	b := make([]byte, n)
	_, err = f.ReadAt(b, off)
	require.NoError(t, err)
	return b
}
