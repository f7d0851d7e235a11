package rewrite

import (
	"bytes"
	"strconv"

	"github.com/valyala/fastjson"
)

// sameItems reports whether two section values hold the same items in the sense of
// contract §5.1: same JSON values, object key order and whitespace ignored, an empty
// array equal to an empty object (APISIX reads [] back as {}), items matched by their
// id (consumers: id or username). Either side may be nil (section absent).
func sameItems(client, stored []byte) (bool, error) {
	var pc, ps fastjson.Parser
	c, err := parseOrEmpty(&pc, client)
	if err != nil {
		return false, err
	}
	s, err := parseOrEmpty(&ps, stored)
	if err != nil {
		return false, err
	}
	ci, cok := itemList(c)
	si, sok := itemList(s)
	if !cok || !sok {
		return equalValues(c, s), nil
	}
	if len(ci) != len(si) {
		return false, nil
	}
	if len(ci) == 0 {
		return true, nil
	}
	byID := make(map[string]*fastjson.Value, len(si))
	for _, item := range si {
		id, ok := itemID(item)
		if !ok || byID[id] != nil {
			return equalPositional(ci, si), nil
		}
		byID[id] = item
	}
	seen := make(map[string]bool, len(ci))
	for _, item := range ci {
		id, ok := itemID(item)
		if !ok || seen[id] {
			return equalPositional(ci, si), nil
		}
		seen[id] = true
		if other := byID[id]; other == nil || !equalValues(item, other) {
			return false, nil
		}
	}
	return true, nil
}

func parseOrEmpty(p *fastjson.Parser, b []byte) (*fastjson.Value, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, nil
	}
	return p.ParseBytes(b)
}

// itemList returns a section's items; absent, [] and {} are all "no items".
func itemList(v *fastjson.Value) ([]*fastjson.Value, bool) {
	if v == nil || isEmptyContainer(v) {
		return nil, true
	}
	if v.Type() != fastjson.TypeArray {
		return nil, false
	}
	arr, _ := v.Array()
	return arr, true
}

func isEmptyContainer(v *fastjson.Value) bool {
	switch v.Type() {
	case fastjson.TypeArray:
		a, _ := v.Array()
		return len(a) == 0
	case fastjson.TypeObject:
		o, _ := v.Object()
		return o.Len() == 0
	}
	return false
}

// itemID is an item's identity: id, else username; typed so that 1 and "1" differ.
func itemID(item *fastjson.Value) (string, bool) {
	for _, field := range [...]string{"id", "username"} {
		v := item.Get(field)
		if v == nil {
			continue
		}
		switch v.Type() {
		case fastjson.TypeString:
			return "s" + string(v.GetStringBytes()), true
		case fastjson.TypeNumber:
			return "n" + strconv.FormatFloat(v.GetFloat64(), 'g', -1, 64), true
		}
		return "", false
	}
	return "", false
}

func equalPositional(a, b []*fastjson.Value) bool {
	for i := range a {
		if !equalValues(a[i], b[i]) {
			return false
		}
	}
	return true
}

func equalValues(a, b *fastjson.Value) bool {
	if a == nil || b == nil {
		return a == b || (a == nil && isEmptyContainer(b)) || (b == nil && isEmptyContainer(a))
	}
	if isEmptyContainer(a) && isEmptyContainer(b) {
		return true
	}
	if a.Type() != b.Type() {
		return false
	}
	switch a.Type() {
	case fastjson.TypeObject:
		ao, _ := a.Object()
		bo, _ := b.Object()
		if ao.Len() != bo.Len() {
			return false
		}
		equal := true
		ao.Visit(func(key []byte, av *fastjson.Value) {
			if equal {
				bv := bo.Get(string(key))
				equal = bv != nil && equalValues(av, bv)
			}
		})
		return equal
	case fastjson.TypeArray:
		aa, _ := a.Array()
		ba, _ := b.Array()
		return len(aa) == len(ba) && equalPositional(aa, ba)
	case fastjson.TypeString:
		return bytes.Equal(a.GetStringBytes(), b.GetStringBytes())
	case fastjson.TypeNumber:
		return a.GetFloat64() == b.GetFloat64()
	}
	return true // true, false, null: the type says it all
}
