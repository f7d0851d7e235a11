package emulator

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// This file models lua-cjson as OpenResty configures it for APISIX: the decoder's
// error messages, the Lua value model (an empty array and an empty object are the same
// empty table), and the encoder's quirks (14 significant digits, NaN refused, every
// empty table written as {}). APISIX's core.json turns cjson's escaping of "/" off
// (encode_escape_forward_slash(false)): a real 3.17 answers "uri":"/x" (testdata/apisix-wire).

// luaNull is cjson.null: a truthy light userdata, distinct from an absent key.
type luaNull struct{}

// table is a Lua table read from a JSON object (or an empty JSON array).
type table = map[string]any

// errEncode mirrors lua-cjson refusing NaN and Infinity.
//
//lint:ignore ST1005 lua-cjson's own text, which APISIX puts in its answer
var errEncode = errors.New("Cannot serialise number: must not be NaN or Infinity")

type cjsonDecoder struct {
	s     []byte
	i     int
	depth int
}

type cjsonToken struct {
	kind  string // T_OBJ_BEGIN … or T_ERROR
	err   string // for T_ERROR: "invalid token", …
	index int    // 0-based byte offset of the token
	val   any
}

// decodeCJSON decodes like cjson.decode and returns its error text on failure.
func decodeCJSON(b []byte) (any, error) {
	d := &cjsonDecoder{s: b}
	tok := d.next()
	v, err := d.value(tok)
	if err != nil {
		return nil, err
	}
	tok = d.next()
	if tok.kind != "T_END" {
		return nil, d.fail("the end", tok)
	}
	return v, nil
}

func (d *cjsonDecoder) fail(expected string, t cjsonToken) error {
	found := t.kind
	if t.kind == "T_ERROR" {
		found = t.err
	}
	//lint:ignore ST1005 lua-cjson's own text, which APISIX puts in its answer
	return fmt.Errorf("Expected %s but found %s at character %d", expected, found, t.index+1)
}

func (d *cjsonDecoder) value(t cjsonToken) (any, error) {
	switch t.kind {
	case "T_STRING", "T_NUMBER", "T_BOOLEAN":
		return t.val, nil
	case "T_NULL":
		return luaNull{}, nil
	case "T_OBJ_BEGIN":
		return d.object()
	case "T_ARR_BEGIN":
		return d.array()
	}
	return nil, d.fail("value", t)
}

func (d *cjsonDecoder) nest(t cjsonToken) error {
	d.depth++
	if d.depth > 1000 {
		//lint:ignore ST1005 lua-cjson's own text, which APISIX puts in its answer
		return fmt.Errorf("Found too many nested data structures (%d) at character %d", d.depth, t.index+1)
	}
	return nil
}

func (d *cjsonDecoder) object() (any, error) {
	if err := d.nest(cjsonToken{index: d.i - 1}); err != nil {
		return nil, err
	}
	defer func() { d.depth-- }()
	obj := table{}
	t := d.next()
	if t.kind == "T_OBJ_END" {
		return obj, nil
	}
	for {
		if t.kind != "T_STRING" {
			return nil, d.fail("object key string", t)
		}
		key := t.val.(string)
		if t = d.next(); t.kind != "T_COLON" {
			return nil, d.fail("colon", t)
		}
		v, err := d.value(d.next())
		if err != nil {
			return nil, err
		}
		obj[key] = v // the last duplicate wins, as in cjson
		t = d.next()
		if t.kind == "T_OBJ_END" {
			return obj, nil
		}
		if t.kind != "T_COMMA" {
			return nil, d.fail("comma or object end", t)
		}
		t = d.next()
	}
}

func (d *cjsonDecoder) array() (any, error) {
	if err := d.nest(cjsonToken{index: d.i - 1}); err != nil {
		return nil, err
	}
	defer func() { d.depth-- }()
	var arr []any
	t := d.next()
	if t.kind == "T_ARR_END" {
		return table{}, nil // an empty array is an empty table
	}
	for {
		v, err := d.value(t)
		if err != nil {
			return nil, err
		}
		arr = append(arr, v)
		t = d.next()
		if t.kind == "T_ARR_END" {
			return arr, nil
		}
		if t.kind != "T_COMMA" {
			return nil, d.fail("comma or array end", t)
		}
		t = d.next()
	}
}

func (d *cjsonDecoder) next() cjsonToken {
	for d.i < len(d.s) && strings.IndexByte(" \t\n\r", d.s[d.i]) >= 0 {
		d.i++
	}
	start := d.i
	if d.i >= len(d.s) {
		return cjsonToken{kind: "T_END", index: start}
	}
	c := d.s[d.i]
	if k := simpleToken(c); k != "" {
		d.i++
		return cjsonToken{kind: k, index: start}
	}
	switch {
	case c == '"':
		return d.str()
	case bytes.HasPrefix(d.s[d.i:], []byte("true")):
		d.i += 4
		return cjsonToken{kind: "T_BOOLEAN", index: start, val: true}
	case bytes.HasPrefix(d.s[d.i:], []byte("false")):
		d.i += 5
		return cjsonToken{kind: "T_BOOLEAN", index: start, val: false}
	case bytes.HasPrefix(d.s[d.i:], []byte("null")):
		d.i += 4
		return cjsonToken{kind: "T_NULL", index: start}
	case c == '-' || (c >= '0' && c <= '9') || c == 'i' || c == 'I' || c == 'n' || c == 'N':
		return d.number()
	}
	return cjsonToken{kind: "T_ERROR", err: "invalid token", index: start}
}

// simpleToken is the kind of a one-byte token ("" for none).
func simpleToken(c byte) string {
	switch c {
	case '{':
		return "T_OBJ_BEGIN"
	case '}':
		return "T_OBJ_END"
	case '[':
		return "T_ARR_BEGIN"
	case ']':
		return "T_ARR_END"
	case ':':
		return "T_COLON"
	case ',':
		return "T_COMMA"
	}
	return ""
}

func (d *cjsonDecoder) number() cjsonToken {
	start := d.i
	end := d.i
	for end < len(d.s) && strings.IndexByte("+-0123456789.eEinfatyINFATY", d.s[end]) >= 0 {
		end++
	}
	text := string(d.s[start:end])
	f, err := strconv.ParseFloat(text, 64)
	if err != nil {
		// strconv also reads "inf", "infinity" and "nan", which cjson accepts too.
		var numErr *strconv.NumError
		if !errors.As(err, &numErr) || numErr.Err != strconv.ErrRange {
			return cjsonToken{kind: "T_ERROR", err: "invalid number", index: start}
		}
	}
	d.i = end
	return cjsonToken{kind: "T_NUMBER", index: start, val: f}
}

func (d *cjsonDecoder) str() cjsonToken {
	start := d.i
	d.i++
	var out []byte
	for {
		if d.i >= len(d.s) {
			return cjsonToken{kind: "T_ERROR", err: "unexpected end of string", index: start}
		}
		c := d.s[d.i]
		if c == '"' {
			d.i++
			return cjsonToken{kind: "T_STRING", index: start, val: string(out)}
		}
		if c != '\\' {
			out = append(out, c)
			d.i++
			continue
		}
		if d.i+1 >= len(d.s) {
			return cjsonToken{kind: "T_ERROR", err: "unexpected end of string", index: start}
		}
		esc := d.s[d.i+1]
		switch esc {
		case '"', '\\', '/':
			out = append(out, esc)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, n := d.unicodeEscape(d.i)
			if n == 0 {
				return cjsonToken{kind: "T_ERROR", err: "invalid unicode escape code", index: start}
			}
			out = utf8.AppendRune(out, r)
			d.i += n
			continue
		default:
			return cjsonToken{kind: "T_ERROR", err: "invalid escape code", index: start}
		}
		d.i += 2
	}
}

// unicodeEscape reads \uXXXX (and a following low surrogate) at i.
func (d *cjsonDecoder) unicodeEscape(i int) (rune, int) {
	hex4 := func(at int) (rune, bool) {
		if at+6 > len(d.s) || d.s[at] != '\\' || d.s[at+1] != 'u' {
			return 0, false
		}
		v, err := strconv.ParseUint(string(d.s[at+2:at+6]), 16, 16)
		return rune(v), err == nil
	}
	r, ok := hex4(i)
	if !ok {
		return 0, 0
	}
	if r >= 0xD800 && r < 0xDC00 {
		lo, ok := hex4(i + 6)
		if !ok || lo < 0xDC00 || lo > 0xDFFF {
			return 0, 0
		}
		return 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00), 12
	}
	return r, 6
}

// encodeCJSON encodes like cjson.encode with encode_empty_table_as_object: compact,
// keys sorted (Lua's order is unspecified), numbers with %.14g, "/" escaped.
func encodeCJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	if err := encodeValue(&buf, v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func encodeValue(buf *bytes.Buffer, v any) error {
	switch x := v.(type) {
	case nil, luaNull:
		buf.WriteString("null")
	case bool:
		buf.WriteString(strconv.FormatBool(x))
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return errEncode
		}
		buf.WriteString(formatLuaNumber(x))
	case string:
		encodeString(buf, x)
	case []any:
		buf.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := encodeValue(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case table:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			encodeString(buf, k)
			buf.WriteByte(':')
			if err := encodeValue(buf, x[k]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	default:
		return fmt.Errorf("cannot encode %T", v)
	}
	return nil
}

func encodeString(buf *bytes.Buffer, s string) {
	buf.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"':
			buf.WriteString(`\"`)
		case '\\':
			buf.WriteString(`\\`)
		case '\b':
			buf.WriteString(`\b`)
		case '\f':
			buf.WriteString(`\f`)
		case '\n':
			buf.WriteString(`\n`)
		case '\r':
			buf.WriteString(`\r`)
		case '\t':
			buf.WriteString(`\t`)
		default:
			if c < 0x20 || c == 0x7f {
				fmt.Fprintf(buf, `\u%04x`, c)
			} else {
				buf.WriteByte(c)
			}
		}
	}
	buf.WriteByte('"')
}

// formatLuaNumber prints a number as Lua's %.14g does.
func formatLuaNumber(f float64) string {
	return fmt.Sprintf("%.14g", f)
}
