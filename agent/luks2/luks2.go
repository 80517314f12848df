package luks2

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Errors at the package's border (errors.Is).
var (
	ErrNotLUKS2    = errors.New("luks2: no LUKS2 header")
	ErrWrongKey    = errors.New("luks2: no keyslot opens with this passphrase")
	ErrCorrupt     = errors.New("luks2: header corrupt")
	ErrTruncated   = errors.New("luks2: device too small")
	ErrUnsupported = errors.New("luks2: unsupported")
	ErrFull        = errors.New("luks2: no room for another keyslot")
	ErrLastKeyslot = errors.New("luks2: refusing to remove the last keyslot")
)

// The layout Format writes (see the package doc).
const (
	DataOffset   = 1 << 20 // data segment offset, bytes
	hdrSize      = 16 << 10
	keyslotsSize = DataOffset - 2*hdrSize
	keySize      = 64
	stripes      = 4000
	sectorSize   = 4096
	saltSize     = 32
	// MinIterations is cryptsetup's minimum for pbkdf2 (keyslot and digest).
	MinIterations = 1000
)

// Device is a block device or a file.
type Device interface {
	io.ReaderAt
	io.WriterAt
}

// Options for Format and AddKey.
type Options struct {
	Label      string // at most 47 bytes (Format only)
	Iterations int    // pbkdf2-sha256 iterations of the keyslot; 0: MinIterations
}

// Header is what Read tells without any key.
type Header struct {
	UUID       string
	Label      string
	Seqid      uint64
	Cipher     string // the data segment's, e.g. "aes-xts-plain64"
	SectorSize int    // the data segment's
	Offset     int64  // data segment offset, bytes
	Size       int64  // data segment bytes ("dynamic": the device after Offset)
	Dynamic    bool
	Keyslots   []int
}

// Volume is an opened volume. Key is the volume key: call Clear when done.
type Volume struct {
	Key        []byte
	Cipher     string
	SectorSize int
	Offset     int64 // data segment offset, bytes
	UUID       string
	Keyslot    int      // the keyslot the passphrase opened
	Flags      []string // dm-crypt options from the header's persistent flags
}

// Clear overwrites the volume key.
func (v *Volume) Clear() { clear(v.Key) }

// TableParams returns the dm-crypt target's parameters for this volume
// on devPath ("major:minor" or a path): what cryptsetup 2.6's
// get_dm_crypt_params (lib/libdevmapper.c) prints for a LUKS2 data
// segment, the table's length being the segment's 512-byte sectors:
//
//	aes-xts-plain64 <hex key> 0 <devPath> <offset/512>[ <n> <options>]
//
// How this was established, from cryptsetup's v2.6.1 sources: LUKS2_activate
// (lib/luks2/luks2_json_metadata.c) calls dm_crypt_target_set with
// crypt_get_iv_offset, which is 0 for LUKS2 (lib/setup.c), the segment's
// offset in sectors, and the segment's sector_size; the options come from
// the header's persistent config flags (allow-discards, same-cpu-crypt,
// submit-from-crypt-cpus, no-read-workqueue, no-write-workqueue, in that
// order), then "sector_size:N" when N is not 512. iv_large_sectors is added
// only for CRYPT_ACTIVATE_IV_LARGE_SECTORS, which the cryptsetup tool accepts
// for plain devices only (src/cryptsetup.c) and only BITLK sets itself: a
// LUKS2 data segment's IVs count 512-byte sectors whatever its sector size,
// which is dm-crypt's default without iv_large_sectors. So Format's 4096
// sector size gives " 1 sector_size:4096". TestDataReadsBackThroughCryptsetup
// checks that meaning without device-mapper: data encrypted as dm-crypt does
// with this table is decrypted to the plaintext by cryptsetup's own LUKS2
// code (and is not with iv_large_sectors, nor with 512-byte sectors).
// One difference is by design:
// cryptsetup passes the key through the kernel keyring (":64:logon:...")
// where the kernel has one; the key and so the data are the same.
//
// The string holds the key in hex: never log it.
func (v *Volume) TableParams(devPath string) string {
	opts := append([]string(nil), v.Flags...)
	if v.SectorSize != 512 {
		opts = append(opts, "sector_size:"+strconv.Itoa(v.SectorSize))
	}
	s := fmt.Sprintf("%s %s 0 %s %d", v.Cipher, hex.EncodeToString(v.Key), devPath, v.Offset/512)
	if len(opts) > 0 {
		s += fmt.Sprintf(" %d %s", len(opts), strings.Join(opts, " "))
	}
	return s
}

// dmFlags maps LUKS2 persistent flags to dm-crypt options, in cryptsetup's
// order; no-journal is dm-integrity's and adds nothing here.
var dmFlags = []struct{ luks, dm string }{
	{"allow-discards", "allow_discards"},
	{"same-cpu-crypt", "same_cpu_crypt"},
	{"submit-from-crypt-cpus", "submit_from_crypt_cpus"},
	{"no-read-workqueue", "no_read_workqueue"},
	{"no-write-workqueue", "no_write_workqueue"},
}

// Read returns the header's metadata, without any key.
func Read(dev Device, size int64) (*Header, error) {
	img, err := readImage(dev, size)
	if err != nil {
		return nil, err
	}
	h := &Header{UUID: img.uuid, Label: img.label, Seqid: img.seqid, Keyslots: img.meta.keyslotIDs()}
	if s, ok := img.meta.Segments["0"]; ok {
		h.Cipher, h.SectorSize, h.Offset = s.Encryption, s.SectorSize, int64(s.Offset)
		h.Dynamic = s.Size == "dynamic"
		h.Size = size - h.Offset
		if !h.Dynamic {
			h.Size, _ = strconv.ParseInt(s.Size, 10, 64) // validated
		}
	}
	return h, nil
}

// dataSegment returns segment 0 when it is the only one and one we can
// map: aes-xts-plain64, no integrity, no reencryption in progress.
func dataSegment(m *metadata) (*segment, error) {
	s, ok := m.Segments["0"]
	switch {
	case !ok || len(m.Segments) != 1:
		return nil, fmt.Errorf("%w: %d segments", ErrUnsupported, len(m.Segments))
	case s.Type != "crypt" || s.Encryption != "aes-xts-plain64" || len(s.Integrity) > 0 || s.IVTweak != "0":
		return nil, fmt.Errorf("%w: segment %s %s iv_tweak %s", ErrUnsupported, s.Type, s.Encryption, s.IVTweak)
	case s.SectorSize != 512 && s.SectorSize != 1024 && s.SectorSize != 2048 && s.SectorSize != 4096:
		return nil, fmt.Errorf("%w: sector size %d", ErrCorrupt, s.SectorSize)
	case s.Offset == 0:
		return nil, fmt.Errorf("%w: detached header", ErrUnsupported)
	case m.Config.Requirements != nil && len(m.Config.Requirements.Mandatory) > 0:
		return nil, fmt.Errorf("%w: requirements %v", ErrUnsupported, m.Config.Requirements.Mandatory)
	}
	return &s, nil
}

// unlock tries every keyslot (but priority 0, "ignore", as cryptsetup)
// with pass.
func unlock(dev Device, size int64, img *image, pass []byte) (*Volume, error) {
	seg, err := dataSegment(img.meta)
	if err != nil {
		return nil, err
	}
	var firstErr error
	tried := false
	for _, n := range img.meta.keyslotIDs() {
		id := strconv.Itoa(n)
		if p := img.meta.Keyslots[id].Priority; p != nil && *p == 0 {
			continue
		}
		key, err := openKeyslot(dev, size, img.meta, id, pass)
		if err == nil {
			v := &Volume{Key: key, Cipher: seg.Encryption, SectorSize: seg.SectorSize, Offset: int64(seg.Offset), UUID: img.uuid, Keyslot: n}
			for _, f := range dmFlags {
				if slices.Contains(img.meta.Config.Flags, f.luks) {
					v.Flags = append(v.Flags, f.dm)
				}
			}
			return v, nil
		}
		tried = tried || errors.Is(err, ErrWrongKey)
		if firstErr == nil && !errors.Is(err, ErrWrongKey) {
			firstErr = err
		}
	}
	if !tried && firstErr != nil {
		return nil, firstErr
	}
	return nil, ErrWrongKey
}

// Open reads the header (falling back to the secondary copy as cryptsetup
// does), tries every keyslot with passphrase and returns the volume.
func Open(dev Device, size int64, passphrase []byte) (*Volume, error) {
	img, err := readImage(dev, size)
	if err != nil {
		return nil, err
	}
	return unlock(dev, size, img, passphrase)
}

func iterations(opt Options) (int, error) {
	switch {
	case opt.Iterations == 0:
		return MinIterations, nil
	case opt.Iterations < MinIterations || opt.Iterations > maxIterations:
		return 0, fmt.Errorf("%w: %d pbkdf2 iterations (%d to %d)", ErrUnsupported, opt.Iterations, MinIterations, maxIterations)
	}
	return opt.Iterations, nil
}

// Format writes a new LUKS2 header with one keyslot (0) for passphrase and
// a fresh random 512-bit aes-xts-plain64 volume key, after zeroing the
// whole header area, then opens it again to check before returning.
func Format(dev Device, size int64, passphrase []byte, opt Options) (*Volume, error) {
	iter, err := iterations(opt)
	if err != nil {
		return nil, err
	}
	switch {
	case size < DataOffset+sectorSize:
		return nil, fmt.Errorf("%w: %d bytes, need more than %d", ErrTruncated, size, DataOffset)
	case size%sectorSize != 0:
		return nil, fmt.Errorf("%w: device of %d bytes, not a multiple of %d", ErrUnsupported, size, sectorSize)
	case len(opt.Label) > 47:
		return nil, fmt.Errorf("%w: label of %d bytes (at most 47)", ErrUnsupported, len(opt.Label))
	}
	if _, err := dev.WriteAt(make([]byte, DataOffset), 0); err != nil {
		return nil, fmt.Errorf("luks2: zero the header area: %w", err)
	}
	key := randomBytes(keySize)
	defer clear(key)
	k, err := newKeyslot(dev, key, passphrase, 2*hdrSize, iter)
	if err != nil {
		return nil, err
	}
	d, err := newDigest(key, iter)
	if err != nil {
		return nil, err
	}
	d.Keyslots = []string{"0"}
	img := &image{hdrSize: hdrSize, seqid: 1, label: opt.Label, csumAlg: "sha256", uuid: newUUID(), meta: &metadata{
		Keyslots: map[string]keyslot{"0": *k},
		Tokens:   map[string]json.RawMessage{},
		Segments: map[string]segment{"0": {Type: "crypt", Offset: DataOffset, Size: "dynamic", IVTweak: "0",
			Encryption: "aes-xts-plain64", SectorSize: sectorSize}},
		Digests: map[string]digest{"0": *d},
		Config:  config{JSONSize: hdrSize - binSize, KeyslotsSize: keyslotsSize},
	}}
	copy(img.salts[0][:], randomBytes(64))
	copy(img.salts[1][:], randomBytes(64))
	if err := writeImage(dev, img); err != nil {
		return nil, err
	}
	v, err := Open(dev, size, passphrase)
	if err != nil {
		return nil, fmt.Errorf("luks2: the header just written does not open: %w", err)
	}
	if !bytes.Equal(v.Key, key) {
		v.Clear()
		return nil, fmt.Errorf("%w: the header just written opens to another key", ErrCorrupt)
	}
	return v, nil
}

func newUUID() string {
	b := randomBytes(16)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// unlockForUpdate reads and unlocks a header we may rewrite: an update
// re-encodes the metadata, which keeps what cryptsetup 2.6 writes for luks2
// keyslots but would lose the members of another keyslot type.
func unlockForUpdate(dev Device, size int64, pass []byte) (*image, *Volume, error) {
	img, err := readImage(dev, size)
	if err != nil {
		return nil, nil, err
	}
	for id, k := range img.meta.Keyslots {
		if k.Type != "luks2" {
			return nil, nil, fmt.Errorf("%w: keyslot %s of type %q", ErrUnsupported, id, k.Type)
		}
	}
	v, err := unlock(dev, size, img, pass)
	return img, v, err
}

// AddKey adds a keyslot for newPass (pbkdf2-sha256, opt.Iterations),
// unlocking with pass: the new area is written first, then both header
// copies with seqid+1; the new passphrase is checked before returning.
func AddKey(dev Device, size int64, pass, newPass []byte, opt Options) error {
	iter, err := iterations(opt)
	if err != nil {
		return err
	}
	img, v, err := unlockForUpdate(dev, size, pass)
	if err != nil {
		return err
	}
	defer v.Clear()
	did, d := img.meta.digestFor(strconv.Itoa(v.Keyslot))
	id, ok := freeID(img.meta)
	off, ok2 := freeArea(img.meta, img.hdrSize, areaSize(len(v.Key)))
	if !ok || !ok2 {
		return ErrFull
	}
	k, err := newKeyslot(dev, v.Key, newPass, off, iter)
	if err != nil {
		return err
	}
	img.meta.Keyslots[id] = *k
	d.Keyslots = append(d.Keyslots, id)
	img.meta.Digests[did] = *d
	img.seqid++
	if err := writeImage(dev, img); err != nil {
		return err
	}
	check, err := Open(dev, size, newPass)
	if err != nil {
		return fmt.Errorf("luks2: the new keyslot does not open: %w", err)
	}
	defer check.Clear()
	if !bytes.Equal(check.Key, v.Key) {
		return fmt.Errorf("%w: the new keyslot opens to another key", ErrCorrupt)
	}
	return nil
}

// RemoveKey destroys the keyslot pass opens: its area overwritten (random,
// then zeros), then the keyslot removed from the JSON (both copies, seqid+1).
// It refuses to remove the last keyslot.
func RemoveKey(dev Device, size int64, pass []byte) error {
	img, v, err := unlockForUpdate(dev, size, pass)
	if err != nil {
		return err
	}
	v.Clear()
	if len(img.meta.Keyslots) < 2 {
		return ErrLastKeyslot
	}
	id := strconv.Itoa(v.Keyslot)
	a := img.meta.Keyslots[id].Area
	if err := wipe(dev, int64(a.Offset), int64(a.Offset+a.Size)); err != nil {
		return err
	}
	delete(img.meta.Keyslots, id)
	for did, d := range img.meta.Digests {
		d.Keyslots = slices.DeleteFunc(d.Keyslots, func(k string) bool { return k == id })
		img.meta.Digests[did] = d
	}
	img.seqid++
	return writeImage(dev, img)
}
