package mongostore

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestPrefixEnd(t *testing.T) {
	t.Parallel()
	for prefix, want := range map[string]string{
		"abc":                  "abd",
		"a:":                   "a;",
		"é":                    "ê",
		"x\u007f":              "x\u0080", // one byte to two
		"x\ud7ff":              "x\ue000", // past the surrogates
		"x\U0010ffff":          "y",
		"\U0010ffff\U0010ffff": "",
		"":                     "",
	} {
		got, ok := prefixEnd(prefix)
		if got != want || ok != (want != "") {
			t.Errorf("prefixEnd(%q) = %q, %v; want %q", prefix, got, ok, want)
		}
		if ok && !utf8.ValidString(got) {
			t.Errorf("prefixEnd(%q) = %q is not valid UTF-8", prefix, got)
		}
	}
}

// Every valid string is in [prefix, prefixEnd(prefix)) exactly when it
// starts with prefix, byte order being the servers' order of strings.
func TestPrefixEnd_range_is_the_prefix(t *testing.T) {
	t.Parallel()
	runes := []rune{'a', 'b', ':', '%', '*', '.', 0x7f, 0x80, 0x7ff, 0x800, 0xd7ff, 0xe000, 0xffff, 0x10000, 0x10ffff}
	random := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteRune(runes[rand.N(len(runes))])
		}
		return b.String()
	}
	for range 20000 {
		prefix, s := random(rand.N(3)), random(rand.N(5))
		if rand.N(2) == 0 {
			s = prefix + s
		}
		end, ok := prefixEnd(prefix)
		in := s >= prefix && (!ok || s < end)
		if in != strings.HasPrefix(s, prefix) {
			t.Fatalf("prefix %q, end %q (%v): %q in range = %v, has the prefix = %v", prefix, end, ok, s, in, !in)
		}
	}
}
