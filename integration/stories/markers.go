package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// marker fills a device: 16 bytes, a line each, so that a Pod counts them
// with busybox (countScript) and the node with countMarkers.
const (
	markerLine = "LVM-AGENT-WIPE!"
	marker     = markerLine + "\n"
)

// fillScript has a Pod fill its whole device (/dev/xvda) with markers.
const fillScript = `n=$(blockdev --getsize64 /dev/xvda) && /bin/busybox yes '` + markerLine +
	`' | head -c "$n" >/dev/xvda && sync && echo "filled: $n bytes"`

// countScript has a Pod print the markers on its device from MiB SKIP on,
// after reading it whole (the NULs squeezed into one line, so that a zeroed
// device is a few lines, not millions), as "LABEL: N markers, read F+P
// blocks of 1 MiB" (dd's full and partial blocks).
func countScript(label string, skipMiB int) string {
	return fmt.Sprintf(`n=$(dd if=/dev/xvda bs=1M skip=%d 2>/dd.log | /bin/busybox tr -s '\000' '\n' | /bin/busybox grep -c -x -F '%s'); `+
		`echo "%s: $n markers, read $(/bin/busybox sed -n 's/ records in//p' /dd.log) blocks of 1 MiB"`,
		skipMiB, markerLine, label)
}

// podCount is one of countScript's lines: the markers, and the MiB read.
type podCount struct{ markers, mib int64 }

var countLine = regexp.MustCompile(`(?m)^([\w-]+): (\d+) markers, read (\d+)\+(\d+) blocks of 1 MiB$`)

// parseCounts reads countScript's lines by label. A partial block (a
// device not a whole number of MiB) counts as a MiB.
func parseCounts(out string) map[string]podCount {
	counts := map[string]podCount{}
	for _, m := range countLine.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.ParseInt(m[2], 10, 64)
		full, _ := strconv.ParseInt(m[3], 10, 64)
		partial, _ := strconv.ParseInt(m[4], 10, 64)
		counts[m[1]] = podCount{n, full + partial}
	}
	return counts
}

// countMarkers counts the markers in r, wherever they are, and the bytes
// read. Each chunk is counted with the end of the one before it, where a
// marker may begin (a marker never overlaps itself, so none counts twice).
func countMarkers(r io.Reader, m []byte) (n, size int64, err error) {
	buf := make([]byte, len(m)-1+1<<20)
	keep := 0
	for {
		k, err := io.ReadFull(r, buf[keep:])
		size += int64(k)
		chunk := buf[:keep+k]
		n += int64(bytes.Count(chunk, m))
		switch {
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			return n, size, nil
		case err != nil:
			return n, size, err
		}
		keep = copy(buf, chunk[len(chunk)-(len(m)-1):])
	}
}

// NodeMarkers counts the markers on a device, read whole on the node.
func (s *Story) NodeMarkers(device string) (n, size int64) {
	f, err := os.Open(device)
	s.Must(err, "reading %s on the node", device)
	defer f.Close()
	n, size, err = countMarkers(f, []byte(marker))
	s.Must(err, "reading %s on the node", device)
	s.Say("the node reads %s whole (%d bytes): %d markers", device, size, n)
	return n, size
}

// NodeFill fills a device with markers from the node, to its end, synced.
func (s *Story) NodeFill(device string) {
	f, err := os.OpenFile(device, os.O_WRONLY, 0)
	s.Must(err, "opening %s on the node", device)
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	s.Must(err, "reading %s's size", device)
	chunk := []byte(strings.Repeat(marker, (1<<20)/len(marker)))
	for off := int64(0); off < size; off += int64(len(chunk)) {
		_, err := f.WriteAt(chunk[:min(int64(len(chunk)), size-off)], off)
		s.Must(err, "writing markers to %s at %d", device, off)
	}
	s.Must(f.Sync(), "syncing %s", device)
	s.Say("the node fills %s with markers: %d bytes, synced", device, size)
}
