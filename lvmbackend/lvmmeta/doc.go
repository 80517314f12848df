// Package lvmmeta reads LVM2's on-disk metadata in pure Go: the label and
// pv_header of each physical volume, the metadata area header, and the
// volume group text it points to, every piece checked against its CRC. It
// only reads; lvmd stays the only writer.
//
// Layout of the package:
//
//   - crc.go: LVM's CRC-32 variant.
//   - label.go: the label sector and the pv_header that follows it.
//   - mda.go: the metadata area header and where its committed text lies
//     (the text may wrap around the end of the ring).
//   - text.go: a bounded parser of LVM's config syntax (sections,
//     assignments, strings, numbers, lists).
//   - vg.go: the parsed text as a volume group: PVs, LVs, segments and the
//     relations lvs reports (thin pool, snapshot origin).
//   - pv.go: reading one PV consistently (header, text, header again) and
//     choosing a VG's newest committed copy among its PVs.
//   - device_linux.go: block devices opened with O_DIRECT, through a
//     sector-aligned buffer, so that the page cache never answers with a
//     copy older than what lvm wrote through its own file descriptor.
//   - scan.go: finding PVs among the node's block devices.
//
// Everything that parses bytes is fuzzed (fuzz_test.go); hostile input is
// bounded by Limits.
package lvmmeta
