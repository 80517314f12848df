package lvmmeta

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testPVUUID = "AbCdEf-0000-1111-2222-3333-4444-555555"

func TestReadPV(t *testing.T) {
	text := readTestdata(t, "vg0.vgtext")
	ring := uint64(len(text)) * 3 / 2
	cases := map[string]uint64{
		"after the header": mdaHeaderSize,
		// The text starts near the end of the ring and goes on after the header.
		"wrapped":         mdaHeaderSize + ring - 100,
		"wrapped early":   mdaHeaderSize + ring - uint64(len(text)) + 1,
		"ends at the end": mdaHeaderSize + ring - uint64(len(text)),
	}
	for name, offset := range cases {
		t.Run(name, func(t *testing.T) {
			im := newImage(testPVUUID, mdaHeaderSize+ring)
			im.commit(im.writeText(offset, text))
			m, err := NewReader(Limits{}).ReadPV(im.reader(), "img")
			require.NoError(t, err)
			assert.Equal(t, uint64(1), m.Label.Sector)
			assert.Equal(t, testPVUUID, m.Label.PVUUID)
			assert.Equal(t, []Area{{4096, mdaHeaderSize + ring}}, m.Label.MetadataAreas)
			require.NotNil(t, m.VG)
			assert.Equal(t, uint64(42), m.VG.Seqno)
			assert.Len(t, m.VG.LVs, 10)
			assert.Equal(t, strings.HasPrefix(name, "wrapped"), m.Wrapped)
		})
	}
}

func TestReadPVEmptyAndIgnored(t *testing.T) {
	im := newImage(testPVUUID, 8192)
	m, err := NewReader(Limits{}).ReadPV(im.reader(), "img")
	require.NoError(t, err)
	assert.Nil(t, m.VG, "a PV in no VG")

	c := im.writeText(mdaHeaderSize, readTestdata(t, "vg0.vgtext")[:100])
	c.Flags = rawLocnIgnored
	im.commit(c)
	m, err = NewReader(Limits{}).ReadPV(im.reader(), "img")
	require.NoError(t, err)
	assert.Nil(t, m.VG, "an ignored area")

	_, err = NewReader(Limits{}).ReadPV(bytes.NewReader(make([]byte, 8192)), "zero")
	require.ErrorIs(t, err, ErrNoLabel)
}

func TestReadPVRefusesCorruption(t *testing.T) {
	text := readTestdata(t, "vg0.vgtext")
	fresh := func() *image {
		im := newImage(testPVUUID, 64<<10)
		im.commit(im.writeText(mdaHeaderSize, text))
		return im
	}
	cases := map[string]struct {
		mutate func(im *image)
		err    error
	}{
		"label checksum":  {func(im *image) { im.b[sectorSize+100] ^= 1 }, ErrCorrupt},
		"label sector":    {func(im *image) { im.b[sectorSize+8] = 2 }, ErrCorrupt},
		"header checksum": {func(im *image) { im.b[im.mdaStart+300] ^= 1 }, ErrCorrupt},
		"header magic":    {func(im *image) { im.b[im.mdaStart+5] = 'X' }, ErrCorrupt},
		"text checksum":   {func(im *image) { im.b[im.mdaStart+mdaHeaderSize+200] ^= 1 }, ErrCorrupt},
		"text too big for the ring": {func(im *image) {
			im.commit(RawLocn{Offset: mdaHeaderSize, Size: im.mdaSize, Checksum: 1})
		}, ErrCorrupt},
		"text offset outside": {func(im *image) {
			im.commit(RawLocn{Offset: im.mdaSize + 1, Size: 10})
		}, ErrCorrupt},
		"text over the limit": {func(im *image) {
			im.commit(RawLocn{Offset: mdaHeaderSize, Size: 32 << 20})
		}, ErrTooLarge},
		"unparsable text": {func(im *image) {
			im.commit(im.writeText(mdaHeaderSize, []byte("vg0 {")))
		}, ErrCorrupt},
		"header disagrees with pv_header": {func(im *image) {
			im.mdaSize /= 2
			im.commit(im.writeText(mdaHeaderSize, text))
		}, ErrCorrupt},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			im := fresh()
			c.mutate(im)
			_, err := NewReader(Limits{}).ReadPV(im.reader(), "img")
			require.ErrorIs(t, err, c.err)
		})
	}
	t.Run("checksum error says which", func(t *testing.T) {
		im := fresh()
		im.b[im.mdaStart+300] ^= 1
		_, err := NewReader(Limits{}).ReadPV(im.reader(), "img")
		var ce *ChecksumError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, "metadata area header", ce.What)
	})
}

// committer is a device on which lvm commits a new seqno right after the
// reader has read the text the first time: the reader must notice the
// moved header and return the new state, whole.
type committer struct {
	im     *image
	reads  int
	after  int // commit after this many reads (3: after the first text)
	commit func()
}

func (c *committer) ReadAt(p []byte, off int64) (int, error) {
	n := copy(p, c.im.b[off:])
	c.reads++
	// Reads: label, header, text, header... commit after the first text.
	if c.reads == c.after && c.commit != nil {
		c.commit()
		c.commit = nil
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func TestReadPVRetriesAcrossACommit(t *testing.T) {
	text := readTestdata(t, "vg0.vgtext")
	im := newImage(testPVUUID, 64<<10)
	first := im.writeText(mdaHeaderSize, text)
	im.commit(first)
	next := withSeqno(text, "43")
	dev := &committer{im: im, after: 3, commit: func() {
		// lvm: the new text into free ring space, then the header.
		im.commit(im.writeText(mdaHeaderSize+first.Size, next))
	}}
	m, err := NewReader(Limits{}).ReadPV(dev, "img")
	require.NoError(t, err)
	assert.Equal(t, uint64(43), m.VG.Seqno)
	assert.Equal(t, 6, dev.reads, "label, header, text, header, then text and header again")

	// A text overwritten in place under an unchanged header is corruption,
	// not a commit: refused.
	dev = &committer{im: im, after: 2, commit: func() { im.b[im.mdaStart+mdaHeaderSize+first.Size+10] ^= 1 }}
	_, err = NewReader(Limits{}).ReadPV(dev, "img2")
	require.ErrorIs(t, err, ErrCorrupt)
}

func TestReaderCache(t *testing.T) {
	text := readTestdata(t, "vg0.vgtext")
	im := newImage(testPVUUID, 64<<10)
	c := im.writeText(mdaHeaderSize, text)
	im.commit(c)
	rd := NewReader(Limits{})
	m1, err := rd.ReadPV(im.reader(), "img")
	require.NoError(t, err)
	m2, err := rd.ReadPV(im.reader(), "img")
	require.NoError(t, err)
	assert.Same(t, m1.VG, m2.VG, "unchanged header: the parsed VG is reused")

	im.commit(im.writeText(mdaHeaderSize+c.Size, withSeqno(text, "43")))
	m3, err := rd.ReadPV(im.reader(), "img")
	require.NoError(t, err)
	assert.Equal(t, uint64(43), m3.VG.Seqno)
	assert.Len(t, rd.cache, 1, "one entry per area")
}

func TestCombine(t *testing.T) {
	text := readTestdata(t, "vg0.vgtext")
	read := func(uuid string, text []byte) *PVMetadata {
		im := newImage(uuid, 64<<10)
		im.commit(im.writeText(mdaHeaderSize, text))
		m, err := NewReader(Limits{}).ReadPV(im.reader(), uuid)
		require.NoError(t, err)
		return m
	}
	pv0 := read("AbCdEf-0000-1111-2222-3333-4444-555555", text)
	pv1old := read("GhIjKl-6666-7777-8888-9999-aaaa-bbbbbb", text)
	pv1new := read("GhIjKl-6666-7777-8888-9999-aaaa-bbbbbb", withSeqno(text, "43"))

	st, err := Combine([]FoundPV{{"/dev/a", pv0}, {"/dev/b", pv1new}})
	require.NoError(t, err)
	vg, err := st.VG("vg0")
	require.NoError(t, err)
	assert.Equal(t, uint64(43), vg.Seqno, "the highest committed seqno wins")

	_, err = st.VG("vg9")
	require.ErrorIs(t, err, ErrNoVG)

	_, err = Combine([]FoundPV{{"/dev/a", pv0}})
	require.ErrorIs(t, err, ErrUnsupported, "a PV of the VG is missing")

	_, err = Combine([]FoundPV{{"/dev/a", pv0}, {"/dev/b", pv1old}, {"/dev/c", pv1old}})
	require.ErrorIs(t, err, ErrUnsupported, "one PV on two devices")

	other := read("GhIjKl-6666-7777-8888-9999-aaaa-bbbbbb", bytes.Replace(text, []byte(`tags = ["t1"]`), []byte(`tags = ["t2"]`), 1))
	_, err = Combine([]FoundPV{{"/dev/a", pv0}, {"/dev/b", other}})
	require.ErrorIs(t, err, ErrCorrupt, "one seqno, two texts")

	lockd := bytes.Replace(text, []byte("seqno = 42"), []byte("seqno = 42\nlock_type = \"sanlock\""), 1)
	st, err = Combine([]FoundPV{{"/dev/a", read("AbCdEf-0000-1111-2222-3333-4444-555555", lockd)},
		{"/dev/b", read("GhIjKl-6666-7777-8888-9999-aaaa-bbbbbb", lockd)}})
	require.NoError(t, err)
	_, err = st.VG("vg0")
	require.ErrorIs(t, err, ErrUnsupported, "a shared VG")
}
