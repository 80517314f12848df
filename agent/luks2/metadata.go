package luks2

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
)

// The JSON area's objects, as the specification names them. Numbers the
// specification writes as strings (offsets, sizes) use ",string".
type metadata struct {
	Keyslots map[string]keyslot         `json:"keyslots"`
	Tokens   map[string]json.RawMessage `json:"tokens"`
	Segments map[string]segment         `json:"segments"`
	Digests  map[string]digest          `json:"digests"`
	Config   config                     `json:"config"`
}

type keyslot struct {
	Type    string `json:"type"`
	KeySize int    `json:"key_size"`
	AF      struct {
		Type    string `json:"type"`
		Stripes int    `json:"stripes"`
		Hash    string `json:"hash"`
	} `json:"af"`
	Area struct {
		Type       string `json:"type"`
		Offset     uint64 `json:"offset,string"`
		Size       uint64 `json:"size,string"`
		Encryption string `json:"encryption"`
		KeySize    int    `json:"key_size"`
	} `json:"area"`
	KDF      kdf  `json:"kdf"`
	Priority *int `json:"priority,omitempty"`
}

// kdf: pbkdf2 has hash and iterations, argon2i/argon2id time, memory (KiB)
// and cpus; cryptsetup refuses a kdf object with the other kind's members,
// hence omitempty.
type kdf struct {
	Type       string `json:"type"`
	Hash       string `json:"hash,omitempty"`
	Iterations int    `json:"iterations,omitempty"`
	Time       int    `json:"time,omitempty"`
	Memory     int    `json:"memory,omitempty"`
	CPUs       int    `json:"cpus,omitempty"`
	Salt       []byte `json:"salt"`
}

type segment struct {
	Type       string          `json:"type"`
	Offset     uint64          `json:"offset,string"`
	Size       string          `json:"size"` // bytes, or "dynamic"
	IVTweak    string          `json:"iv_tweak"`
	Encryption string          `json:"encryption"`
	SectorSize int             `json:"sector_size"`
	Integrity  json.RawMessage `json:"integrity,omitempty"`
	Flags      []string        `json:"flags,omitempty"`
}

type digest struct {
	Type       string   `json:"type"`
	Keyslots   []string `json:"keyslots"`
	Segments   []string `json:"segments"`
	Hash       string   `json:"hash"`
	Iterations int      `json:"iterations"`
	Salt       []byte   `json:"salt"`
	Digest     []byte   `json:"digest"`
}

type config struct {
	JSONSize     uint64   `json:"json_size,string"`
	KeyslotsSize uint64   `json:"keyslots_size,string"`
	Flags        []string `json:"flags,omitempty"`
	Requirements *struct {
		Mandatory []string `json:"mandatory"`
	} `json:"requirements,omitempty"`
}

// parseJSON checks and decodes a JSON area (hdrSize - 4096 bytes): an
// object from its first byte, then only NULs (and at least one), then the
// structure: sizes, ids, areas inside the keyslots area and apart, segments
// after it, digests naming what exists. Anything else is ErrCorrupt.
func parseJSON(area []byte, hdrSize int64) (*metadata, error) {
	end := bytes.IndexByte(area, 0)
	if len(area) == 0 || area[0] != '{' || end < 0 || int64(len(area)) > hdrSize-binSize {
		return nil, fmt.Errorf("%w: JSON area not an object followed by NULs", ErrCorrupt)
	}
	for _, c := range area[end:] {
		if c != 0 {
			return nil, fmt.Errorf("%w: bytes after the JSON", ErrCorrupt)
		}
	}
	m := &metadata{}
	if err := json.Unmarshal(area[:end], m); err != nil {
		return nil, fmt.Errorf("%w: JSON: %v", ErrCorrupt, err)
	}
	if err := m.validate(hdrSize); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return m, nil
}

func validID(id string) bool {
	n, err := strconv.Atoi(id)
	return err == nil && n >= 0 && n < 32 && strconv.Itoa(n) == id
}

func (m *metadata) validate(hdrSize int64) error {
	c := m.Config
	if m.Keyslots == nil || m.Segments == nil || m.Digests == nil || m.Tokens == nil {
		return fmt.Errorf("missing keyslots, segments, digests or tokens")
	}
	if c.JSONSize != uint64(hdrSize-binSize) {
		return fmt.Errorf("json_size %d in a %d-byte header", c.JSONSize, hdrSize)
	}
	if c.KeyslotsSize%4096 != 0 || c.KeyslotsSize > 128<<20 {
		return fmt.Errorf("keyslots_size %d", c.KeyslotsSize)
	}
	if len(m.Keyslots) > 32 || len(m.Segments) > 32 || len(m.Digests) > 8 || len(m.Tokens) > 32 {
		return fmt.Errorf("too many objects")
	}
	lo, hi := uint64(2*hdrSize), uint64(2*hdrSize)+c.KeyslotsSize
	for id, k := range m.Keyslots {
		a := k.Area
		if k.Type == "" || a.Type == "" || k.KDF.Type == "" || k.AF.Type == "" {
			return fmt.Errorf("keyslot %q without a type", id)
		}
		if !validID(id) || a.Size == 0 || a.Offset < lo || a.Size > hi || a.Offset > hi-a.Size {
			return fmt.Errorf("keyslot %q area [%d, +%d) outside [%d, %d)", id, a.Offset, a.Size, lo, hi)
		}
		for id2, k2 := range m.Keyslots {
			if id2 != id && a.Offset < k2.Area.Offset+k2.Area.Size && k2.Area.Offset < a.Offset+a.Size {
				return fmt.Errorf("keyslots %s and %s overlap", id, id2)
			}
		}
	}
	if len(m.Segments) == 0 {
		return fmt.Errorf("no segment")
	}
	for id, s := range m.Segments {
		if s.Type == "" {
			return fmt.Errorf("segment %q without a type", id)
		}
		if !validID(id) || s.Offset%512 != 0 || s.Offset > 1<<62 || (s.Offset != 0 && s.Offset < hi) {
			return fmt.Errorf("segment %q offset %d (keyslots end at %d)", id, s.Offset, hi)
		}
		if s.Size != "dynamic" {
			n, err := strconv.ParseUint(s.Size, 10, 62)
			if err != nil || n%512 != 0 {
				return fmt.Errorf("segment %q size %q", id, s.Size)
			}
		}
	}
	for id, d := range m.Digests {
		if !validID(id) || d.Type == "" {
			return fmt.Errorf("digest id %q", id)
		}
		for _, k := range d.Keyslots {
			if _, ok := m.Keyslots[k]; !ok {
				return fmt.Errorf("digest %s names keyslot %q", id, k)
			}
		}
		for _, s := range d.Segments {
			if _, ok := m.Segments[s]; !ok {
				return fmt.Errorf("digest %s names segment %q", id, s)
			}
		}
	}
	return nil
}

// end is where the header's areas end: both copies, the keyslots area and
// the first segment's offset; the device must be at least that large.
func (m *metadata) end(hdrSize int64) int64 {
	end := 2*hdrSize + int64(m.Config.KeyslotsSize)
	for _, s := range m.Segments {
		if int64(s.Offset) > end {
			end = int64(s.Offset)
		}
	}
	return end
}

// keyslotIDs returns the keyslot ids in numeric order.
func (m *metadata) keyslotIDs() []int {
	ids := make([]int, 0, len(m.Keyslots))
	for id := range m.Keyslots {
		n, _ := strconv.Atoi(id) // validated
		ids = append(ids, n)
	}
	sort.Ints(ids)
	return ids
}

// digestFor returns the digest that covers keyslot id and segment "0".
func (m *metadata) digestFor(id string) (string, *digest) {
	for did, d := range m.Digests {
		d := d
		if slices.Contains(d.Keyslots, id) && slices.Contains(d.Segments, "0") {
			return did, &d
		}
	}
	return "", nil
}
