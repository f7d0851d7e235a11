package rewrite

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"unicode/utf8"
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

// scanner is one pass over a JSON value: where it stands (i, a value starting or one
// just ended), the containers open around it, and the top-level members found.
type scanner struct {
	b        []byte
	i        int
	stack    []byte // open containers: '{' or '['
	isObject bool
	obj      object
	cur      member // the top-level member being read
	depth    int    // levels already open around b (a member's value: 1)
	// mark, when set, is told at each value that starts at most two levels deep (a
	// member's value, a section's item): where an incremental scan may resume. An
	// error from it stops the scan.
	mark func() error
	// partial: b is a prefix of the body; a failure is no verdict (errPartial), only a
	// sign that the scan needs more bytes or the whole body.
	partial bool
}

// errPartial: a scan of a prefix stopped; the scan of the whole body gives the verdict.
var errPartial = errors.New("the scan of a prefix stopped")

func (s *scanner) fail(i int, what string) error {
	if s.partial {
		return errPartial
	}
	return &syntaxError{offset: i, what: what}
}

func (s *scanner) run() error {
	var stackBuf [64]byte
	s.stack = stackBuf[:0]
	s.i = skipWS(s.b, 0)
	if s.i >= len(s.b) {
		return s.fail(s.i, "empty body")
	}
	s.isObject = s.b[s.i] == '{'
	return s.resume()
}

// resume scans from s.i, where a value starts, to the end of the body. The offset
// travels as a value between the steps (s.i is where a mark, or a stop, left it).
func (s *scanner) resume() error {
	i := s.i
	for {
		if s.mark != nil && len(s.stack) <= 2 && i < len(s.b) {
			s.i = i
			if err := s.mark(); err != nil {
				return err
			}
		}
		var next int
		var ended bool
		var err error
		if i < len(s.b) && s.b[i] == '"' { // most values: a string, read here
			next, err = scanString(s.b, i+1)
			ended = true
			if err != nil && s.partial {
				err = errPartial
			}
		} else {
			next, ended, err = s.value(i)
		}
		if err != nil {
			s.i = i
			return err
		}
		i = next
		if !ended {
			continue // a container opened: its first value starts at i
		}
		var done bool
		next, done, err = s.after(i)
		if done || err != nil {
			s.i = i
			return err
		}
		i = next
	}
}

// value reads the start of the value at i: a whole scalar or an empty container
// (ended), or the opening of a container and, in an object, its first key. It returns
// where the scan goes on.
func (s *scanner) value(i int) (next int, ended bool, err error) {
	b := s.b
	if i >= len(b) {
		return i, false, s.fail(i, "missing value")
	}
	switch c := b[i]; c {
	case '{', '[':
		return s.open(c, i)
	case '"':
		next, err = scanString(b, i+1)
	case 't':
		next, err = s.literal(i, "true")
	case 'f':
		next, err = s.literal(i, "false")
	case 'n':
		next, err = s.literal(i, "null")
	default:
		next, err = scanNumber(b, i)
	}
	if err != nil && s.partial {
		err = errPartial
	}
	return next, true, err
}

// literal reads true, false or null at i.
func (s *scanner) literal(i int, word string) (int, error) {
	if !bytes.HasPrefix(s.b[i:], []byte(word)) {
		return 0, s.fail(i, "unexpected value")
	}
	return i + len(word), nil
}

// open opens the container c at i; an empty one ends at once.
func (s *scanner) open(c byte, i int) (next int, ended bool, err error) {
	if s.depth+len(s.stack) >= maxDepth {
		return i, false, errTooDeep
	}
	b := s.b
	s.stack = append(s.stack, c)
	i = skipWS(b, i+1)
	if i < len(b) && (b[i] == '}' && c == '{' || b[i] == ']' && c == '[') {
		s.stack = s.stack[:len(s.stack)-1]
		if len(s.stack) == 0 && s.isObject {
			s.obj.close = i
		}
		return i + 1, true, nil
	}
	if c == '{' {
		i, err = s.key(i)
	}
	return i, false, err
}

// after follows a value that ended at i: it closes the containers that end there and
// returns where the next value starts (past a ',' and, in an object, its key). done:
// the body's value ended.
func (s *scanner) after(i int) (next int, done bool, err error) {
	b := s.b
	for {
		if len(s.stack) == 1 && s.isObject {
			s.cur.valueEnd = i
			s.obj.members = append(s.obj.members, s.cur)
		}
		i = skipWS(b, i)
		if len(s.stack) == 0 {
			return i, true, s.trailing(i)
		}
		if i >= len(b) {
			return i, false, s.fail(i, "unexpected end")
		}
		top := s.stack[len(s.stack)-1]
		switch {
		case b[i] == ',':
			i = skipWS(b, i+1)
			if top == '{' {
				i, err = s.key(i)
			}
			return i, false, err
		case b[i] == '}' && top == '{', b[i] == ']' && top == '[':
			s.stack = s.stack[:len(s.stack)-1]
			if len(s.stack) == 0 && s.isObject {
				s.obj.close = i
			}
			i++
			if len(s.stack) == 0 {
				return i, true, s.trailing(skipWS(b, i))
			}
		default:
			return i, false, s.fail(i, "expected ',' or the end of a container")
		}
	}
}

// trailing: nothing but whitespace may follow the body's value.
func (s *scanner) trailing(i int) error {
	if i != len(s.b) {
		return s.fail(i, "unexpected data after the value")
	}
	return nil
}

// key reads `"key" :` at i and returns where the value starts.
func (s *scanner) key(i int) (int, error) {
	b := s.b
	if i >= len(b) || b[i] != '"' {
		return 0, s.fail(i, "expected an object key")
	}
	end, err := scanString(b, i+1)
	if err != nil {
		if s.partial {
			return 0, errPartial
		}
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
	if i < len(b) && b[i] == '-' {
		i++
	}
	first := i
	i, n := skipDigits(b, i)
	ok := n > 0 && (b[first] != '0' || n == 1)
	if ok && i < len(b) && b[i] == '.' {
		i, n = skipDigits(b, i+1)
		ok = n > 0
	}
	if ok {
		i, ok = scanExponent(b, i)
	}
	if !ok {
		return 0, &syntaxError{offset: start, what: "invalid number"}
	}
	return i, nil
}

// scanExponent reads an optional [eE][+-]?[0-9]+ at i.
func scanExponent(b []byte, i int) (int, bool) {
	if i >= len(b) || (b[i] != 'e' && b[i] != 'E') {
		return i, true
	}
	i++
	if i < len(b) && (b[i] == '+' || b[i] == '-') {
		i++
	}
	i, n := skipDigits(b, i)
	return i, n > 0
}

// skipDigits returns where the digits at i end, and how many there were.
func skipDigits(b []byte, i int) (int, int) {
	start := i
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i, i - start
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
// that are not UTF-8 kept as they are); false when quoted (white space around it
// allowed) is not a JSON string.
func unquote(quoted []byte) (string, bool) {
	i, j := skipWS(quoted, 0), len(quoted)
	for j > i && (quoted[j-1] == ' ' || quoted[j-1] == '\n' || quoted[j-1] == '\r' || quoted[j-1] == '\t') {
		j--
	}
	if i >= j || quoted[i] != '"' {
		return "", false
	}
	if end, err := scanString(quoted[:j], i+1); err != nil || end != j {
		return "", false
	}
	return string(appendUnescaped(nil, quoted[i+1:j-1])), true
}

// appendUnescaped appends the value of a JSON string's content s (between its quotes,
// valid as scanString checks it) to dst: rewrite's one decoder of JSON strings, for
// names and ids (unquote) and for the semantic fingerprint (semHasher.str). A \u
// surrogate pair is one rune; a surrogate that is not half of a pair becomes U+FFFD.
func appendUnescaped(dst, s []byte) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			dst = append(dst, c)
			continue
		}
		i++
		if s[i] == 'u' {
			var r rune
			r, i = unicodeEscape(s, i)
			dst = utf8.AppendRune(dst, r)
			continue
		}
		dst = append(dst, escaped[s[i]])
	}
	return dst
}

// escaped is the byte each one-letter escape stands for ('"', '\\' and '/' themselves).
var escaped = [256]byte{'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t', '"': '"', '\\': '\\', '/': '/'}

// unicodeEscape reads the \uXXXX whose 'u' is at s[i] (a surrogate pair as one rune)
// and returns the rune and the offset of its last byte.
func unicodeEscape(s []byte, i int) (rune, int) {
	r := hex4(s[i+1 : i+5])
	i += 4
	if r >= 0xd800 && r < 0xdc00 && i+6 < len(s) && s[i+1] == '\\' && s[i+2] == 'u' {
		if lo := hex4(s[i+3 : i+7]); lo >= 0xdc00 && lo < 0xe000 {
			r = 0x10000 + (r-0xd800)<<10 + (lo - 0xdc00)
			i += 6
		}
	}
	return r, i
}

func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c-'a') + 10
		default:
			r |= rune(c-'A') + 10
		}
	}
	return r
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
