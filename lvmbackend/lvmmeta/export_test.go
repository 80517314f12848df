package lvmmeta

// For the external guest tests: the LV sections of the benchmark's VG.
var LVSections = lvSections
