package devmapper

import (
	"math"
	"slices"
	"strings"
	"testing"
)

// The parsers see strings produced by the kernel, but a bug there, a newer
// kernel or a corrupted reply must cost an error, never a panic in the
// agent. Each fuzz target checks that and a few invariants of successful
// parses.

func FuzzParseThinPoolStatus(f *testing.F) {
	for _, s := range []string{
		goldenThinPoolParams,
		"42 900/1024 16384/16384 17 out_of_data_space no_discard_passdown error_if_no_space needs_check 256 ",
		"0 100/2048 0/1600 - discard_passdown rw",
		"0 100/2048 0/1600 -",
		"Fail", "Error", "", "1 2/4 6/8 - rw 5 6", "1 /4 6/8 -", "1 2/4 6/8 - - - - 7",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, params string) {
		s, err := ParseThinPoolStatus(params)
		if err != nil {
			return
		}
		for _, v := range []float64{s.DataUsedFraction(), s.MetadataUsedFraction()} {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				t.Fatalf("fraction %v from %q", v, params)
			}
		}
		if s.State != StateOK && s != (ThinPoolStatus{State: s.State}) {
			t.Fatalf("state %s with data for %q", s.State, params)
		}
	})
}

func FuzzParseThinStatus(f *testing.F) {
	for _, s := range []string{"2048 2047", "0 -", "Fail", "Error", "-", "", "1 2 3", "18446744073709551615 -"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, params string) {
		s, err := ParseThinStatus(params)
		if err != nil {
			return
		}
		if !s.AnyMapped && s.HighestMappedSector != 0 {
			t.Fatalf("highest sector without mapping for %q", params)
		}
		_ = s.MappedBytes()
	})
}

// FuzzParseThinPoolTable: besides never panicking, a parse that succeeds
// accounts for every word, and ZeroesNewBlocks is false exactly when
// skip_block_zeroing is among the features.
func FuzzParseThinPoolTable(f *testing.F) {
	for _, s := range []string{
		"253:0 253:1 128 0 0 ", "253:0 253:1 128 0 1 skip_block_zeroing ",
		"252:10 252:11 1024 16 3 ignore_discard skip_block_zeroing error_if_no_space",
		"8:16 8:32 128 0", "8:16 8:32 128 0 1", "8:16 8:32 128 0 0 extra",
		"8:16 8:32 128 0 18446744073709551615 x", "Fail", "", "1:2 3:4 5 6 -1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, params string) {
		tb, err := ParseThinPoolTable(params)
		if err != nil {
			return
		}
		if n := len(strings.Fields(params)); n != 4 && n != 5+len(tb.Features) {
			t.Fatalf("%d words, %d features from %q", n, len(tb.Features), params)
		}
		skip := slices.ContainsFunc(tb.Features, func(a string) bool { return strings.EqualFold(a, "skip_block_zeroing") })
		if tb.ZeroesNewBlocks == skip {
			t.Fatalf("ZeroesNewBlocks %v with features %q", tb.ZeroesNewBlocks, tb.Features)
		}
	})
}

// fuzzReply wraps fuzzer bytes as the payload of a reply header.
func fuzzReply(payload []byte, minor, targetCount uint32) []byte {
	buf := kernelReply(kernelHeader{version: [3]uint32{4, minor, 0}, targetCount: targetCount}, payload)
	return buf
}

func FuzzDecodeNameList(f *testing.F) {
	f.Add(goldenListPayloadNew(), uint32(48), true)
	f.Add(goldenListReplyOld()[312:], uint32(27), false)
	f.Add(goldenListReplyNoUUID()[312:], uint32(39), true)
	f.Add(cat(u64(1), u32(12), str("a\x00")), uint32(48), true)
	f.Fuzz(func(t *testing.T, payload []byte, minor uint32, askedUUID bool) {
		buf := fuzzReply(payload, minor, 0)
		devs, err := decodeNameList(buf, decodeHeader(buf), askedUUID)
		if err != nil {
			return
		}
		// Every record takes at least 13 bytes (header and NUL).
		if len(devs) > len(payload)/13+1 {
			t.Fatalf("%d devices from %d bytes", len(devs), len(payload))
		}
	})
}

func FuzzDecodeTargets(f *testing.F) {
	f.Add(goldenThinPoolStatusReply()[312:], uint32(1))
	f.Add(goldenTwoTargetStatusReply()[312:], uint32(2))
	f.Add([]byte{}, uint32(3))
	f.Fuzz(func(t *testing.T, payload []byte, count uint32) {
		buf := fuzzReply(payload, 48, count)
		targets, err := decodeTargets(buf, decodeHeader(buf))
		if err != nil {
			return
		}
		if uint32(len(targets)) != count {
			t.Fatalf("%d targets for target_count %d", len(targets), count)
		}
		for _, tg := range targets { // through the status parsers of the model
			_ = deviceStates([]DeviceStatus{{Targets: []Target{tg}}}, nil)
		}
	})
}

// FuzzDecodeHeader feeds arbitrary header bytes through the reply path:
// sizes and offsets in a header are untrusted input too.
func FuzzDecodeHeader(f *testing.F) {
	f.Add(goldenThinPoolStatusReply())
	f.Add(goldenListReplyNew())
	f.Fuzz(func(t *testing.T, reply []byte) {
		if len(reply) < 312 {
			return
		}
		h := decodeHeader(reply)
		if int(h.dataSize) > len(reply) {
			return // roundTrip rejects these before decoding
		}
		_, _ = decodeNameList(reply, h, true)
		_, _ = decodeTargets(reply, h)
		_ = infoFromHeader(h)
	})
}

// FuzzRedactKeys: redaction never panics, keeps the length, only ever
// writes '0's, and leaves no byte of a crypt key that is not a keyring
// reference.
func FuzzRedactKeys(f *testing.F) {
	for _, s := range []string{
		"aes-xts-plain64 0f0f0f0f 0 7:0 0", "aes-xts-plain64 :64:logon:cryptsetup:x 0 7:0 0", "a", " ", "  x", "",
		"7:0 0 32 J 3 internal_hash:hmac(sha256):0f journal_crypt:ctr(aes):0f journal_mac:x:",
	} {
		f.Add("crypt", s)
		f.Add("integrity", s)
	}
	f.Fuzz(func(t *testing.T, typ, params string) {
		p := []byte(params)
		redactKeys(typ, p)
		if len(p) != len(params) {
			t.Fatalf("length %d from %d", len(p), len(params))
		}
		for i := range p {
			if p[i] != params[i] && p[i] != '0' {
				t.Fatalf("byte %d: %q became %q", i, params[i], p[i])
			}
		}
		if typ != "crypt" {
			return
		}
		if _, key, ok := strings.Cut(params, " "); ok && !strings.HasPrefix(key, ":") {
			key, _, _ = strings.Cut(key, " ")
			if _, got, _ := strings.Cut(string(p), " "); !strings.HasPrefix(got, strings.Repeat("0", len(key))) {
				t.Fatalf("key of %q left in %q", params, p)
			}
		}
	})
}

// FuzzEncodeTargets: every table validateTargets accepts encodes into a
// buffer the kernel's walk (kernelReadTable) reads back unchanged.
func FuzzEncodeTargets(f *testing.F) {
	f.Add("linear", "8:16 2048", uint64(8192), "striped", "2 128 8:32 0 8:48 0", uint64(16384))
	f.Add("crypt", cryptParams(strings.Repeat("ab", 64)), uint64(1), "zero", "", uint64(1))
	f.Add("0123456789abcde", "1234567", uint64(1), "x", "12345678", uint64(1))
	f.Fuzz(func(t *testing.T, typeA, paramsA string, lenA uint64, typeB, paramsB string, lenB uint64) {
		targets := []Target{
			{Length: lenA, Type: typeA, Params: paramsA},
			{Start: lenA, Length: lenB, Type: typeB, Params: paramsB},
		}
		if validateTargets("dev", targets) != nil {
			return
		}
		got, err := kernelReadTable(encodeLoad(targets))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, targets) {
			t.Fatalf("read back %v", got)
		}
	})
}
