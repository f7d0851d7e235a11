package emulator

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// yamlNull is YAML's ~ as lyaml loads it: "no items" as a section value, but not a
// number as a version.
type yamlNull struct{}

// decodeYAML loads a body as APISIX's lyaml does (over libyaml; go.yaml.in/yaml/v3 is
// a port of libyaml): every document must parse and the first is used, an empty or
// null document is an empty table, merge keys are applied (earlier maps winning,
// explicit keys over merged ones), and plain scalars resolve by lyaml's implicit rules
// (lyaml/implicit.lua): yes/no/on/off are booleans, y/n are strings, a leading 0 makes
// an octal integer, 0o17 is a string, 1:30 is the sexagesimal 90, 1e3 is a float.
func decodeYAML(b []byte) (any, error) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var first *yaml.Node
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, errLua // PUT does not catch the loader's error: nginx's 500
		}
		if first == nil {
			first = &doc
		}
	}
	if first == nil || len(first.Content) == 0 {
		return table{}, nil
	}
	v, err := fromNode(first.Content[0], 0)
	if _, isNull := v.(yamlNull); isNull {
		return table{}, err
	}
	return v, err
}

// maxYAMLDepth is about where lyaml gives up (maps ~10,900 levels, sequences ~16,350).
const maxYAMLDepth = 10900

func fromNode(n *yaml.Node, depth int) (any, error) {
	if depth > maxYAMLDepth {
		return nil, errLua
	}
	switch n.Kind {
	case yaml.AliasNode:
		return fromNode(n.Alias, depth+1)
	case yaml.ScalarNode:
		return scalar(n), nil
	case yaml.SequenceNode:
		if len(n.Content) == 0 {
			return table{}, nil
		}
		out := make([]any, len(n.Content))
		for i, c := range n.Content {
			v, err := fromNode(c, depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	case yaml.MappingNode:
		t := table{}
		var merges []*yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
				merges = append(merges, v)
				continue
			}
			key, err := fromNode(k, depth+1)
			if err != nil {
				return nil, err
			}
			val, err := fromNode(v, depth+1)
			if err != nil {
				return nil, err
			}
			t[fmt.Sprint(key)] = val
		}
		for _, m := range merges {
			if err := mergeInto(t, m, depth+1); err != nil {
				return nil, err
			}
		}
		return t, nil
	}
	return nil, errLua
}

// mergeInto applies a merge key's value (a map, or a sequence of maps of which the
// earlier win) without overriding keys the mapping sets itself.
func mergeInto(t table, m *yaml.Node, depth int) error {
	sources := []*yaml.Node{m}
	if target := m; target.Kind == yaml.AliasNode && target.Alias.Kind == yaml.SequenceNode || m.Kind == yaml.SequenceNode {
		if m.Kind == yaml.AliasNode {
			m = m.Alias
		}
		sources = m.Content
	}
	for _, src := range sources {
		v, err := fromNode(src, depth)
		if err != nil {
			return err
		}
		mt, ok := v.(table)
		if !ok {
			return errLua
		}
		for k, val := range mt {
			if _, set := t[k]; !set {
				t[k] = val
			}
		}
	}
	return nil
}

// scalar resolves a scalar as lyaml does: quoted and block scalars are strings; plain
// ones go through lyaml's implicit resolvers in its order.
func scalar(n *yaml.Node) any {
	if n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
		return n.Value
	}
	if n.Style&yaml.TaggedStyle != 0 {
		switch n.Tag {
		case "!!str":
			return n.Value
		case "!!null":
			return yamlNull{}
		}
	}
	v := n.Value
	switch v {
	case "", "~", "null", "Null", "NULL":
		return yamlNull{}
	}
	sign := 1.0
	digits := v
	if strings.HasPrefix(v, "-") {
		sign, digits = -1, v[1:]
	} else if strings.HasPrefix(v, "+") {
		digits = v[1:]
	}
	if m := lyamlOctal.FindStringSubmatch(v); m != nil {
		if n, err := strconv.ParseUint(strings.ReplaceAll(m[1], "_", ""), 8, 64); err == nil {
			return sign * float64(n)
		}
	}
	if m := lyamlDecimal.FindStringSubmatch(v); m != nil {
		if d := strings.ReplaceAll(m[1], "_", ""); d == "0" || len(d) > 1 || d[0] != '0' {
			f, _ := strconv.ParseFloat(d, 64)
			return sign * f
		}
	}
	if strings.ContainsAny(v, ".eE") && lyamlFloat.MatchString(strings.ReplaceAll(v, "_", "")) {
		if f, err := strconv.ParseFloat(strings.ReplaceAll(v, "_", ""), 64); err == nil || errors.Is(err, strconv.ErrRange) {
			return f
		}
	}
	switch v {
	case "true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON":
		return true
	case "false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF":
		return false
	case ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF":
		return math.Inf(1)
	case "-.inf", "-.Inf", "-.INF":
		return math.Inf(-1)
	case ".nan", ".NaN", ".NAN":
		return math.NaN()
	}
	if strings.HasPrefix(digits, "0x") {
		if n, err := strconv.ParseUint(strings.ReplaceAll(digits[2:], "_", ""), 16, 64); err == nil {
			return sign * float64(n)
		}
	}
	if m := lyamlBinary.FindStringSubmatch(v); m != nil {
		if n, err := strconv.ParseUint(strings.ReplaceAll(m[1], "_", ""), 2, 64); err == nil {
			return sign * float64(n)
		}
	}
	if m := lyamlSexagesimal.FindStringSubmatch(v); m != nil {
		r := 0.0
		for _, part := range regexp.MustCompile(`[0-9]+`).FindAllString(m[1], -1) {
			p, _ := strconv.ParseFloat(part, 64)
			r = r*60 + p
		}
		if m[2] != "" {
			f, _ := strconv.ParseFloat(m[2], 64)
			r += f
		}
		return sign * r
	}
	return v
}

var (
	lyamlOctal       = regexp.MustCompile(`^[+-]?0_*([0-7][0-7_]*)$`)
	lyamlDecimal     = regexp.MustCompile(`^[+-]?_*([0-9][0-9_]*)$`)
	lyamlFloat       = regexp.MustCompile(`^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$`)
	lyamlBinary      = regexp.MustCompile(`^[+-]?0b_*([01][01_]+)$`)
	lyamlSexagesimal = regexp.MustCompile(`^[+-]?([0-9]+:[0-5]?[0-9][:0-9]*)(\.[0-9]+)?$`)
)

// encodeYAML writes the document in block style, keys sorted, empty tables as {},
// and strings that look like other scalars single-quoted, as lyaml does.
func encodeYAML(doc table) ([]byte, error) {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(toNode(doc)); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return doubleToSingle.ReplaceAll(b.Bytes(), []byte("$1'$2'")), nil
}

// doubleToSingle matches a double-quoted scalar at the end of a line that needs no
// escape in single quotes.
var doubleToSingle = regexp.MustCompile(`(?m)(: |- )"([^"\\']*)"$`)

func toNode(v any) *yaml.Node {
	switch x := v.(type) {
	case table:
		n := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		for _, k := range sortedKeys(x) {
			n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k}, toNode(x[k]))
		}
		return n
	case []any:
		n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, e := range x {
			n.Content = append(n.Content, toNode(e))
		}
		return n
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatInt(int64(x), 10)}
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: strconv.FormatFloat(x, 'g', -1, 64)}
	case bool:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(x)}
	case string:
		n := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: x}
		if plain, isString := scalar(&yaml.Node{Value: x}).(string); !isString || plain != x {
			n.Style = yaml.SingleQuotedStyle // it would read back as something else
		}
		return n
	}
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "~"} // luaNull, yamlNull
}

func sortStrings(s []string) { sort.Strings(s) }
