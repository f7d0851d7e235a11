package rewrite

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"strings"

	"github.com/valyala/fastjson"
)

// The scanner validates a whole body as JSON (RFC 8259, as strict as
// fastjson.ValidateBytes) and, in the same pass, records where each top-level member
// of an object starts and ends. One pass over the bytes is the floor for a proxy that
// must look at the body; nothing below the top level is ever parsed into values.

// maxDepth bounds nesting as lua-cjson does (it refuses 1001 levels); it also keeps a
// hostile body from costing more than a small stack.
const maxDepth = 1000

var (
	errNotObject = errors.New("body is JSON but not an object")
	errTooDeep   = errors.New("nesting deeper than 1000 levels")
)

type syntaxError struct {
	offset int
	what   string
}

func (e *syntaxError) Error() string {
	return fmt.Sprintf("invalid JSON at offset %d: %s", e.offset, e.what)
}

// validValue validates b as one JSON value nested at the given depth.
func validValue(b []byte, depth int) bool {
	s := scanner{b: b, depth: depth}
	return s.run() == nil
}

// scanObject validates body and returns its top-level members. A valid body that is not
// an object returns errNotObject; the error never quotes the body.
func scanObject(body []byte, members []member) (object, error) {
	s := scanner{b: body, obj: object{members: members[:0]}}
	if err := s.run(); err != nil {
		return object{}, err
	}
	if !s.isObject {
		return object{}, errNotObject
	}
	return s.obj, nil
}

type scanner struct {
	b        []byte
	stack    []byte // open containers: '{' or '['
	isObject bool
	obj      object
	cur      member // the top-level member being read
	depth    int    // levels already open around b (a member's value: 1)
}

func (s *scanner) fail(i int, what string) error { return &syntaxError{offset: i, what: what} }

func (s *scanner) run() error {
	var stackBuf [64]byte
	s.stack = stackBuf[:0]
	b := s.b
	i := skipWS(b, 0)
	if i >= len(b) {
		return s.fail(i, "empty body")
	}
	s.isObject = b[i] == '{'
	for {
		// A value starts at i.
		if i >= len(b) {
			return s.fail(i, "missing value")
		}
		switch c := b[i]; {
		case c == '{' || c == '[':
			if s.depth+len(s.stack) >= maxDepth {
				return errTooDeep
			}
			s.stack = append(s.stack, c)
			i = skipWS(b, i+1)
			if i < len(b) && (b[i] == '}' && c == '{' || b[i] == ']' && c == '[') {
				s.stack = s.stack[:len(s.stack)-1]
				if len(s.stack) == 0 && s.isObject {
					s.obj.close = i
				}
				i++
				break
			}
			if c == '{' {
				var err error
				if i, err = s.key(i); err != nil {
					return err
				}
			}
			continue
		case c == '"':
			end, err := scanString(b, i+1)
			if err != nil {
				return err
			}
			i = end
		case c == 't':
			if !bytes.HasPrefix(b[i:], []byte("true")) {
				return s.fail(i, "unexpected value")
			}
			i += 4
		case c == 'f':
			if !bytes.HasPrefix(b[i:], []byte("false")) {
				return s.fail(i, "unexpected value")
			}
			i += 5
		case c == 'n':
			if !bytes.HasPrefix(b[i:], []byte("null")) {
				return s.fail(i, "unexpected value")
			}
			i += 4
		default:
			end, err := scanNumber(b, i)
			if err != nil {
				return err
			}
			i = end
		}
		// A value ended at i: close containers and find the next value.
		for {
			if len(s.stack) == 1 && s.isObject {
				s.cur.valueEnd = i
				s.obj.members = append(s.obj.members, s.cur)
			}
			i = skipWS(b, i)
			if len(s.stack) == 0 {
				if i != len(b) {
					return s.fail(i, "unexpected data after the value")
				}
				return nil
			}
			if i >= len(b) {
				return s.fail(i, "unexpected end")
			}
			top := s.stack[len(s.stack)-1]
			switch {
			case b[i] == ',':
				i = skipWS(b, i+1)
				if top == '{' {
					var err error
					if i, err = s.key(i); err != nil {
						return err
					}
				}
			case b[i] == '}' && top == '{', b[i] == ']' && top == '[':
				s.stack = s.stack[:len(s.stack)-1]
				if len(s.stack) == 0 && s.isObject {
					s.obj.close = i
				}
				i++
				if len(s.stack) == 0 {
					i = skipWS(b, i)
					if i != len(b) {
						return s.fail(i, "unexpected data after the value")
					}
					return nil
				}
				continue
			default:
				return s.fail(i, "expected ',' or the end of a container")
			}
			break
		}
	}
}

// key reads `"key" :` at i and returns where the value starts.
func (s *scanner) key(i int) (int, error) {
	b := s.b
	if i >= len(b) || b[i] != '"' {
		return 0, s.fail(i, "expected an object key")
	}
	end, err := scanString(b, i+1)
	if err != nil {
		return 0, err
	}
	if len(s.stack) == 1 && s.isObject {
		s.cur = member{key: b[i+1 : end-1], start: i}
	}
	i = skipWS(b, end)
	if i >= len(b) || b[i] != ':' {
		return 0, s.fail(i, "expected ':'")
	}
	i = skipWS(b, i+1)
	if len(s.stack) == 1 && s.isObject {
		s.cur.valueStart = i
	}
	return i, nil
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	return i
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// special marks, in the high bit of each byte, the bytes of x that a string scan must
// stop at: '"', '\\' and control characters. A mark can also fall on a byte above an
// earlier true match (a borrow), never below one, so the lowest mark is exact.
func special(x uint64) uint64 {
	q := x ^ (ones * '"')
	bs := x ^ (ones * '\\')
	return ((q-ones)&^q | (bs-ones)&^bs | (x-ones*0x20)&^x) & highs
}

// nextSpecial returns the offset of the first '"', '\\' or control character at or
// after i, or len(b): eight bytes at a time, which for the short strings of a
// configuration beats a vectorised search per string (its call costs more than the
// string).
func nextSpecial(b []byte, i int) int {
	for ; i+8 <= len(b); i += 8 {
		if m := special(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	for ; i < len(b); i++ {
		if c := b[i]; c == '"' || c == '\\' || c < 0x20 {
			return i
		}
	}
	return i
}

// scanString validates a string whose content starts at i and returns the offset just
// past its closing quote.
func scanString(b []byte, i int) (int, error) {
	for {
		k := nextSpecial(b, i)
		switch {
		case k >= len(b):
			return 0, &syntaxError{offset: i, what: "unterminated string"}
		case b[k] == '"':
			return k + 1, nil
		case b[k] < 0x20:
			return 0, &syntaxError{offset: k, what: "control character in string"}
		}
		// an escape at k: check it, then look on after it
		if k+1 >= len(b) {
			return 0, &syntaxError{offset: k, what: "unterminated escape"}
		}
		switch b[k+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i = k + 2
		case 'u':
			if k+6 > len(b) || !isHex4(b[k+2:k+6]) {
				return 0, &syntaxError{offset: k, what: "invalid \\u escape"}
			}
			i = k + 6
		default:
			return 0, &syntaxError{offset: k, what: "invalid escape"}
		}
	}
}

func isHex4(h []byte) bool {
	for _, c := range h {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// scanNumber validates -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? at i.
func scanNumber(b []byte, i int) (int, error) {
	start := i
	digits := func() int {
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	first := i
	n := digits()
	if n == 0 || (b[first] == '0' && n > 1) {
		return 0, &syntaxError{offset: start, what: "invalid number"}
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return 0, &syntaxError{offset: start, what: "invalid number"}
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return 0, &syntaxError{offset: start, what: "invalid number"}
		}
	}
	return i, nil
}

// keyName returns the member's key unescaped (the common case needs no copy).
func (m member) keyName() string {
	if bytes.IndexByte(m.key, '\\') < 0 {
		return string(m.key)
	}
	quoted := make([]byte, 0, len(m.key)+2)
	quoted = append(append(append(quoted, '"'), m.key...), '"')
	if s, ok := unquote(quoted); ok {
		return s
	}
	return string(m.key)
}

// unquote is a JSON string's value, escapes resolved as lua-cjson resolves them (bytes
// that are not UTF-8 kept as they are); false when quoted is not a JSON string.
func unquote(quoted []byte) (string, bool) {
	v, err := fastjson.ParseBytes(quoted)
	if err != nil || v.Type() != fastjson.TypeString {
		return "", false
	}
	return string(v.GetStringBytes()), true
}

// index names every member and refuses a repeated key (§4 item 4: APISIX would take
// the last one silently, so what the body means cannot be repaired safely). It is
// linear in the number of members, so a body of many keys costs no more than its size.
func (o *object) index() error {
	o.idx = make(map[string]slots, len(o.members))
	for i := range o.members {
		m := &o.members[i]
		if m.name == "" {
			m.name = m.keyName()
		}
		section, isVersion := strings.CutSuffix(m.name, versionSuffix)
		if section == "" {
			section, isVersion = m.name, false
		}
		sl, seen := o.idx[section]
		if !seen {
			sl = slots{items: -1, version: -1}
		}
		at := &sl.items
		if isVersion {
			at = &sl.version
		}
		if *at >= 0 {
			return &RefuseError{Reason: fmt.Sprintf("the top-level key %q appears twice: APISIX would silently take the last one", clip(m.name))}
		}
		*at = i
		o.idx[section] = sl
	}
	return nil
}

// slot returns a section's members.
func (o *object) slot(section string) slots {
	if sl, ok := o.idx[section]; ok {
		return sl
	}
	return slots{items: -1, version: -1}
}
