package devmapper

import (
	"bytes"
	"fmt"
)

// redactKeys overwrites, in place, the keys a target prints in its table
// line, with '0's of the same length: what `dmsetup table` shows unless
// asked for --showkeys, so the two stay comparable.
//
//   - crypt: "<cipher> <key> <iv_offset> <device> <offset> [<#opt> <opt>...]";
//     the key is the second word, in hex. A key in the kernel keyring
//     appears as ":<size>:<type>:<description>": a reference, not the key,
//     and it stays.
//   - integrity: the words "internal_hash:<alg>:<key>",
//     "journal_crypt:<alg>:<key>" and "journal_mac:<alg>:<key>"; the key is
//     optional and everything after the second colon is zeroed.
//
// Status lines (STATUSTYPE_INFO) of these targets carry no keys and have
// none of these shapes that matter: crypt's is empty.
func redactKeys(typ string, params []byte) {
	switch typ {
	case "crypt":
		_, key, ok := bytes.Cut(params, []byte{' '})
		if ok && len(key) > 0 && key[0] != ':' {
			zeroWord(key)
		}
	case "integrity":
		for w := params; len(w) > 0; {
			word, rest, _ := bytes.Cut(w, []byte{' '})
			for _, opt := range integrityKeyOptions {
				if alg, ok := bytes.CutPrefix(word, opt); ok {
					if i := bytes.IndexByte(alg, ':'); i >= 0 {
						zeroWord(alg[i+1:])
					}
				}
			}
			w = rest
		}
	}
}

var integrityKeyOptions = [][]byte{[]byte("internal_hash:"), []byte("journal_crypt:"), []byte("journal_mac:")}

// zeroWord overwrites b up to its first space with '0'.
func zeroWord(b []byte) {
	for i := 0; i < len(b) && b[i] != ' '; i++ {
		b[i] = '0'
	}
}

// String shows a target the way a table line starts, with the size of its
// params in place of the params, which may hold a key.
func (t Target) String() string {
	return fmt.Sprintf("%d %d %s <%d bytes of params>", t.Start, t.Length, t.Type, len(t.Params))
}

// GoString is String for %#v, which would otherwise print Params.
func (t Target) GoString() string {
	return fmt.Sprintf("devmapper.Target{Start:%d, Length:%d, Type:%q, Params:<%d bytes>}", t.Start, t.Length, t.Type, len(t.Params))
}
