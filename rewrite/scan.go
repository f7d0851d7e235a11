package rewrite

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/valyala/fastjson"
)

// member is one top-level "key": value pair of the body, as byte offsets.
type member struct {
	key        []byte // the key's raw bytes between the quotes (still escaped)
	start      int    // offset of the key's opening quote
	valueStart int
	valueEnd   int
}

// object is the top level of a JSON object body: its members and the offset of the
// closing brace. Values are never parsed here: they are skipped as bytes.
type object struct {
	members []member
	close   int
}

var errNotObject = errors.New("body is JSON but not an object")

// scanObject finds the top-level members of body, which must already be valid JSON.
// It does not validate nested values; it only needs to skip them correctly.
func scanObject(body []byte, members []member) (object, error) {
	i := skipWS(body, 0)
	if i >= len(body) {
		return object{}, errors.New("empty body")
	}
	if body[i] != '{' {
		return object{}, errNotObject
	}
	obj := object{members: members[:0]}
	i = skipWS(body, i+1)
	if i < len(body) && body[i] == '}' {
		obj.close = i
		return obj, nil
	}
	for {
		if i >= len(body) || body[i] != '"' {
			return object{}, fmt.Errorf("expected a key at offset %d", i)
		}
		keyEnd, err := skipString(body, i+1)
		if err != nil {
			return object{}, err
		}
		m := member{key: body[i+1 : keyEnd-1], start: i}
		i = skipWS(body, keyEnd)
		if i >= len(body) || body[i] != ':' {
			return object{}, fmt.Errorf("expected ':' at offset %d", i)
		}
		i = skipWS(body, i+1)
		m.valueStart = i
		if i, err = skipValue(body, i); err != nil {
			return object{}, err
		}
		m.valueEnd = i
		obj.members = append(obj.members, m)
		i = skipWS(body, i)
		if i >= len(body) {
			return object{}, errors.New("unterminated object")
		}
		switch body[i] {
		case ',':
			i = skipWS(body, i+1)
		case '}':
			obj.close = i
			return obj, nil
		default:
			return object{}, fmt.Errorf("expected ',' or '}' at offset %d", i)
		}
	}
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	return i
}

// skipString returns the offset just past the closing quote of a string whose
// content starts at i.
func skipString(b []byte, i int) (int, error) {
	for {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return 0, errors.New("unterminated string")
		}
		end := i + j
		backslashes := 0
		for k := end - 1; k >= i && b[k] == '\\'; k-- {
			backslashes++
		}
		if backslashes%2 == 0 {
			return end + 1, nil
		}
		i = end + 1
	}
}

// skipValue returns the offset just past the value starting at i.
func skipValue(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, errors.New("missing value")
	}
	switch b[i] {
	case '"':
		return skipString(b, i+1)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				end, err := skipString(b, i+1)
				if err != nil {
					return 0, err
				}
				i = end
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1, nil
				}
			}
			i++
		}
		return 0, errors.New("unterminated value")
	default:
		start := i
		for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\n' && b[i] != '\r' && b[i] != '\t' {
			i++
		}
		if i == start {
			return 0, fmt.Errorf("missing value at offset %d", start)
		}
		return i, nil
	}
}

// keyName returns the member's key unescaped (the common case needs no copy).
func (m member) keyName() string {
	if bytes.IndexByte(m.key, '\\') < 0 {
		return string(m.key)
	}
	quoted := make([]byte, 0, len(m.key)+2)
	quoted = append(append(append(quoted, '"'), m.key...), '"')
	v, err := fastjson.ParseBytes(quoted)
	if err != nil {
		return string(m.key)
	}
	return string(v.GetStringBytes())
}

// find returns the index of the member named name, or -1.
func (o *object) find(name string) int {
	for i := range o.members {
		if string(o.members[i].key) == name {
			return i
		}
	}
	return -1
}

// checkDuplicates reports a duplicate top-level key (APISIX would take the last one,
// fastjson the first: refuse to guess). Escaped keys are compared, and then found, by name.
func (o *object) checkDuplicates() error {
	escaped := false
	for _, m := range o.members {
		if bytes.IndexByte(m.key, '\\') >= 0 {
			escaped = true
			break
		}
	}
	if !escaped && len(o.members) <= 64 {
		for i := range o.members {
			for j := i + 1; j < len(o.members); j++ {
				if bytes.Equal(o.members[i].key, o.members[j].key) {
					return fmt.Errorf("duplicate top-level key %q", o.members[i].key)
				}
			}
		}
		return nil
	}
	seen := make(map[string]bool, len(o.members))
	for i := range o.members {
		name := o.members[i].keyName()
		if seen[name] {
			return fmt.Errorf("duplicate top-level key %q", name)
		}
		seen[name] = true
		o.members[i].key = []byte(name)
	}
	return nil
}
