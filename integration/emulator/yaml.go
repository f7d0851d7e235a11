package emulator

import (
	"fmt"
	"math"
	"regexp"
	"sort"

	yaml "gopkg.in/yaml.v2"
)

// yamlNull is YAML's ~ as lyaml loads it: "no items" as a section value, but not a
// number as a version.
type yamlNull struct{}

// decodeYAML loads the first document with YAML 1.1 rules (yes/no/on/off booleans,
// leading-zero octal), as lyaml does; yaml.v2 implements YAML 1.1.
func decodeYAML(b []byte) (any, error) {
	var v any
	if err := yaml.Unmarshal(b, &v); err != nil {
		return nil, errLua
	}
	return fromYAML(v), nil
}

func fromYAML(v any) any {
	switch x := v.(type) {
	case nil:
		return yamlNull{}
	case map[any]any:
		t := table{}
		for k, val := range x {
			t[fmt.Sprint(k)] = fromYAML(val)
		}
		return t
	case []any:
		if len(x) == 0 {
			return table{}
		}
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = fromYAML(e)
		}
		return out
	case int:
		return float64(x)
	case int64:
		return float64(x)
	case uint64:
		return float64(x)
	case float64, string, bool:
		return x
	default:
		return fmt.Sprint(x)
	}
}

// encodeYAML writes the document in block style, keys sorted, empty tables as {},
// and strings that look like other scalars single-quoted, as lyaml does (yaml.v2
// double-quotes them).
func encodeYAML(doc table) ([]byte, error) {
	out, err := yaml.Marshal(toYAML(doc))
	if err != nil {
		return nil, err
	}
	return doubleToSingle.ReplaceAll(out, []byte("$1'$2'")), nil
}

// doubleToSingle matches a double-quoted scalar at the end of a line that needs no
// escape in single quotes.
var doubleToSingle = regexp.MustCompile(`(?m)(: |- )"([^"\\']*)"$`)

func toYAML(v any) any {
	switch x := v.(type) {
	case table:
		keys := sortedKeys(x)
		ms := make(yaml.MapSlice, 0, len(keys))
		for _, k := range keys {
			ms = append(ms, yaml.MapItem{Key: k, Value: toYAML(x[k])})
		}
		return ms
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = toYAML(e)
		}
		return out
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return int64(x)
		}
		return x
	case luaNull, yamlNull:
		return nil
	}
	return v
}

func sortStrings(s []string) { sort.Strings(s) }
