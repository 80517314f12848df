package lvmmeta

// For the external guest tests: the LV sections of the benchmark's VG.
var LVSections = lvSections

// Checksum is LVM2's CRC, for the guest benchmark's breakdown of a read.
var Checksum = checksum
