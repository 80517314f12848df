package devmapper

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestListDecodesGoldenReplies(t *testing.T) {
	tests := []struct {
		name  string
		reply []byte
		want  []Device
	}{
		{
			name:  "5.15+ layout with event_nr and uuids",
			reply: goldenListReplyNew(),
			want: []Device{
				{Name: "vg0-pool", Major: 253, Minor: 2, EventNr: 3, EventNrKnown: true, UUID: "LVM-0123456789abcdef-tpool", UUIDKnown: true},
				{Name: "vg0-thin1", Major: 253, Minor: 3, EventNr: 0, EventNrKnown: true, UUID: "", UUIDKnown: true},
				{Name: "big-minor", Major: 253, Minor: 300, EventNr: 7, EventNrKnown: true, UUID: "CRYPT-LUKS2-x", UUIDKnown: true},
			},
		},
		{
			name:  "pre-4.37 layout: names only",
			reply: goldenListReplyOld(),
			want: []Device{
				{Name: "vg0-lv0", Major: 253, Minor: 0},
				{Name: "vg0-lv1", Major: 253, Minor: 1},
			},
		},
		{
			name:  "4.37-4.44 layout: event_nr, uuid unknown",
			reply: goldenListReplyNoUUID(),
			want:  []Device{{Name: "vg1-data", Major: 253, Minor: 5, EventNr: 12, EventNrKnown: true}},
		},
		{
			name:  "no devices: empty payload",
			reply: kernelReply(kernelHeader{version: v4_48, flags: dmUUIDFlag}, nil),
		},
		{
			name:  "no devices: first record has dev 0",
			reply: kernelReply(kernelHeader{version: v4_48}, cat(u64(0), u32(0), pad(4))),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := replies(t, tt.reply)
			got, err := k.control().List(context.Background())
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)

			require.Equal(t, 1, k.callCount())
			c := k.call(0)
			assert.Equal(t, uintptr(0xc138fd02), c.req, "DM_LIST_DEVICES")
			assert.Equal(t, uint32(16384), c.dataSize())
			assert.Equal(t, uint32(dmUUIDFlag), c.flags(), "asks for uuids")
		})
	}
}

func TestListGoldenPayloadLength(t *testing.T) {
	// Guards the hand arithmetic in golden_test.go: the kernel's "needed"
	// for these three records is 64 + 32 + 48.
	require.Len(t, goldenListPayloadNew(), 144)
}

func TestDecodeNameListRejectsMalformed(t *testing.T) {
	tests := []struct {
		name    string
		version [3]uint32
		payload []byte
	}{
		{"next beyond payload", [3]uint32{4, 27, 0}, cat(u64(0xfd00), u32(200), str("a\x00"), pad(2))},
		{"next inside the header", [3]uint32{4, 27, 0}, cat(u64(0xfd00), u32(8), str("a\x00"), pad(2), u64(0xfd01), u32(0), str("b\x00"), pad(2))},
		{"unterminated name", [3]uint32{4, 27, 0}, cat(u64(0xfd00), u32(0), str("abcd"))},
		{"record header cut short", [3]uint32{4, 27, 0}, cat(u64(0xfd00), u32(16), str("a\x00"), pad(2), u64(0xfd01))},
		{"event_nr missing in 4.37+ layout", v4_48, cat(u64(0xfd00), u32(0), str("abc\x00"))},
		{"uuid flagged but outside record", v4_48, cat(u64(0xfd00), u32(0), str("abc\x00"), u32(0), u32(nlHasUUID))},
		{"uuid unterminated", v4_48, cat(u64(0xfd00), u32(0), str("abc\x00"), u32(0), u32(nlHasUUID), str("LVM-x"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := replies(t, kernelReply(kernelHeader{version: tt.version}, tt.payload))
			_, err := k.control().List(context.Background())
			require.ErrorIs(t, err, ErrMalformed)
			var e *Error
			require.ErrorAs(t, err, &e)
			assert.Equal(t, "DM_LIST_DEVICES", e.Op)
		})
	}
}

func TestListIgnoresUUIDFlagsWhenNotAsked(t *testing.T) {
	// The flags word is only meaningful when DM_UUID_FLAG was sent.
	buf := goldenListReplyNew()
	devs, err := decodeNameList(buf, decodeHeader(buf), false)
	require.NoError(t, err)
	require.Len(t, devs, 3)
	for _, d := range devs {
		assert.False(t, d.UUIDKnown, d.Name)
		assert.Empty(t, d.UUID, d.Name)
	}
}

func TestDecodeDevMatchesKernelEncoding(t *testing.T) {
	tests := []struct {
		dev          uint64
		major, minor uint32
	}{
		{0xfd00, 253, 0},
		{0x0801, 8, 1},
		{0x10fd2c, 253, 300},     // minor 300: low byte 0x2c, high bits 0x100 << 12
		{0xfff00, 4095, 0},       // largest major
		{0xfff000ff, 0, 0xfffff}, // largest minor
		{0xfffff0ff | 0xfff00, 4095, 0xfffff},
	}
	for _, tt := range tests {
		major, minor := decodeDev(tt.dev)
		assert.Equal(t, tt.major, major, "major of %#x", tt.dev)
		assert.Equal(t, tt.minor, minor, "minor of %#x", tt.dev)
		assert.Equal(t, tt.dev, encodeDev(tt.major, tt.minor), "encodeDev(%d, %d)", tt.major, tt.minor)
	}
}
