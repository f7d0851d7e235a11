package rewrite

import (
	"hash/maphash"
	"testing"
)

// TestOneStringDecoder holds rewrite's one JSON string decoder (appendUnescaped) to what
// each of its callers needs: the names and ids read through unquote (a top-level key,
// an item's key, an id) and the strings the semantic fingerprint hashes, where an escaped
// spelling must weigh the same as the plain one.
func TestOneStringDecoder(t *testing.T) {
	cases := []struct {
		name   string
		quoted string // a JSON string as a body spells it
		want   string
	}{
		{"plain", `"routes"`, "routes"},
		{"empty", `""`, ""},
		{"one-letter escapes", `"\"\\\/\b\f\n\r\t"`, "\"\\/\b\f\n\r\t"},
		{"escaped letter", `"r\u006futes"`, "routes"},
		{"upper-case hex", `"\u00E9\u00e9"`, "éé"},
		{"NUL", `"a\u0000b"`, "a\x00b"},
		{"surrogate pair", `"\ud83d\ude00"`, "😀"},
		{"surrogate pair, upper case", `"x\uD83D\uDE00y"`, "x😀y"},
		{"UTF-8 as it is", `"é😀"`, "é😀"},
		{"not UTF-8, kept", "\"a\xffb\\n\"", "a\xffb\n"},
		// lua-cjson refuses what follows (APISIX answers the body with an error); each
		// surrogate that is not half of a pair is U+FFFD, and decoding goes on after it.
		{"lone high surrogate", `"\ud800"`, "\uFFFD"},
		{"lone low surrogate", `"\udc00x"`, "\uFFFDx"},
		{"high surrogate then a letter", `"\ud800\u0041"`, "\uFFFDA"},
		{"two high surrogates", `"\ud800\ud800"`, "\uFFFD\uFFFD"},
		{"high surrogate, then a pair", `"\ud800\udbff\udc00"`, "\uFFFD\U0010FC00"},
		{"high surrogate at the end", `"a\ud83d"`, "a\uFFFD"},
	}
	seed := maphash.MakeSeed()
	plain := func(s string) []byte { // the same string with no escape at all
		b := []byte{'"'}
		for _, c := range []byte(s) {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20: // a control character must be escaped: as itself, \u00XX
				b = append(b, '\\', 'u', '0', '0', "0123456789abcdef"[c>>4], "0123456789abcdef"[c&15])
			default:
				b = append(b, c)
			}
		}
		return append(b, '"')
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q := []byte(tc.quoted)
			if end, err := scanString(q, 1); err != nil || end != len(q) {
				t.Fatalf("the case is not a valid JSON string: %v", err)
			}
			if got := string(appendUnescaped(nil, q[1:len(q)-1])); got != tc.want {
				t.Errorf("appendUnescaped = %q, want %q", got, tc.want)
			}
			// the callers through unquote: a top-level key, an item's key, an id
			if got, ok := unquote(q); !ok || got != tc.want {
				t.Errorf("unquote = %q %v, want %q", got, ok, tc.want)
			}
			if got := (member{key: q[1 : len(q)-1]}).keyName(); got != tc.want {
				t.Errorf("keyName = %q, want %q", got, tc.want)
			}
			if got := idText(q); got != tc.want {
				t.Errorf("idText = %q, want %q", got, tc.want)
			}
			var key string
			eachMember([]byte(`{`+tc.quoted+`:1}`), func(name string, _ []byte) { key = name })
			if key != tc.want {
				t.Errorf("eachMember's name = %q, want %q", key, tc.want)
			}
			// the semantic fingerprint: the escaped spelling weighs what the plain one does
			h := semHasher{seed: seed}
			escaped := h.sectionFingerprint("", []byte(`[{"id":`+tc.quoted+`}]`))
			unescaped := h.sectionFingerprint("", []byte(`[{"id":`+string(plain(tc.want))+`}]`))
			if escaped != unescaped {
				t.Errorf("fingerprint of %s differs from the plain spelling %s", tc.quoted, plain(tc.want))
			}
		})
	}
}

// TestUnquoteRefuses: what is not one JSON string is no name; white space around one is
// allowed (an id's value as a scan leaves it).
func TestUnquoteRefuses(t *testing.T) {
	for _, in := range []string{``, ` `, `1`, `null`, `"a`, `a"`, `"a" "b"`, `"\x"`, `"\u12"`, `"\`, "\"a\x01\"", `"a"x`, `{"a":1}`} {
		if got, ok := unquote([]byte(in)); ok {
			t.Errorf("unquote(%q) = %q, true; want false", in, got)
		}
	}
	if got, ok := unquote([]byte(" \t\"a\\/b\"\n ")); !ok || got != "a/b" {
		t.Errorf("unquote with white space around = %q %v, want %q true", got, ok, "a/b")
	}
}
