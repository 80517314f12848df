package lvmmeta

import "hash/crc32"

// initialCRC is the seed of every checksum in LVM2's on-disk format
// (lib/misc/crc.h INITIAL_CRC).
const initialCRC = 0xf597a6cf

// checksum is LVM2's calc_crc over the concatenation of parts: the
// reflected CRC-32 polynomial seeded with initialCRC and without the final
// inversion. Go's crc32.Update inverts on the way in and out, so the seed
// and the result are inverted here to cancel it.
func checksum(parts ...[]byte) uint32 {
	c := ^uint32(initialCRC)
	for _, p := range parts {
		c = crc32.Update(c, crc32.IEEETable, p)
	}
	return ^c
}
