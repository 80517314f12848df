package lvmmeta

import (
	"fmt"
	"math"
	"strconv"
	"strings"
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

// Field is one assignment of a section.
type Field struct {
	Name string
	Value
}

// Section is a `name { ... }` block, its assignments in the text's order.
type Section struct {
	Name     string
	Fields   []Field
	Sections []*Section
}

// Value returns the value assigned to key. The lookup is linear: a VG
// text's sections hold a handful of assignments, and the parser refuses
// a key assigned twice.
func (s *Section) Value(key string) (Value, bool) {
	for i := range s.Fields {
		if s.Fields[i].Name == key {
			return s.Fields[i].Value, true
		}
	}
	return Value{}, false
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
	v, ok := s.Value(key)
	return v.Str, ok && v.Kind == KindString
}

// Int returns an integer value and whether it exists with that type.
func (s *Section) Int(key string) (int64, bool) {
	v, ok := s.Value(key)
	return v.Int, ok && v.Kind == KindInt
}

// Strings returns a list of strings; a missing key is an empty list, and a
// list with anything else in it is not ok.
func (s *Section) Strings(key string) ([]string, bool) {
	v, ok := s.Value(key)
	if !ok {
		return nil, true
	}
	return v.strings(nil)
}

// strings is v's list of strings, taken from sl when one is given.
func (v *Value) strings(sl *slab[string]) ([]string, bool) {
	if v.Kind != KindList {
		return nil, false
	}
	if len(v.List) == 0 {
		return nil, true
	}
	var out []string
	if sl != nil {
		out = sl.take(len(v.List))
	} else {
		out = make([]string, len(v.List))
	}
	for i, e := range v.List {
		if e.Kind != KindString {
			return nil, false
		}
		out[i] = e.Str
	}
	return out, true
}

// ParseText parses LVM's config syntax (the format of the VG text and of
// lvm.conf): assignments `key = value` and sections `name { ... }`, values
// being "strings" with backslash escapes, integers, floats and [lists] of
// those; `#` starts a comment. It returns the top level as a Section with
// an empty name. Hand-written because no kept Go library reads this syntax.
//
// The text is copied once into a string, and every name and unescaped
// string of the result is a slice of it; sections, fields and list
// elements come from slabs. So a parse costs a few allocations per hundred
// items instead of several per item (one VG text repeats the same dozen
// keys for each of its LVs), and the result keeps the text's memory.
func ParseText(b []byte, lim Limits) (*Section, error) {
	return parse(string(b), lim, nil)
}

// itemSink takes sections out of the tree as they close: those at depth 3
// (root > a > list > here) under a list it names. Their memory is reused
// for the next one, so that a VG text's thousand LVs cost the memory of
// one while being parsed.
type itemSink interface {
	takes(list string) bool
	item(list string, s *Section) error
}

func parse(text string, lim Limits, sink itemSink) (*Section, error) {
	if uint64(len(text)) > lim.MaxText {
		return nil, fmt.Errorf("%w: text of %d bytes (limit %d)", ErrTooLarge, len(text), lim.MaxText)
	}
	p := &parser{s: text, lim: lim, sink: sink}
	p.cur = &p.kept
	root := &Section{}
	if err := p.body(root, 0); err != nil {
		return nil, err
	}
	return root, nil
}

type parser struct {
	s     string
	pos   int
	items int
	lim   Limits
	// fields and subs are stacks of the open sections' assignments and
	// children; a section's are copied out of them when it closes. list
	// collects the elements of the list being read.
	fields []Field
	subs   []*Section
	list   []Value
	// The slabs the results are copied into: kept for the tree, item for
	// the section the sink takes next; cur is the one in use.
	kept, item slabs
	cur        *slabs
	sink       itemSink
}

type slabs struct {
	fields   slab[Field]
	subs     slab[*Section]
	sections slab[Section]
	values   slab[Value]
}

func (s *slabs) reset() {
	s.fields.reset()
	s.subs.reset()
	s.sections.reset()
	s.values.reset()
}

// dupScan is the number of assignments in a section up to which a key is
// checked for a duplicate by scanning them; a bigger section uses a map.
const dupScan = 16

func (p *parser) errorf(format string, args ...any) error {
	return corrupt("metadata text", "at byte %d: %s", p.pos, fmt.Sprintf(format, args...))
}

// The scanner looks each byte up in byteClass, and finds the end of a
// comment or string with strings.IndexByte (vectorised), instead of
// comparing byte by byte: under emulation (the TCG guest) the parse costs
// what its instructions do.
var byteClass = func() (t [256]uint8) {
	for _, c := range []byte(" \t\n\r\x00") {
		t[c] = classSpace
	}
	for c := range 256 {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '_' || c == '.' || c == '+' || c == '-' {
			t[c] = classIdent
		}
	}
	return t
}()

const (
	classSpace = 1 + iota
	classIdent
)

// skip passes whitespace, comments and the NUL bytes lvm pads the text with.
// Its loops, like ident's and number's, keep the position in a local: the
// compiler then holds it in a register instead of storing p.pos per byte.
func (p *parser) skip() {
	s, i := p.s, p.pos
	for i < len(s) {
		c := s[i]
		if byteClass[c] == classSpace {
			i++
			continue
		}
		if c != '#' {
			break
		}
		n := strings.IndexByte(s[i:], '\n')
		if n < 0 {
			i = len(s)
			break
		}
		i += n
	}
	p.pos = i
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
	fbase, sbase := len(p.fields), len(p.subs)
	var seen map[string]bool // past dupScan assignments
	for {
		p.skip()
		if p.pos == len(p.s) {
			if depth > 0 {
				return p.errorf("section %q is not closed", s.Name)
			}
			break
		}
		if p.s[p.pos] == '}' {
			if depth == 0 {
				return p.errorf("unexpected '}'")
			}
			p.pos++
			break
		}
		name, err := p.ident()
		if err != nil {
			return err
		}
		if err := p.count(); err != nil {
			return err
		}
		p.skip()
		if p.pos == len(p.s) {
			return p.errorf("%q has neither '=' nor '{' after it", name)
		}
		switch p.s[p.pos] {
		case '{':
			if depth+1 > p.lim.MaxDepth {
				return fmt.Errorf("%w: sections nested deeper than %d", ErrTooLarge, p.lim.MaxDepth)
			}
			p.pos++
			taken := depth == 2 && p.sink != nil && p.sink.takes(s.Name)
			if taken {
				p.cur = &p.item
			}
			c := &p.cur.sections.take(1)[0]
			c.Name = name
			if err := p.body(c, depth+1); err != nil {
				return err
			}
			if !taken {
				p.subs = append(p.subs, c)
				break
			}
			if err := p.sink.item(s.Name, c); err != nil {
				return err
			}
			p.item.reset()
			p.cur = &p.kept
		case '=':
			p.pos++
			v, err := p.value(true)
			if err != nil {
				return err
			}
			if p.assigned(p.fields[fbase:], &seen, name) {
				return p.errorf("%q assigned twice", name)
			}
			p.fields = append(p.fields, Field{Name: name, Value: v})
		default:
			return p.errorf("%q is followed by %q, not '=' or '{'", name, p.s[p.pos])
		}
	}
	s.Fields = p.cur.fields.copyOf(p.fields[fbase:])
	s.Sections = p.cur.subs.copyOf(p.subs[sbase:])
	p.fields, p.subs = p.fields[:fbase], p.subs[:sbase]
	return nil
}

// assigned says whether name is among a section's assignments fs so far,
// and remembers it in *seen once there are more than dupScan of them.
func (p *parser) assigned(fs []Field, seen *map[string]bool, name string) bool {
	if len(fs) < dupScan {
		for i := range fs {
			if fs[i].Name == name {
				return true
			}
		}
		return false
	}
	if *seen == nil {
		*seen = make(map[string]bool, 2*dupScan)
		for i := range fs {
			(*seen)[fs[i].Name] = true
		}
	}
	if (*seen)[name] {
		return true
	}
	(*seen)[name] = true
	return false
}

func (p *parser) ident() (string, error) {
	s, start := p.s, p.pos
	i := start
	for i < len(s) && byteClass[s[i]] == classIdent {
		i++
	}
	p.pos = i
	if i == start {
		return "", p.errorf("expected a name, found %q", p.s[p.pos])
	}
	return p.s[start:p.pos], nil
}

// value reads a string, number or (when list is allowed) a list.
func (p *parser) value(list bool) (Value, error) {
	p.skip()
	if p.pos == len(p.s) {
		return Value{}, p.errorf("missing value")
	}
	switch c := p.s[p.pos]; {
	case c == '"':
		s, err := p.str()
		return Value{Kind: KindString, Str: s}, err
	case c == '[' && list:
		return p.readList()
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	default:
		return Value{}, p.errorf("unexpected %q in a value", c)
	}
}

// readList reads a list; lists do not nest, so one scratch slice serves.
func (p *parser) readList() (Value, error) {
	p.pos++ // '['
	p.list = p.list[:0]
	for {
		p.skip()
		if p.pos < len(p.s) && p.s[p.pos] == ']' {
			p.pos++
			return Value{Kind: KindList, List: p.cur.values.copyOf(p.list)}, nil
		}
		if len(p.list) > 0 {
			if p.pos == len(p.s) || p.s[p.pos] != ',' {
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
		p.list = append(p.list, e)
	}
}

// str reads a quoted string; lvm escapes '"' and '\' with a backslash.
func (p *parser) str() (string, error) {
	p.pos++ // '"'
	if end := strings.IndexByte(p.s[p.pos:], '"'); end >= 0 {
		if raw := p.s[p.pos : p.pos+end]; strings.IndexByte(raw, '\\') < 0 {
			p.pos += end + 1
			return raw, nil
		}
	}
	// Escapes (the quote found may be one), or not closed.
	start, escaped := p.pos, false
	for ; p.pos < len(p.s); p.pos++ {
		switch p.s[p.pos] {
		case '\\':
			escaped = true
			p.pos++
		case '"':
			raw := p.s[start:p.pos]
			p.pos++
			if !escaped {
				return raw, nil
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
	s, start := p.s, p.pos
	i := start
	neg := s[i] == '-'
	if neg {
		i++
	}
	// The integer is accumulated while scanning (strconv.ParseInt, for
	// all its generality, cost as much as the rest of a number's parse);
	// limit is the magnitude int64 holds.
	limit := uint64(math.MaxInt64)
	if neg {
		limit++
	}
	var u uint64
	float, overflow := false, false
	digits := i
	for ; i < len(s); i++ {
		c := s[i]
		if c == '.' {
			float = true
			continue
		}
		if c < '0' || c > '9' {
			break
		}
		d := uint64(c - '0')
		if u > (limit-d)/10 {
			overflow = true
		}
		u = u*10 + d
	}
	p.pos = i
	lit := s[start:i]
	if float {
		if _, err := strconv.ParseFloat(lit, 64); err != nil {
			return Value{}, p.errorf("bad number %q", lit)
		}
		return Value{Kind: KindFloat, Str: lit}, nil
	}
	if i == digits || overflow {
		return Value{}, p.errorf("bad number %q", lit)
	}
	n := int64(u)
	if neg {
		n = -n // for u = 2^63, int64(u) is already math.MinInt64
	}
	return Value{Kind: KindInt, Int: n}, nil
}

// slab hands out slices of chunks, so that many small slices cost one
// allocation per chunk. Chunks grow from slabMin to slabMax elements, so a
// small text stays small; a request bigger than a quarter of slabMax gets
// its own allocation. Each slice is capped at its length: an append to it
// reallocates instead of writing into its neighbour.
type slab[T any] struct {
	free, chunk []T
	next        int
}

const slabMin, slabMax = 16, 1024

// take returns n zero elements.
func (sl *slab[T]) take(n int) []T {
	if n > len(sl.free) {
		if n > slabMax/4 {
			return make([]T, n)
		}
		sl.next = min(max(2*sl.next, slabMin), slabMax)
		sl.chunk = make([]T, max(sl.next, n))
		sl.free = sl.chunk
	}
	out := sl.free[:n:n]
	sl.free = sl.free[n:]
	return out
}

// reset makes the last chunk's memory free again, zeroed: nothing taken
// from it may be in use.
func (sl *slab[T]) reset() {
	clear(sl.chunk[:len(sl.chunk)-len(sl.free)])
	sl.free = sl.chunk
}

// copyOf returns a copy of src (nil for none).
func (sl *slab[T]) copyOf(src []T) []T {
	if len(src) == 0 {
		return nil
	}
	out := sl.take(len(src))
	copy(out, src)
	return out
}
