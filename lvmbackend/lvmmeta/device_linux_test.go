//go:build linux && !guest

// Not in the guest binary: the guest runs it from tmpfs, which has no
// O_DIRECT on its kernel (6.1); the guest tests read real loop devices.

package lvmmeta

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDeviceReadAt reads unaligned ranges through the aligned O_DIRECT
// buffer and compares them with the file's bytes.
func TestDeviceReadAt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dev")
	want := make([]byte, 3*directAlign+100)
	for i := range want {
		want[i] = byte(i * 7)
	}
	require.NoError(t, os.WriteFile(path, want, 0o600))
	d, err := OpenDevice(path)
	require.NoError(t, err, "O_DIRECT on the test's temporary directory")
	defer d.Close()
	assert.Equal(t, int64(len(want)), d.Size())
	for _, c := range []struct{ off, n int }{{0, 512}, {1, 10}, {4095, 2}, {4096, 4096}, {100, 3 * directAlign}, {len(want) - 5, 5}} {
		got := make([]byte, c.n)
		n, err := d.ReadAt(got, int64(c.off))
		require.NoError(t, err, "%+v", c)
		assert.Equal(t, c.n, n)
		assert.Equal(t, want[c.off:c.off+c.n], got, "%+v", c)
	}
	got := make([]byte, 10)
	n, err := d.ReadAt(got, int64(len(want)-4))
	assert.ErrorIs(t, err, io.EOF, "past the end")
	assert.Equal(t, 4, n)
}
