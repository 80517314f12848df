package luks2

import (
	"crypto/aes"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/binary"
	"fmt"
	"hash"
	"strconv"

	"golang.org/x/crypto/argon2"
	"golang.org/x/crypto/xts"
)

// Bounds on what a header may ask of us: a hostile or corrupt header must
// not make Open allocate gigabytes or spin for minutes.
const (
	maxIterations   = 1 << 24 // pbkdf2 (keyslot or digest)
	maxArgonMemory  = 1 << 20 // KiB: 1 GiB, cryptsetup's default maximum
	maxArgonTime    = 1 << 10
	maxArgonWork    = 1 << 24 // time × memory KiB: 16 passes over 1 GiB
	maxArgonThreads = 64
)

var hashes = map[string]func() hash.Hash{
	"sha1": sha1.New, "sha256": sha256.New, "sha512": sha512.New,
}

// checkKeyslot rejects a keyslot we cannot or will not open (ErrUnsupported)
// before any key derivation or allocation.
func checkKeyslot(k *keyslot) error {
	bad := func(f string, a ...any) error {
		return fmt.Errorf("%w: keyslot %s", ErrUnsupported, fmt.Sprintf(f, a...))
	}
	switch {
	case k.Type != "luks2":
		return bad("type %q", k.Type)
	case k.KeySize != 32 && k.KeySize != 64:
		return bad("key size %d", k.KeySize)
	case k.AF.Type != "luks1" || k.AF.Stripes != stripes || hashes[k.AF.Hash] == nil:
		// cryptsetup itself merges with 4000 stripes whatever the header says.
		return bad("af %s/%d/%s", k.AF.Type, k.AF.Stripes, k.AF.Hash)
	case k.Area.Type != "raw" || k.Area.Encryption != "aes-xts-plain64" || (k.Area.KeySize != 32 && k.Area.KeySize != 64):
		return bad("area %s %s/%d", k.Area.Type, k.Area.Encryption, k.Area.KeySize)
	case k.Area.Size < afSize(k.KeySize):
		return bad("area of %d bytes for %d", k.Area.Size, afSize(k.KeySize))
	case len(k.KDF.Salt) != saltSize:
		return bad("kdf salt of %d bytes", len(k.KDF.Salt))
	}
	switch d := k.KDF; d.Type {
	case "pbkdf2":
		if hashes[d.Hash] == nil || d.Iterations < 1 || d.Iterations > maxIterations {
			return bad("pbkdf2 %s × %d", d.Hash, d.Iterations)
		}
	case "argon2i", "argon2id":
		if d.Time < 1 || d.Time > maxArgonTime || d.Memory < 8 || d.Memory > maxArgonMemory ||
			d.Time*d.Memory > maxArgonWork || d.CPUs < 1 || d.CPUs > maxArgonThreads {
			return bad("%s time %d memory %d cpus %d", d.Type, d.Time, d.Memory, d.CPUs)
		}
	default:
		return bad("kdf %q", d.Type)
	}
	return nil
}

// afSize is the anti-forensic split's size on disk, in whole sectors.
func afSize(keySize int) uint64 { return (uint64(keySize)*stripes + 511) / 512 * 512 }

// derive runs the keyslot's KDF over the passphrase (checkKeyslot first).
func derive(k *keyslot, pass []byte) ([]byte, error) {
	d := k.KDF
	switch d.Type {
	case "argon2i":
		return argon2.Key(pass, d.Salt, uint32(d.Time), uint32(d.Memory), uint8(d.CPUs), uint32(k.Area.KeySize)), nil
	case "argon2id":
		return argon2.IDKey(pass, d.Salt, uint32(d.Time), uint32(d.Memory), uint8(d.CPUs), uint32(k.Area.KeySize)), nil
	}
	// crypto/pbkdf2 takes the password as a string: a copy we cannot clear.
	return pbkdf2.Key(hashes[d.Hash], string(pass), d.Salt, d.Iterations, k.Area.KeySize)
}

// areaCrypt en- or decrypts a keyslot area in place: aes-xts-plain64 in
// 512-byte sectors, the IV counting sectors from the area's start.
func areaCrypt(key, buf []byte, encrypt bool) error {
	c, err := xts.NewCipher(aes.NewCipher, key)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	for s := 0; s*512 < len(buf); s++ {
		b := buf[s*512 : (s+1)*512]
		if encrypt {
			c.Encrypt(b, b, uint64(s))
		} else {
			c.Decrypt(b, b, uint64(s))
		}
	}
	return nil
}

// diffuse is the AF hash diffusion: each hash-sized chunk of b replaced by
// H(be32(chunk index) || chunk), truncated for the last chunk.
func diffuse(newHash func() hash.Hash, b []byte) {
	h := newHash()
	var iv [4]byte
	for i, n := 0, h.Size(); i*n < len(b); i++ {
		chunk := b[i*n : min((i+1)*n, len(b))]
		binary.BigEndian.PutUint32(iv[:], uint32(i))
		h.Reset()
		h.Write(iv[:])
		h.Write(chunk)
		sum := h.Sum(nil)
		copy(chunk, sum)
		clear(sum)
	}
}

// afSplit spreads key over stripes blocks (all but the last random) so that
// losing any part of the area loses the key; afMerge undoes it.
func afSplit(key []byte, newHash func() hash.Hash) []byte {
	n := len(key)
	out := make([]byte, afSize(n))
	_, _ = rand.Read(out[:(stripes-1)*n])
	buf := make([]byte, n)
	for i := 0; i < stripes-1; i++ {
		subtle.XORBytes(buf, buf, out[i*n:(i+1)*n])
		diffuse(newHash, buf)
	}
	subtle.XORBytes(out[(stripes-1)*n:stripes*n], buf, key)
	clear(buf)
	return out
}

func afMerge(split []byte, n int, newHash func() hash.Hash) []byte {
	buf := make([]byte, n)
	for i := 0; i < stripes-1; i++ {
		subtle.XORBytes(buf, buf, split[i*n:(i+1)*n])
		diffuse(newHash, buf)
	}
	subtle.XORBytes(buf, buf, split[(stripes-1)*n:stripes*n])
	return buf
}

// openKeyslot recovers keyslot id's volume key with pass and checks it
// against the slot's digest: ErrWrongKey when it does not match.
func openKeyslot(dev Device, size int64, m *metadata, id string, pass []byte) ([]byte, error) {
	k := m.Keyslots[id]
	if err := checkKeyslot(&k); err != nil {
		return nil, err
	}
	_, d := m.digestFor(id)
	if d == nil {
		return nil, fmt.Errorf("%w: keyslot %s has no digest for segment 0", ErrCorrupt, id)
	}
	if err := checkDigest(d); err != nil {
		return nil, err
	}
	area, err := readAt(dev, size, int64(k.Area.Offset), int64(afSize(k.KeySize)))
	if err != nil {
		return nil, err
	}
	defer clear(area)
	dk, err := derive(&k, pass)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	err = areaCrypt(dk, area, false)
	clear(dk)
	if err != nil {
		return nil, err
	}
	key := afMerge(area, k.KeySize, hashes[k.AF.Hash])
	sum, err := pbkdf2.Key(hashes[d.Hash], string(key), d.Salt, d.Iterations, len(d.Digest))
	if err != nil || subtle.ConstantTimeCompare(sum, d.Digest) != 1 {
		clear(key)
		return nil, ErrWrongKey
	}
	return key, nil
}

func checkDigest(d *digest) error {
	if d.Type != "pbkdf2" || hashes[d.Hash] == nil || d.Iterations < 1 || d.Iterations > maxIterations ||
		len(d.Salt) != saltSize || (len(d.Digest) != 20 && len(d.Digest) != hashes[d.Hash]().Size()) {
		return fmt.Errorf("%w: digest %s/%s × %d", ErrUnsupported, d.Type, d.Hash, d.Iterations)
	}
	return nil
}

// newKeyslot encrypts key's AF split under pass into the area at offset
// and returns the keyslot to add to the JSON (after the area is written).
func newKeyslot(dev Device, key, pass []byte, offset uint64, iterations int) (*keyslot, error) {
	k := &keyslot{Type: "luks2", KeySize: len(key)}
	k.AF.Type, k.AF.Stripes, k.AF.Hash = "luks1", stripes, "sha256"
	k.Area.Type, k.Area.Offset, k.Area.Size = "raw", offset, areaSize(len(key))
	k.Area.Encryption, k.Area.KeySize = "aes-xts-plain64", 64
	k.KDF = kdf{Type: "pbkdf2", Hash: "sha256", Iterations: iterations, Salt: randomBytes(saltSize)}
	dk, err := derive(k, pass)
	if err != nil {
		return nil, err
	}
	split := afSplit(key, sha256.New)
	defer clear(split)
	err = areaCrypt(dk, split, true)
	clear(dk)
	if err != nil {
		return nil, err
	}
	if _, err := dev.WriteAt(split, int64(offset)); err != nil {
		return nil, fmt.Errorf("luks2: write keyslot area at %d: %w", offset, err)
	}
	return k, syncDev(dev)
}

// areaSize is one keyslot area: the split key rounded up to 4 KiB.
func areaSize(keySize int) uint64 { return (afSize(keySize) + 4095) / 4096 * 4096 }

// newDigest is the pbkdf2-sha256 digest that tells the right key.
func newDigest(key []byte, iterations int) (*digest, error) {
	d := &digest{Type: "pbkdf2", Keyslots: []string{}, Segments: []string{"0"}, Hash: "sha256",
		Iterations: iterations, Salt: randomBytes(saltSize)}
	var err error
	d.Digest, err = pbkdf2.Key(sha256.New, string(key), d.Salt, iterations, sha256.Size)
	return d, err
}

// freeArea finds room for one more keyslot area of n bytes, 4 KiB aligned.
func freeArea(m *metadata, hdrSize int64, n uint64) (uint64, bool) {
	lo, hi := uint64(2*hdrSize), uint64(2*hdrSize)+m.Config.KeyslotsSize
	for off := lo; off+n <= hi; off += 4096 {
		free := true
		for _, k := range m.Keyslots {
			if off < k.Area.Offset+k.Area.Size && k.Area.Offset < off+n {
				free, off = false, (k.Area.Offset+k.Area.Size+4095)/4096*4096-4096
				break
			}
		}
		if free {
			return off, true
		}
	}
	return 0, false
}

// freeID is the lowest unused keyslot id.
func freeID(m *metadata) (string, bool) {
	for i := 0; i < 32; i++ {
		if _, ok := m.Keyslots[strconv.Itoa(i)]; !ok {
			return strconv.Itoa(i), true
		}
	}
	return "", false
}
