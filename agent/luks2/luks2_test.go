package luks2

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testSize = 4 << 20

var (
	pass1 = []byte("0123456789abcdef0123456789abcdef-first")
	pass2 = []byte("0123456789abcdef0123456789abcdef-second")
)

// device returns a file of size bytes (sparse zeros) in a temp dir.
func device(t *testing.T, size int64) (*os.File, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dev.img")
	f, err := os.Create(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	require.NoError(t, f.Truncate(size))
	return f, path
}

func formatted(t *testing.T) (*os.File, string, *Volume) {
	t.Helper()
	f, path := device(t, testSize)
	v, err := Format(f, testSize, pass1, Options{Label: "pvc-1"})
	require.NoError(t, err)
	return f, path, v
}

func TestFormatOpenRoundTrip(t *testing.T) {
	f, _, v := formatted(t)
	require.Len(t, v.Key, 64)
	assert.Equal(t, "aes-xts-plain64", v.Cipher)
	assert.Equal(t, 4096, v.SectorSize)
	assert.EqualValues(t, DataOffset, v.Offset)
	assert.Equal(t, 0, v.Keyslot)

	got, err := Open(f, testSize, pass1)
	require.NoError(t, err)
	assert.Equal(t, v.Key, got.Key)
	assert.Equal(t, v.UUID, got.UUID)
	got.Clear()
	assert.Equal(t, make([]byte, 64), got.Key)

	h, err := Read(f, testSize)
	require.NoError(t, err)
	assert.Equal(t, Header{UUID: v.UUID, Label: "pvc-1", Seqid: 1, Cipher: "aes-xts-plain64", SectorSize: 4096,
		Offset: DataOffset, Size: testSize - DataOffset, Dynamic: true, Keyslots: []int{0}}, *h)

	_, err = Open(f, testSize, []byte("wrong"))
	require.ErrorIs(t, err, ErrWrongKey)
}

func TestTableParams(t *testing.T) {
	v := &Volume{Key: bytes.Repeat([]byte{0xab}, 64), Cipher: "aes-xts-plain64", SectorSize: 4096, Offset: DataOffset}
	assert.Equal(t, "aes-xts-plain64 "+strings.Repeat("ab", 64)+" 0 253:3 2048 1 sector_size:4096", v.TableParams("253:3"))
	v.SectorSize, v.Flags = 512, []string{"allow_discards"}
	assert.Equal(t, "aes-xts-plain64 "+strings.Repeat("ab", 64)+" 0 /dev/x 2048 1 allow_discards", v.TableParams("/dev/x"))
	v.Flags = nil
	assert.Equal(t, "aes-xts-plain64 "+strings.Repeat("ab", 64)+" 0 /dev/x 2048", v.TableParams("/dev/x"))
}

func TestTornHeaders(t *testing.T) {
	f, _, v := formatted(t)
	garbage := bytes.Repeat([]byte{0x5a}, 100)

	// The primary's JSON torn: its checksum fails, the secondary opens.
	_, err := f.WriteAt(garbage, binSize+10)
	require.NoError(t, err)
	got, err := Open(f, testSize, pass1)
	require.NoError(t, err)
	assert.Equal(t, v.Key, got.Key)

	// The primary's binary header gone too (no magic): the secondary is
	// found at its offset.
	_, err = f.WriteAt(make([]byte, binSize), 0)
	require.NoError(t, err)
	got, err = Open(f, testSize, pass1)
	require.NoError(t, err)
	assert.Equal(t, v.Key, got.Key)

	// Both torn.
	_, err = f.WriteAt(garbage, hdrSize+binSize+10)
	require.NoError(t, err)
	_, err = Open(f, testSize, pass1)
	require.ErrorIs(t, err, ErrCorrupt)
	_, err = Read(f, testSize)
	require.ErrorIs(t, err, ErrCorrupt)
}

func TestUpdateRepairsTornCopy(t *testing.T) {
	f, _, _ := formatted(t)
	_, err := f.WriteAt(make([]byte, binSize), 0)
	require.NoError(t, err)
	require.NoError(t, AddKey(f, testSize, pass1, pass2, Options{}))
	p, err := readCopy(f, testSize, 0, false)
	require.NoError(t, err)
	s, err := readCopy(f, testSize, hdrSize, true)
	require.NoError(t, err)
	assert.EqualValues(t, 2, p.seqid)
	assert.Equal(t, p.meta, s.meta)
	assert.NotEqual(t, p.salts[0], s.salts[0])
	assert.NotEqual(t, [64]byte{}, p.salts[0])
}

func TestSecondaryTornPrimaryOpens(t *testing.T) {
	f, _, v := formatted(t)
	_, err := f.WriteAt(make([]byte, 64), hdrSize)
	require.NoError(t, err)
	got, err := Open(f, testSize, pass1)
	require.NoError(t, err)
	assert.Equal(t, v.Key, got.Key)
}

func TestNewerCopyWins(t *testing.T) {
	f, _, _ := formatted(t)
	require.NoError(t, AddKey(f, testSize, pass1, pass2, Options{}))
	// Put the old (seqid 1) primary back beside the new secondary: a
	// torn update. The secondary (seqid 2) wins, the new key opens.
	old, _, _ := formatted(t)
	primary := make([]byte, hdrSize)
	_, err := old.ReadAt(primary, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(primary, 0)
	require.NoError(t, err)
	h, err := Read(f, testSize)
	require.NoError(t, err)
	assert.EqualValues(t, 2, h.Seqid)
}

func TestTruncated(t *testing.T) {
	f, _, _ := formatted(t)
	_, err := Open(f, 512<<10, pass1) // the keyslots area ends at 1 MiB
	require.ErrorIs(t, err, ErrTruncated)
	_, err = Read(f, 20<<10) // the secondary copy beyond the end
	require.ErrorIs(t, err, ErrTruncated)

	small, _ := device(t, DataOffset)
	_, err = Format(small, DataOffset, pass1, Options{})
	require.ErrorIs(t, err, ErrTruncated)
}

func TestNotLUKS2(t *testing.T) {
	f, _ := device(t, testSize)
	_, err := Open(f, testSize, pass1)
	require.ErrorIs(t, err, ErrNotLUKS2)
	_, err = Read(f, testSize)
	require.ErrorIs(t, err, ErrNotLUKS2)

	_, err = f.WriteAt([]byte("LUKS\xba\xbe\x00\x01aes"), 0) // LUKS1
	require.NoError(t, err)
	_, err = Read(f, testSize)
	require.ErrorIs(t, err, ErrNotLUKS2)

	tiny, _ := device(t, 100)
	_, err = Read(tiny, 100)
	require.ErrorIs(t, err, ErrNotLUKS2)
	_, err = tiny.WriteAt(magic1, 0)
	require.NoError(t, err)
	_, err = Read(tiny, 100)
	require.ErrorIs(t, err, ErrTruncated)
}

func TestEraseLeavesNothing(t *testing.T) {
	f, _, _ := formatted(t)
	data := bytes.Repeat([]byte("data"), 1024)
	_, err := f.WriteAt(data, DataOffset)
	require.NoError(t, err)

	require.NoError(t, Erase(f, testSize))
	_, err = Open(f, testSize, pass1)
	require.ErrorIs(t, err, ErrNotLUKS2)
	area := make([]byte, DataOffset)
	_, err = f.ReadAt(area, 0)
	require.NoError(t, err)
	assert.Equal(t, make([]byte, DataOffset), area, "header and keyslots area not all zero")
	after := make([]byte, len(data))
	_, err = f.ReadAt(after, DataOffset)
	require.NoError(t, err)
	assert.Equal(t, data, after, "erase wrote beyond the header area")

	// Idempotent: a retried delete.
	require.NoError(t, Erase(f, testSize))
}

func TestEraseRefusesForeignData(t *testing.T) {
	f, _ := device(t, testSize)
	_, err := f.WriteAt([]byte("an ext4 superblock, say"), 1024)
	require.NoError(t, err)
	require.ErrorIs(t, Erase(f, testSize), ErrNotLUKS2)
}

func TestEraseAfterCrashMidway(t *testing.T) {
	f, _, _ := formatted(t)
	// A crash after Erase's first pass: everything but the primary's
	// binary header random. A retry must still erase.
	_, err := f.WriteAt(randomBytes(DataOffset-binSize), binSize)
	require.NoError(t, err)
	require.NoError(t, Erase(f, testSize))
	area := make([]byte, DataOffset)
	_, err = f.ReadAt(area, 0)
	require.NoError(t, err)
	assert.Equal(t, make([]byte, DataOffset), area)
}

func TestRotation(t *testing.T) {
	f, _, v := formatted(t)
	require.ErrorIs(t, RemoveKey(f, testSize, pass1), ErrLastKeyslot)

	require.NoError(t, AddKey(f, testSize, pass1, pass2, Options{Iterations: 2000}))
	h, err := Read(f, testSize)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, h.Keyslots)
	assert.EqualValues(t, 2, h.Seqid)
	for _, p := range [][]byte{pass1, pass2} {
		got, err := Open(f, testSize, p)
		require.NoError(t, err)
		assert.Equal(t, v.Key, got.Key)
	}

	require.NoError(t, RemoveKey(f, testSize, pass1))
	_, err = Open(f, testSize, pass1)
	require.ErrorIs(t, err, ErrWrongKey)
	got, err := Open(f, testSize, pass2)
	require.NoError(t, err)
	assert.Equal(t, v.Key, got.Key)
	assert.Equal(t, 1, got.Keyslot)
	h, err = Read(f, testSize)
	require.NoError(t, err)
	assert.Equal(t, []int{1}, h.Keyslots)
	assert.EqualValues(t, 3, h.Seqid)
	// Slot 0's area is wiped.
	area := make([]byte, areaSize(64))
	_, err = f.ReadAt(area, 2*hdrSize)
	require.NoError(t, err)
	assert.Equal(t, make([]byte, len(area)), area)
	require.ErrorIs(t, RemoveKey(f, testSize, pass2), ErrLastKeyslot)

	// Three areas fit: a second rotation reuses slot 0's.
	require.NoError(t, AddKey(f, testSize, pass2, pass1, Options{}))
	require.NoError(t, AddKey(f, testSize, pass2, []byte("third-0123456789abcdef0123456789"), Options{}))
	require.ErrorIs(t, AddKey(f, testSize, pass2, []byte("fourth-0123456789abcdef012345678"), Options{}), ErrFull)
	require.ErrorIs(t, AddKey(f, testSize, []byte("nope"), pass1, Options{}), ErrWrongKey)
}

func TestFormatRefuses(t *testing.T) {
	f, _ := device(t, testSize)
	_, err := Format(f, testSize-512, pass1, Options{})
	require.ErrorIs(t, err, ErrUnsupported)
	_, err = Format(f, testSize, pass1, Options{Iterations: 10})
	require.ErrorIs(t, err, ErrUnsupported)
	_, err = Format(f, testSize, pass1, Options{Label: strings.Repeat("x", 48)})
	require.ErrorIs(t, err, ErrUnsupported)
}
