package lvmmeta

import (
	"bytes"
	"embed"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// image is an in-memory PV laid out the way pvcreate and vgcreate lay one
// out: the label in sector 1, one metadata area at 4 KiB.
type image struct {
	b        []byte
	uuid     string // 32 characters, no dashes
	mdaStart uint64
	mdaSize  uint64
}

func newImage(uuid string, mdaSize uint64) *image {
	im := &image{b: make([]byte, 4096+mdaSize+4096), uuid: strings.ReplaceAll(uuid, "-", ""), mdaStart: 4096, mdaSize: mdaSize}
	im.writeLabel()
	im.commit(RawLocn{}) // an empty area, as pvcreate leaves it
	return im
}

func (im *image) writeLabel() {
	le := binary.LittleEndian
	sec := im.b[sectorSize : 2*sectorSize]
	clear(sec)
	copy(sec, labelID)
	le.PutUint64(sec[8:], 1)
	le.PutUint32(sec[20:], labelHeaderSize)
	copy(sec[24:], labelType)
	pv := sec[labelHeaderSize:]
	copy(pv, im.uuid)
	le.PutUint64(pv[32:], uint64(len(im.b)))
	areas := pv[40:]
	le.PutUint64(areas[0:], im.mdaStart+im.mdaSize) // data area, size 0: to the end
	// {0,0} ends the data areas, then the metadata area and its {0,0}.
	le.PutUint64(areas[32:], im.mdaStart)
	le.PutUint64(areas[40:], im.mdaSize)
	le.PutUint32(sec[16:], checksum(sec[20:]))
}

// commit writes the header with slot 0 = c.
func (im *image) commit(c RawLocn) {
	le := binary.LittleEndian
	h := im.b[im.mdaStart : im.mdaStart+mdaHeaderSize]
	clear(h)
	copy(h[4:], mdaMagic)
	le.PutUint32(h[20:], fmtVersion)
	le.PutUint64(h[24:], im.mdaStart)
	le.PutUint64(h[32:], im.mdaSize)
	le.PutUint64(h[40:], c.Offset)
	le.PutUint64(h[48:], c.Size)
	le.PutUint32(h[56:], c.Checksum)
	le.PutUint32(h[60:], c.Flags)
	le.PutUint32(h, checksum(h[4:]))
}

// writeText puts text into the ring at offset (from the area's start),
// wrapping to just after the header, and returns the slot for it.
func (im *image) writeText(offset uint64, text []byte) RawLocn {
	ring := im.b[im.mdaStart : im.mdaStart+im.mdaSize]
	n := copy(ring[offset:], text)
	copy(ring[mdaHeaderSize:], text[n:])
	return RawLocn{Offset: offset, Size: uint64(len(text)), Checksum: checksum(text)}
}

func (im *image) reader() *bytes.Reader { return bytes.NewReader(im.b) }

// The test texts are embedded: the guest runs the test binary far from
// the source tree.
//
//go:embed testdata/*.vgtext
var testdata embed.FS

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := testdata.ReadFile("testdata/" + name)
	require.NoError(t, err)
	return b
}

// withSeqno rewrites the seqno of a VG text.
func withSeqno(text []byte, seqno string) []byte {
	return bytes.Replace(text, []byte("seqno = 42"), []byte("seqno = "+seqno), 1)
}

// lvSections writes n linear LVs of one extent each on pv0, from extent
// first on, each with two tags: the VG text of a node with n volumes.
func lvSections(n, first int) string {
	var b strings.Builder
	for i := range n {
		id := fmt.Sprintf("bench%027d", i)
		uuid := id[0:6] + "-" + id[6:10] + "-" + id[10:14] + "-" + id[14:18] + "-" + id[18:22] + "-" + id[22:26] + "-" + id[26:32]
		fmt.Fprintf(&b, `lv%04d {
id = "%s"
status = ["READ", "WRITE", "VISIBLE"]
flags = []
tags = ["lvm-agent.io/owner=%08d", "bench"]
creation_time = 1764579600
creation_host = "guest"
segment_count = 1
segment1 {
start_extent = 0
extent_count = 1
type = "striped"
stripe_count = 1
stripes = ["pv0", %d]
}
}
`, i, uuid, i, first+i)
	}
	return b.String()
}

// manyLVText is vg0.vgtext with n more LVs.
func manyLVText(tb testing.TB, n int) []byte {
	text := readTestdata(tb, "vg0.vgtext")
	marker := []byte("logical_volumes {\n")
	at := bytes.Index(text, marker) + len(marker)
	return slices.Concat(text[:at], []byte(lvSections(n, 100)), text[at:])
}
