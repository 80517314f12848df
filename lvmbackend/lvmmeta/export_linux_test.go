package lvmmeta

// ReadText reads n bytes at off as the Reader reads a text: O_DIRECT into
// a new aligned buffer (for the guest benchmark's breakdown of a read).
func ReadText(d *Device, off int64, n int) ([]byte, error) { return d.window(off, n) }
