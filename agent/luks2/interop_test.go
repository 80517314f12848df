package luks2

import (
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The interop tests run the real cryptsetup (Debian's cryptsetup-bin) on
// files: luksFormat, luksDump, luksAddKey and open --test-passphrase need
// no device-mapper, which this host's kernel may not have.
const cryptsetupPath = "/usr/sbin/cryptsetup"

func cryptsetup(t *testing.T, args ...string) (string, error) {
	t.Helper()
	if _, err := os.Stat(cryptsetupPath); err != nil {
		t.Fatal("install cryptsetup-bin (scripts/test.sh installs it)")
	}
	out, err := exec.Command(cryptsetupPath, args...).CombinedOutput()
	return string(out), err
}

func keyFile(t *testing.T, key []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "key")
	require.NoError(t, os.WriteFile(path, key, 0o600))
	return path
}

// dumpedKey is the volume key cryptsetup prints (luksDump --dump-volume-key).
func dumpedKey(t *testing.T, path string, pass []byte) []byte {
	t.Helper()
	out, err := cryptsetup(t, "luksDump", "--dump-volume-key", "--batch-mode", "--key-file", keyFile(t, pass), path)
	require.NoError(t, err, out)
	_, dump, ok := strings.Cut(out, "MK dump:")
	require.True(t, ok, out)
	key, err := hex.DecodeString(strings.Join(strings.Fields(dump), ""))
	require.NoError(t, err, out)
	return key
}

func testPassphrase(t *testing.T, path string, pass []byte) error {
	t.Helper()
	_, err := cryptsetup(t, "open", "--test-passphrase", "--key-file", keyFile(t, pass), path)
	return err
}

func TestOursOpensInCryptsetup(t *testing.T) {
	f, path, v := formatted(t)
	out, err := cryptsetup(t, "luksDump", path)
	require.NoError(t, err, out)
	t.Logf("cryptsetup luksDump of our header:\n%s", out)
	for _, want := range []string{"Version:       \t2", "UUID:          \t" + v.UUID, "Label:         \tpvc-1",
		"offset: 1048576 [bytes]", "length: (whole device)", "sector: 4096 [bytes]", "  0: luks2", "PBKDF:      pbkdf2",
		"Area offset:32768 [bytes]", "Keyslots area: \t1015808 [bytes]", "Metadata area: \t16384 [bytes]"} {
		assert.Contains(t, out, want)
	}
	require.NoError(t, testPassphrase(t, path, pass1))
	require.Error(t, testPassphrase(t, path, pass2))
	assert.Equal(t, v.Key, dumpedKey(t, path, pass1))

	// cryptsetup updates our header; we read its update.
	out, err = cryptsetup(t, "luksAddKey", "--batch-mode", "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000",
		"--key-file", keyFile(t, pass1), path, keyFile(t, pass2))
	require.NoError(t, err, out)
	got, err := Open(f, testSize, pass2)
	require.NoError(t, err)
	assert.Equal(t, v.Key, got.Key)
	h, err := Read(f, testSize)
	require.NoError(t, err)
	assert.EqualValues(t, 2, h.Seqid)
	assert.Equal(t, []int{0, 1}, h.Keyslots)

	// Our rotation, seen by cryptsetup.
	require.NoError(t, RemoveKey(f, testSize, pass1))
	require.Error(t, testPassphrase(t, path, pass1))
	require.NoError(t, testPassphrase(t, path, pass2))

	require.NoError(t, Erase(f, testSize))
	out, err = cryptsetup(t, "luksDump", path)
	require.Error(t, err, out)
	require.Error(t, testPassphrase(t, path, pass2))
}

func TestCryptsetupOpensInOurs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		suffix string // TableParams after the key (cryptsetup's data offset is 16 MiB)
	}{
		{"pbkdf2", []string{"--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", "--sector-size", "4096"}, " 32768 1 sector_size:4096"},
		{"argon2id", []string{"--pbkdf", "argon2id", "--pbkdf-memory", "32768", "--pbkdf-force-iterations", "4", "--sector-size", "512"}, " 32768"},
		{"argon2i", []string{"--pbkdf", "argon2i", "--pbkdf-memory", "32768", "--pbkdf-force-iterations", "4", "--sector-size", "2048"}, " 32768 1 sector_size:2048"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const size = 20 << 20
			f, path := device(t, size)
			args := append([]string{"luksFormat", "--type", "luks2", "--batch-mode", "--key-file", keyFile(t, pass1)}, tc.args...)
			out, err := cryptsetup(t, append(args, path)...)
			require.NoError(t, err, out)
			want := dumpedKey(t, path, pass1)

			v, err := Open(f, size, pass1)
			require.NoError(t, err)
			assert.Equal(t, want, v.Key)
			// The key is in the middle: not in a failure's message.
			params := v.TableParams("7:0")
			assert.True(t, strings.HasPrefix(params, "aes-xts-plain64 "+hex.EncodeToString(want)+" "))
			assert.Equal(t, " 0 7:0"+tc.suffix, params[len("aes-xts-plain64 ")+2*len(want):])
			_, err = Open(f, size, pass2)
			require.ErrorIs(t, err, ErrWrongKey)

			require.NoError(t, AddKey(f, size, pass1, pass2, Options{}))
			require.NoError(t, testPassphrase(t, path, pass2))
			require.NoError(t, testPassphrase(t, path, pass1))
			out, err = cryptsetup(t, "luksDump", path)
			require.NoError(t, err, out)
			assert.Regexp(t, regexp.MustCompile(`(?m)^  1: luks2$`), out)
		})
	}
}
