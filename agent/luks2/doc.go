// Package luks2 writes and reads LUKS2 headers, in pure Go, compatibly with
// cryptsetup 2.6 both ways: the agent formats each encrypted logical volume
// itself and loads the dm-crypt table itself (Volume.TableParams), never
// running cryptsetup. It implements only what that needs, from the LUKS2
// on-disk format specification: one aes-xts-plain64 data segment, luks2
// keyslots (pbkdf2, argon2i, argon2id; luks1 anti-forensic split) and
// pbkdf2 digests. Everything else (integrity, reencryption, tokens'
// meaning, LUKS1) is ErrUnsupported or ErrNotLUKS2, never guessed.
//
// # Layout
//
// Format keeps the per-volume overhead to one megabyte:
//
//	0        primary header: 4 KiB binary header + 12 KiB JSON area
//	16 KiB   secondary header (the same, its own salt and offset)
//	32 KiB   keyslots area, 1015808 bytes: keyslot 0 at 32 KiB, each area
//	         258048 bytes (64-byte key × 4000 stripes, rounded up to 4 KiB),
//	         room for three (rotation needs two at once)
//	1 MiB    data segment (DataOffset), size "dynamic": the rest of the
//	         device, so growing the LV needs no header change
//
// The data segment's sector size is 4096 (see TableParams for the table
// cryptsetup builds for it), which needs the device size to be a multiple
// of 4 KiB (logical volumes are whole extents).
//
// # Key derivation
//
// A keyslot's passphrase here is a random machine key of at least 32 bytes
// (the agent refuses shorter Secrets), not something a human chose and an
// attacker can guess. A memory-hard argon2id (cryptsetup's default: up to 1
// GiB and about 2 s per unlock) would only slow a guess that cannot succeed
// anyway, and would cost a small node a gigabyte per create. So keyslots we
// write use pbkdf2-sha256 with cryptsetup's minimum 1000 iterations
// (Options.Iterations raises it), as does the volume key digest. Open still
// opens argon2i/argon2id keyslots cryptsetup wrote, within bounds (at most 1
// GiB, 16 GiB-passes) so that a hostile header cannot exhaust the node.
//
// # Keys in memory
//
// Derived keys, decrypted key material and the volume key are overwritten
// when no longer needed, and Volume.Clear overwrites the caller's copy. This
// is best effort: Go may copy memory, crypto/pbkdf2 takes its password as a
// string (a copy we cannot clear), and AES and HMAC keep expanded keys
// until collected.
//
// # Updates
//
// Every update (AddKey, RemoveKey) rewrites both header copies with seqid
// incremented, primary first and synced between the two, so at most one copy
// is ever torn; reads take the sound copy with the highest seqid, as
// cryptsetup does. An update re-encodes the metadata from what we decode:
// everything cryptsetup 2.6 writes for a luks2 keyslot, a crypt segment, a
// pbkdf2 digest, tokens (verbatim) and config flags. It refuses a header
// with another keyslot type, whose members it would drop. The caller
// serializes operations on one device.
package luks2
