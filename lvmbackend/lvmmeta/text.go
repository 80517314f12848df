package lvmmeta

import (
	"fmt"
	"strconv"
)

// Limits bound what the reader accepts from a disk, whose metadata may have
// been written by anyone with access to the device.
type Limits struct {
	// MaxText is the largest committed text read (bytes). lvm's own
	// metadata for a thousand LVs is well under 1 MiB.
	MaxText uint64
	// MaxDepth is the deepest section nesting (the VG text uses 5).
	MaxDepth int
	// MaxItems bounds the values, sections and list elements of one text.
	MaxItems int
	// MaxPVs bounds the physical volumes scanned.
	MaxPVs int
}

// DefaultLimits are generous for real metadata and small for a host.
var DefaultLimits = Limits{MaxText: 16 << 20, MaxDepth: 16, MaxItems: 1 << 20, MaxPVs: 1024}

// Kind is the type of a Value.
type Kind uint8

// The kinds of values in LVM's config syntax.
const (
	KindString Kind = iota + 1
	KindInt
	KindFloat
	KindList
)

// Value is the right-hand side of an assignment.
type Value struct {
	Kind Kind
	Str  string // KindString; for KindFloat the literal
	Int  int64
	List []Value
}

// Section is a `name { ... }` block.
type Section struct {
	Name     string
	Values   map[string]Value
	Sections []*Section
}

// Section returns the child section called name, or nil.
func (s *Section) Section(name string) *Section {
	for _, c := range s.Sections {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// String returns a string value and whether it exists with that type.
func (s *Section) String(key string) (string, bool) {
	v, ok := s.Values[key]
	return v.Str, ok && v.Kind == KindString
}

// Int returns an integer value and whether it exists with that type.
func (s *Section) Int(key string) (int64, bool) {
	v, ok := s.Values[key]
	return v.Int, ok && v.Kind == KindInt
}

// Strings returns a list of strings; a missing key is an empty list, and a
// list with anything else in it is not ok.
func (s *Section) Strings(key string) ([]string, bool) {
	v, ok := s.Values[key]
	if !ok {
		return nil, true
	}
	if v.Kind != KindList {
		return nil, false
	}
	out := make([]string, 0, len(v.List))
	for _, e := range v.List {
		if e.Kind != KindString {
			return nil, false
		}
		out = append(out, e.Str)
	}
	return out, true
}

// ParseText parses LVM's config syntax (the format of the VG text and of
// lvm.conf): assignments `key = value` and sections `name { ... }`, values
// being "strings" with backslash escapes, integers, floats and [lists] of
// those; `#` starts a comment. It returns the top level as a Section with
// an empty name. Hand-written because no kept Go library reads this syntax.
func ParseText(b []byte, lim Limits) (*Section, error) {
	if uint64(len(b)) > lim.MaxText {
		return nil, fmt.Errorf("%w: text of %d bytes (limit %d)", ErrTooLarge, len(b), lim.MaxText)
	}
	p := &parser{b: b, lim: lim, intern: map[string]string{}}
	root := &Section{Values: map[string]Value{}}
	if err := p.body(root, 0); err != nil {
		return nil, err
	}
	return root, nil
}

type parser struct {
	b     []byte
	pos   int
	items int
	lim   Limits
	// intern holds one copy of each name and short string: a VG text
	// repeats the same keys and values ("status", "READ", "striped") for
	// every LV, and one allocation each is what parsing mostly costs.
	intern map[string]string
}

// internMax bounds what is interned: long strings (tags, uuids,
// descriptions) are mostly unique.
const internMax = 24

func (p *parser) string(b []byte) string {
	if len(b) > internMax {
		return string(b)
	}
	if s, ok := p.intern[string(b)]; ok { // no allocation for the lookup
		return s
	}
	s := string(b)
	p.intern[s] = s
	return s
}

func (p *parser) errorf(format string, args ...any) error {
	return corrupt("metadata text", "at byte %d: %s", p.pos, fmt.Sprintf(format, args...))
}

// skip passes whitespace, comments and the NUL bytes lvm pads the text with.
func (p *parser) skip() {
	for p.pos < len(p.b) {
		switch c := p.b[p.pos]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == 0:
			p.pos++
		case c == '#':
			for p.pos < len(p.b) && p.b[p.pos] != '\n' {
				p.pos++
			}
		default:
			return
		}
	}
}

func (p *parser) count() error {
	p.items++
	if p.items > p.lim.MaxItems {
		return fmt.Errorf("%w: more than %d items", ErrTooLarge, p.lim.MaxItems)
	}
	return nil
}

// body reads items until '}' (depth > 0) or the end of the text (depth 0).
func (p *parser) body(s *Section, depth int) error {
	for {
		p.skip()
		if p.pos == len(p.b) {
			if depth > 0 {
				return p.errorf("section %q is not closed", s.Name)
			}
			return nil
		}
		if p.b[p.pos] == '}' {
			if depth == 0 {
				return p.errorf("unexpected '}'")
			}
			p.pos++
			return nil
		}
		name, err := p.ident()
		if err != nil {
			return err
		}
		if err := p.count(); err != nil {
			return err
		}
		p.skip()
		if p.pos == len(p.b) {
			return p.errorf("%q has neither '=' nor '{' after it", name)
		}
		switch p.b[p.pos] {
		case '{':
			if depth+1 > p.lim.MaxDepth {
				return fmt.Errorf("%w: sections nested deeper than %d", ErrTooLarge, p.lim.MaxDepth)
			}
			p.pos++
			c := &Section{Name: name, Values: map[string]Value{}}
			if err := p.body(c, depth+1); err != nil {
				return err
			}
			s.Sections = append(s.Sections, c)
		case '=':
			p.pos++
			v, err := p.value(true)
			if err != nil {
				return err
			}
			if _, dup := s.Values[name]; dup {
				return p.errorf("%q assigned twice", name)
			}
			s.Values[name] = v
		default:
			return p.errorf("%q is followed by %q, not '=' or '{'", name, p.b[p.pos])
		}
	}
}

func identChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '_' || c == '.' || c == '+' || c == '-'
}

func (p *parser) ident() (string, error) {
	start := p.pos
	for p.pos < len(p.b) && identChar(p.b[p.pos]) {
		p.pos++
	}
	if p.pos == start {
		return "", p.errorf("expected a name, found %q", p.b[p.pos])
	}
	return p.string(p.b[start:p.pos]), nil
}

// value reads a string, number or (when list is allowed) a list.
func (p *parser) value(list bool) (Value, error) {
	p.skip()
	if p.pos == len(p.b) {
		return Value{}, p.errorf("missing value")
	}
	switch c := p.b[p.pos]; {
	case c == '"':
		s, err := p.str()
		return Value{Kind: KindString, Str: s}, err
	case c == '[' && list:
		return p.list()
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	default:
		return Value{}, p.errorf("unexpected %q in a value", c)
	}
}

func (p *parser) list() (Value, error) {
	p.pos++ // '['
	v := Value{Kind: KindList}
	for {
		p.skip()
		if p.pos < len(p.b) && p.b[p.pos] == ']' {
			p.pos++
			return v, nil
		}
		if len(v.List) > 0 {
			if p.pos == len(p.b) || p.b[p.pos] != ',' {
				return Value{}, p.errorf("expected ',' or ']' in a list")
			}
			p.pos++
		}
		if err := p.count(); err != nil {
			return Value{}, err
		}
		e, err := p.value(false)
		if err != nil {
			return Value{}, err
		}
		v.List = append(v.List, e)
	}
}

// str reads a quoted string; lvm escapes '"' and '\' with a backslash.
func (p *parser) str() (string, error) {
	p.pos++ // '"'
	start, escaped := p.pos, false
	for ; p.pos < len(p.b); p.pos++ {
		switch p.b[p.pos] {
		case '\\':
			escaped = true
			p.pos++
		case '"':
			raw := p.b[start:p.pos]
			p.pos++
			if !escaped {
				return p.string(raw), nil
			}
			out := make([]byte, 0, len(raw))
			for i := 0; i < len(raw); i++ {
				if raw[i] == '\\' && i+1 < len(raw) {
					i++
				}
				out = append(out, raw[i])
			}
			return string(out), nil
		}
	}
	return "", p.errorf("string is not closed")
}

func (p *parser) number() (Value, error) {
	start := p.pos
	if p.b[p.pos] == '-' {
		p.pos++
	}
	float := false
	for p.pos < len(p.b) {
		c := p.b[p.pos]
		if c == '.' {
			float = true
		} else if c < '0' || c > '9' {
			break
		}
		p.pos++
	}
	lit := string(p.b[start:p.pos])
	if float {
		if _, err := strconv.ParseFloat(lit, 64); err != nil {
			return Value{}, p.errorf("bad number %q", lit)
		}
		return Value{Kind: KindFloat, Str: lit}, nil
	}
	n, err := strconv.ParseInt(lit, 10, 64)
	if err != nil {
		return Value{}, p.errorf("bad number %q", lit)
	}
	return Value{Kind: KindInt, Int: n}, nil
}
