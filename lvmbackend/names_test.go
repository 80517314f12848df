package lvmbackend

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Errors name the offending character as the user wrote it, and never
// repeat a kilobyte of hostile input.
func TestValidateMessages(t *testing.T) {
	err := ValidateName("pvc-é")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `the character 'é'`)

	err = ValidateName("pvc\xff")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "\"pvc\\xff\" has the character '\uFFFD'", "an invalid byte is shown escaped in the name")

	long := strings.Repeat("a", 5000)
	err = ValidateTag(long)
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), "LVM tag must be 1 to 1024 bytes, not 5000: "), err.Error())
	assert.Less(t, len(err.Error()), 200)

	err = ValidateTag(strings.Repeat("b", 1000) + " ")
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), "LVM tag has the character ' ' "), err.Error())
	assert.Contains(t, err.Error(), "... (1001 bytes)")
	assert.Less(t, len(err.Error()), 200)

	require.NoError(t, ValidateTag("a/b=c!d:e#f&g+h_i.j-k"))
}

// lvm2 reserves the component suffixes of cache, writecache and integrity
// LVs too (lib/misc/lvm-string.c); lvcreate refuses them.
func TestValidateNameNewerReservedParts(t *testing.T) {
	for _, part := range []string{"_cpool", "_cvol", "_wcorig", "_imeta", "_iorig"} {
		err := ValidateName("data" + part + "0")
		require.Error(t, err, part)
		require.Contains(t, err.Error(), "LVM reserves")
	}
}
