package luks2

import (
	"bytes"
	"encoding/binary"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// memDev is a device of size bytes holding b, then zeros.
type memDev struct{ b []byte }

func (m *memDev) ReadAt(p []byte, off int64) (int, error) {
	clear(p)
	if off < int64(len(m.b)) {
		copy(p, m.b[off:])
	}
	return len(p), nil
}

func (m *memDev) WriteAt(p []byte, off int64) (int, error) {
	if end := off + int64(len(p)); end > int64(len(m.b)) {
		m.b = append(m.b, make([]byte, end-int64(len(m.b)))...)
	}
	return copy(m.b[off:], p), nil
}

// headerImage builds a two-copy header from a binary header's first 512 bytes
// and a JSON text, with sound checksums (so that mutations reach the JSON
// checks rather than all failing the checksum); torn tears the primary.
func headerImage(bin, js []byte, torn bool) *memDev {
	hs := uint64(hdrSize)
	if len(bin) >= 16 {
		if n := binary.BigEndian.Uint64(bin[offHdrSize:]); n >= 16<<10 && n <= maxHdrSize && n&(n-1) == 0 {
			hs = n
		}
	}
	dev := &memDev{b: make([]byte, 2*hs)}
	for i, off := range []uint64{0, hs} {
		whole := dev.b[off : off+hs]
		copy(whole, bin[:min(len(bin), 512)])
		copy(whole[binSize:], js)
		if i == 1 {
			copy(whole, magic2)
			binary.BigEndian.PutUint64(whole[offHdrOffset:], hs)
		}
		if sum, err := checksum(cstring(whole[offCsumAlg:offCsumAlg+32]), whole); err == nil {
			copy(whole[offCsum:offCsum+64], sum)
		}
	}
	if torn {
		dev.b[binSize] ^= 0xff
	}
	return dev
}

// seed splits a header image into headerImage's arguments.
func seed(b []byte) ([]byte, []byte) {
	js := b[binSize:hdrSize]
	return b[:512], js[:bytes.IndexByte(js, 0)]
}

// FuzzRead feeds headers (ours, cryptsetup's, and their mutations) to
// Read: it must never panic, and a header it accepts must survive our
// rewrite of it unchanged.
func FuzzRead(f *testing.F) {
	cs, err := os.ReadFile("testdata/cryptsetup-2.6.1.hdr") // argon2id + pbkdf2 keyslots, 4096 sectors
	require.NoError(f, err)
	bin, js := seed(cs)
	f.Add(bin, js, false)
	f.Add(bin, js, true)
	ours := &memDev{}
	_, err = Format(ours, 4<<20, pass1, Options{Label: "seed"})
	require.NoError(f, err)
	bin, js = seed(ours.b)
	f.Add(bin, js, false)

	f.Fuzz(func(t *testing.T, bin, js []byte, torn bool) {
		const size = 32 << 20 // room for cryptsetup's 16 MiB data offset
		dev := headerImage(bin, js, torn)
		h, err := Read(dev, size)
		if err != nil {
			return
		}
		img, err := readImage(dev, size)
		require.NoError(t, err)
		for _, k := range img.meta.Keyslots {
			_ = checkKeyslot(&k)
		}
		for _, d := range img.meta.Digests {
			_ = checkDigest(&d)
		}
		_, _ = dataSegment(img.meta)

		again := &memDev{}
		require.NoError(t, writeImage(again, img))
		h2, err := Read(again, size)
		require.NoError(t, err)
		require.Equal(t, h, h2)
	})
}

// TestReadCryptsetupHeader reads the saved cryptsetup header (its first 32
// KiB: both copies) without cryptsetup installed.
func TestReadCryptsetupHeader(t *testing.T) {
	cs, err := os.ReadFile("testdata/cryptsetup-2.6.1.hdr")
	require.NoError(t, err)
	h, err := Read(&memDev{b: cs}, 32<<20)
	require.NoError(t, err)
	require.Equal(t, Header{UUID: "4b120217-c9e4-404c-817b-ffa7f869e69d", Label: "seed", Seqid: 5, Cipher: "aes-xts-plain64",
		SectorSize: 4096, Offset: 16 << 20, Size: 16 << 20, Dynamic: true, Keyslots: []int{0, 1}}, *h)
	_, err = Read(&memDev{b: cs}, 8<<20)
	require.ErrorIs(t, err, ErrTruncated)
}
