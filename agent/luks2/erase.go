package luks2

import (
	"bytes"
	"errors"
	"fmt"
)

const wipeChunk = 1 << 20

// wipe overwrites [from, to) with random bytes, then zeros, syncing after
// each pass (a pass left in the page cache would be merged with the next),
// then reads the range back to check it is zero.
func wipe(dev Device, from, to int64) error {
	for _, random := range []bool{true, false} {
		for off := from; off < to; off += wipeChunk {
			b := make([]byte, min(wipeChunk, to-off))
			if random {
				b = randomBytes(len(b))
			}
			if _, err := dev.WriteAt(b, off); err != nil {
				return fmt.Errorf("luks2: wipe at %d: %w", off, err)
			}
		}
		if err := syncDev(dev); err != nil {
			return err
		}
	}
	return checkZero(dev, from, to)
}

func checkZero(dev Device, from, to int64) error {
	zero := make([]byte, wipeChunk)
	for off := from; off < to; off += wipeChunk {
		b, err := readAt(dev, to, off, min(wipeChunk, to-off))
		if err != nil {
			return err
		}
		if !bytes.Equal(b, zero[:len(b)]) {
			return fmt.Errorf("luks2: %d bytes at %d are not zero after the wipe", len(b), off)
		}
	}
	return nil
}

// Erase destroys the volume for good (crypto-erase): every keyslot's area
// and both header copies, i.e. everything before the data segment, are
// overwritten with random bytes then zeros and read back. Without the
// keyslots and the KDF salts neither the passphrase nor a copy of the disk
// taken afterwards recovers the volume key.
//
// The first 4 KiB (the primary binary header: magic, UUID, checksum; no
// secret) are zeroed last and only zeroed: until then a retried Erase (a
// crash midway) still finds LUKS2 there (sound or ErrCorrupt) and goes on.
// A device whose header area is already all zero is erased (nil): a retried
// delete. Anything else without a LUKS2 header is refused (ErrNotLUKS2):
// Erase does not wipe what it did not recognize.
func Erase(dev Device, size int64) error {
	end := int64(DataOffset)
	img, err := readImage(dev, size)
	switch {
	case err == nil:
		end = max(end, img.meta.end(img.hdrSize))
	case errors.Is(err, ErrCorrupt), errors.Is(err, ErrTruncated):
		// A torn or half-erased header: wipe our layout's header area.
	case errors.Is(err, ErrNotLUKS2):
		if zerr := checkZero(dev, 0, min(end, size)); zerr != nil {
			return fmt.Errorf("%w: refusing to erase (%v)", err, zerr)
		}
		return nil
	default:
		return err
	}
	end = min(end, size)
	if end <= binSize {
		return fmt.Errorf("%w: %d bytes", ErrTruncated, size)
	}
	if err := wipe(dev, binSize, end); err != nil {
		return err
	}
	if _, err := dev.WriteAt(make([]byte, binSize), 0); err != nil {
		return fmt.Errorf("luks2: zero the primary header: %w", err)
	}
	if err := syncDev(dev); err != nil {
		return err
	}
	return checkZero(dev, 0, end)
}
