package luks2

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// The binary header's fields (big endian), as the LUKS2 on-disk
// specification lays them out in the first 512 bytes of each copy.
const (
	binSize      = 4096 // binary header, then the JSON area
	offVersion   = 6
	offHdrSize   = 8
	offSeqid     = 16
	offLabel     = 24
	offCsumAlg   = 72
	offSalt      = 104
	offUUID      = 168
	offSubsystem = 208
	offHdrOffset = 256
	offCsum      = 448
	maxHdrSize   = 4 << 20
)

var (
	magic1 = []byte("LUKS\xba\xbe")
	magic2 = []byte("SKUL\xba\xbe")
	// Where a secondary copy may start: the sizes the specification allows
	// for one copy. Searched when the primary does not say its size.
	secondaryOffsets = []int64{16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20}
	errNoMagic       = errors.New("no LUKS2 magic")
)

// image is one header as read (or about to be written): the binary fields
// both copies share (but their salts) and the JSON metadata.
type image struct {
	hdrSize   int64
	seqid     uint64
	label     string
	subsystem string
	csumAlg   string
	uuid      string
	salts     [2][64]byte
	meta      *metadata
}

// readAt reads exactly n bytes at off of a device of size bytes.
func readAt(dev Device, size, off, n int64) ([]byte, error) {
	if off < 0 || n < 0 || off+n > size {
		return nil, fmt.Errorf("%w: %d bytes at %d on a device of %d", ErrTruncated, n, off, size)
	}
	b := make([]byte, n)
	if k, err := dev.ReadAt(b, off); int64(k) != n {
		if err == nil || errors.Is(err, io.EOF) {
			err = ErrTruncated
		}
		return nil, fmt.Errorf("luks2: read %d bytes at %d: %w", n, off, err)
	}
	return b, nil
}

func cstring(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// readCopy reads and checks one copy at off: magic, version, its own
// offset, size, checksum, then the JSON. errNoMagic when there is none.
func readCopy(dev Device, size, off int64, secondary bool) (*image, error) {
	want := magic1
	if secondary {
		want = magic2
	}
	if off+binSize > size { // a magic there means a truncated header
		if b, err := readAt(dev, size, off, 6); err != nil || !bytes.Equal(b, want) {
			return nil, errNoMagic
		}
	}
	bin, err := readAt(dev, size, off, binSize)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(bin[:6], want) {
		return nil, errNoMagic
	}
	if v := binary.BigEndian.Uint16(bin[offVersion:]); v != 2 {
		if !secondary && v == 1 {
			return nil, fmt.Errorf("%w: LUKS1", ErrNotLUKS2)
		}
		return nil, fmt.Errorf("%w: version %d", ErrCorrupt, v)
	}
	hs := binary.BigEndian.Uint64(bin[offHdrSize:])
	if hs < 16<<10 || hs > maxHdrSize || hs&(hs-1) != 0 {
		return nil, fmt.Errorf("%w: header size %d", ErrCorrupt, hs)
	}
	if o := binary.BigEndian.Uint64(bin[offHdrOffset:]); o != uint64(off) || (secondary && o != hs) {
		return nil, fmt.Errorf("%w: header offset %d at %d", ErrCorrupt, o, off)
	}
	whole, err := readAt(dev, size, off, int64(hs))
	if err != nil {
		return nil, err
	}
	img := &image{
		hdrSize: int64(hs),
		seqid:   binary.BigEndian.Uint64(bin[offSeqid:]),
		// The text fields end with a NUL on disk (cryptsetup forces it).
		label:     cstring(bin[offLabel : offLabel+47]),
		csumAlg:   cstring(bin[offCsumAlg : offCsumAlg+31]),
		uuid:      cstring(bin[offUUID : offUUID+39]),
		subsystem: cstring(bin[offSubsystem : offSubsystem+47]),
	}
	sum, err := checksum(img.csumAlg, whole)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(sum, whole[offCsum:offCsum+len(sum)]) {
		return nil, fmt.Errorf("%w: checksum of the copy at %d", ErrCorrupt, off)
	}
	copy(img.salts[0][:], bin[offSalt:offSalt+64])
	if img.meta, err = parseJSON(whole[binSize:], img.hdrSize); err != nil {
		return nil, err
	}
	return img, nil
}

// checksum is the copy's hash with its checksum field zeroed.
func checksum(alg string, whole []byte) ([]byte, error) {
	newHash, ok := hashes[alg]
	if !ok {
		return nil, fmt.Errorf("%w: checksum algorithm %q", ErrCorrupt, alg)
	}
	h := newHash()
	h.Write(whole[:offCsum])
	h.Write(make([]byte, 64))
	h.Write(whole[offCsum+64:])
	return h.Sum(nil), nil
}

// readImage reads the header as cryptsetup does: both copies, the one with
// the higher seqid when both are sound, else the sound one. It never
// repairs the bad copy (a read is a read); the next update rewrites both.
func readImage(dev Device, size int64) (*image, error) {
	p, perr := readCopy(dev, size, 0, false)
	if errors.Is(perr, ErrNotLUKS2) {
		return nil, perr
	}
	offs := secondaryOffsets
	if p != nil {
		offs = []int64{p.hdrSize}
	}
	var s *image
	serr := errNoMagic
	for _, off := range offs {
		if p == nil && off+binSize > size {
			break // no copy beyond the device's end
		}
		c, err := readCopy(dev, size, off, true)
		if err == nil {
			s, serr = c, nil
			break
		}
		if !errors.Is(err, errNoMagic) && (errors.Is(serr, errNoMagic) || errors.Is(err, ErrTruncated)) {
			serr = err
		}
	}
	img := p
	switch {
	case p != nil && s != nil:
		if s.seqid > p.seqid {
			img = s
		}
	case s != nil:
		img = s
	case p == nil:
		if errors.Is(perr, errNoMagic) && errors.Is(serr, errNoMagic) {
			return nil, ErrNotLUKS2
		}
		if errors.Is(perr, ErrTruncated) || errors.Is(serr, ErrTruncated) {
			return nil, fmt.Errorf("%w: header beyond the device's end (primary: %v; secondary: %v)", ErrTruncated, perr, serr)
		}
		if errors.Is(perr, errNoMagic) {
			perr = ErrCorrupt
		}
		return nil, fmt.Errorf("%w: no sound copy (primary: %v; secondary: %v)", ErrCorrupt, perr, serr)
	}
	// Keep each sound copy's own salt for the rewrite, a new one for a bad
	// copy (cryptsetup does).
	salts := [2][64]byte{[64]byte(randomBytes(64)), [64]byte(randomBytes(64))}
	if p != nil {
		salts[0] = p.salts[0]
	}
	if s != nil {
		salts[1] = s.salts[0]
	}
	img.salts = salts
	if end := img.meta.end(img.hdrSize); end > size {
		return nil, fmt.Errorf("%w: the header's areas and data offset end at %d, the device at %d", ErrTruncated, end, size)
	}
	return img, nil
}

// writeImage writes both copies of img, primary
// first: the seqid rule then makes the newer copy win and at most one copy
// is ever torn (a Device that can Sync is synced between the two writes).
func writeImage(dev Device, img *image) error {
	js, err := json.Marshal(img.meta)
	if err != nil {
		return fmt.Errorf("luks2: encode JSON: %w", err)
	}
	if _, err := parseJSON(append(js, 0), img.hdrSize); err != nil {
		return fmt.Errorf("luks2: the header we built: %w", err)
	}
	for i, off := range []int64{0, img.hdrSize} {
		whole := make([]byte, img.hdrSize)
		copy(whole, magic1)
		if i == 1 {
			copy(whole, magic2)
		}
		binary.BigEndian.PutUint16(whole[offVersion:], 2)
		binary.BigEndian.PutUint64(whole[offHdrSize:], uint64(img.hdrSize))
		binary.BigEndian.PutUint64(whole[offSeqid:], img.seqid)
		copy(whole[offLabel:offLabel+47], img.label)
		copy(whole[offCsumAlg:offCsumAlg+31], img.csumAlg)
		copy(whole[offSalt:offSalt+64], img.salts[i][:])
		copy(whole[offUUID:offUUID+39], img.uuid)
		copy(whole[offSubsystem:offSubsystem+47], img.subsystem)
		binary.BigEndian.PutUint64(whole[offHdrOffset:], uint64(off))
		copy(whole[binSize:], js)
		sum, err := checksum(img.csumAlg, whole)
		if err != nil {
			return err
		}
		copy(whole[offCsum:], sum)
		if _, err := dev.WriteAt(whole, off); err != nil {
			return fmt.Errorf("luks2: write header copy at %d: %w", off, err)
		}
		if err := syncDev(dev); err != nil {
			return err
		}
	}
	return nil
}

// syncDev flushes a device that can (an *os.File): a header or a wipe
// still in the page cache is not on the disk.
func syncDev(dev Device) error {
	if s, ok := dev.(interface{ Sync() error }); ok {
		if err := s.Sync(); err != nil {
			return fmt.Errorf("luks2: sync: %w", err)
		}
	}
	return nil
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go ≥ 1.24)
	return b
}
