package rewrite

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"

	yaml "gopkg.in/yaml.v2"
)

// YAMLToJSON reads a YAML configuration body as APISIX's lyaml does — YAML 1.1
// (yes/no/on/off are booleans, a leading zero makes an octal integer), only the first
// document — and returns it as compact JSON, keys in the document's order, so that it
// can be repaired like a JSON body and forwarded as JSON. A document that is not a
// mapping returns ErrNotObject; one that cannot be read, or holds a value JSON cannot
// carry (NaN, infinity), returns a *SkipError and is forwarded untouched.
//
// A section given as ~ means "no items" to APISIX, where JSON null would be a Lua
// error; it becomes []. A ~ version stays null, so that APISIX still answers
// "must be a number".
func YAMLToJSON(body []byte) ([]byte, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, &SkipError{Reason: "the body is empty"}
	}
	// Decoded twice: once to learn the document's kind (yaml.v2 would read a sequence
	// into a MapSlice without complaint), once in order. YAML bodies are rare.
	var generic any
	if err := yaml.Unmarshal(body, &generic); err != nil {
		return nil, &SkipError{Reason: "the YAML body cannot be read"}
	}
	if _, isMap := generic.(map[any]any); !isMap {
		return nil, ErrNotObject // a scalar, a sequence, ~ or an empty document
	}
	var doc yaml.MapSlice
	if err := yaml.Unmarshal(body, &doc); err != nil {
		return nil, &SkipError{Reason: "the YAML body cannot be read"}
	}
	var b bytes.Buffer
	b.Grow(len(body))
	b.WriteByte('{')
	for i, item := range doc {
		if i > 0 {
			b.WriteByte(',')
		}
		key := yamlKey(item.Key)
		appendJSONString(&b, key)
		b.WriteByte(':')
		v := item.Value
		if v == nil && !isVersionKey(key) {
			b.WriteString("[]")
			continue
		}
		if err := appendYAMLValue(&b, v, 1); err != nil {
			return nil, &SkipError{Reason: "the YAML body " + err.Error()}
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func isVersionKey(key string) bool {
	return len(key) > len(versionSuffix) && key[len(key)-len(versionSuffix):] == versionSuffix
}

func yamlKey(k any) string {
	if s, ok := k.(string); ok {
		return s
	}
	return fmt.Sprint(k)
}

var errYAMLTooDeep = errors.New("nests deeper than 1000 levels")

func appendYAMLValue(b *bytes.Buffer, v any, depth int) error {
	if depth > maxDepth {
		return errYAMLTooDeep
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case int:
		b.WriteString(strconv.Itoa(x))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case uint64:
		b.WriteString(strconv.FormatUint(x, 10))
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return errors.New("holds NaN or infinity, which JSON cannot carry")
		}
		b.WriteString(strconv.FormatFloat(x, 'g', -1, 64))
	case string:
		appendJSONString(b, x)
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := appendYAMLValue(b, e, depth+1); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case yaml.MapSlice:
		b.WriteByte('{')
		for i, item := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			appendJSONString(b, yamlKey(item.Key))
			b.WriteByte(':')
			if err := appendYAMLValue(b, item.Value, depth+1); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case map[any]any: // yaml.v2 decodes nested mappings as MapSlice; this is a fallback
		keys := make([]string, 0, len(x))
		byKey := make(map[string]any, len(x))
		for k, v := range x {
			keys = append(keys, yamlKey(k))
			byKey[yamlKey(k)] = v
		}
		sort.Strings(keys)
		ms := make(yaml.MapSlice, len(keys))
		for i, k := range keys {
			ms[i] = yaml.MapItem{Key: k, Value: byKey[k]}
		}
		return appendYAMLValue(b, ms, depth)
	default:
		appendJSONString(b, fmt.Sprint(x))
	}
	return nil
}

// appendJSONString writes s as a JSON string (invalid UTF-8 becomes U+FFFD).
func appendJSONString(b *bytes.Buffer, s string) {
	quoted, _ := json.Marshal(s) // a string always marshals
	b.Write(quoted)
}
