package luks2

import (
	"crypto/aes"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/xts"
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

// dmCryptWrite encrypts plain (from the mapping's sector 0) as dm-crypt does
// with a table of params: <cipher> <hex key> <iv_offset> <dev> <offset>
// [<n> <options>], options sector_size:N and iv_large_sectors (the IV counts
// 512-byte sectors unless iv_large_sectors, the kernel's dm-crypt.rst).
func dmCryptWrite(t *testing.T, params string, plain []byte) []byte {
	f := strings.Fields(params)
	require.Equal(t, "aes-xts-plain64", f[0])
	key, err := hex.DecodeString(f[1])
	require.NoError(t, err)
	ivOffset, err := strconv.ParseUint(f[2], 10, 64)
	require.NoError(t, err)
	sector, large := 512, false
	if len(f) > 5 {
		for _, o := range f[6:] {
			if n, ok := strings.CutPrefix(o, "sector_size:"); ok {
				sector, err = strconv.Atoi(n)
				require.NoError(t, err)
			}
			large = large || o == "iv_large_sectors"
		}
	}
	c, err := xts.NewCipher(aes.NewCipher, key)
	require.NoError(t, err)
	out := make([]byte, len(plain))
	for i := 0; i*sector < len(plain); i++ {
		iv := ivOffset + uint64(i*sector/512)
		if large {
			iv = ivOffset + uint64(i)
		}
		c.Encrypt(out[i*sector:(i+1)*sector], plain[i*sector:(i+1)*sector], iv)
	}
	return out
}

// TestDataReadsBackThroughCryptsetup checks TableParams' meaning (the
// sector size, the IVs) without device-mapper: data encrypted as dm-crypt
// would with our table, decrypted by cryptsetup's own LUKS2 code (offline
// reencrypt --decrypt, which needs a detached header: our header with its
// data offset set to 0, the data in a file of its own) is the plaintext.
func TestDataReadsBackThroughCryptsetup(t *testing.T) {
	hdr, hdrPath, v := formatted(t)
	img, err := readImage(hdr, testSize)
	require.NoError(t, err)
	s := img.meta.Segments["0"]
	s.Offset = 0
	img.meta.Segments["0"] = s
	img.seqid++
	require.NoError(t, writeImage(hdr, img))

	plain := make([]byte, 2<<20)
	for i := range plain {
		plain[i] = byte(i*7 + i/4096)
	}
	params := v.TableParams("7:0")
	require.True(t, strings.HasSuffix(params, " 0 7:0 2048 1 sector_size:4096"))
	dataPath := filepath.Join(t.TempDir(), "data.img")
	require.NoError(t, os.WriteFile(dataPath, dmCryptWrite(t, params, plain), 0o600))

	out, err := cryptsetup(t, "reencrypt", "--decrypt", "--force-offline-reencrypt", "--batch-mode",
		"--header", hdrPath, "--key-file", keyFile(t, pass1), dataPath)
	require.NoError(t, err, out)
	got, err := os.ReadFile(dataPath)
	require.NoError(t, err)
	require.True(t, string(got) == string(plain), "cryptsetup decrypted our dm-crypt data to something else")
}
