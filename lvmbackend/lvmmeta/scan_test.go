//go:build linux

package lvmmeta

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDevicesFilter(t *testing.T) {
	all, err := Devices(nil)
	require.NoError(t, err)
	for _, d := range all {
		assert.NotContains(t, d, "/dev/dm-", "device-mapper devices are left out by default")
	}
	none, err := Devices([]string{"/dev/no-such-device*"})
	require.NoError(t, err)
	assert.Empty(t, none)
	_, err = Devices([]string{"/dev/["})
	require.Error(t, err, "a bad glob")
}

func TestScanSkipsWhatIsNotAPV(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	require.NoError(t, os.WriteFile(plain, make([]byte, 8192), 0o600))
	st, err := NewReader(Limits{}).Scan(context.Background(), []string{plain, filepath.Join(dir, "missing")})
	require.NoError(t, err)
	assert.Empty(t, st.VGs)
	assert.Empty(t, st.PVs)
}
