package driver_test

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/watermill-inbox/inbox/stores/driver"
)

func TestPrefixEnd(t *testing.T) {
	t.Parallel()
	for prefix, want := range map[string]string{
		"":                       "",
		"a":                      "b",
		"abc":                    "abd",
		"a:":                     "a;",
		"orders:%_":              "orders:%`",
		"k\u007f":                "k\u0080",
		"x\u007f":                "x\u0080", // one byte to two
		"é":                      "ê",
		"a\uD7FF":                "a\uE000",
		"x\ud7ff":                "x\ue000", // past the surrogates
		"a\uFFFF":                "a\U00010000",
		"a\U0010FFFF":            "b",
		"x\U0010ffff":            "y",
		"\U0010FFFF\U0010FFFF":   "",
		"x\U0010FFFF\U0010FFFF":  "y",
		"storetest:0af3:admin:z": "storetest:0af3:admin:{",
	} {
		got, ok := driver.PrefixEnd(prefix)
		if got != want || ok != (want != "") {
			t.Errorf("PrefixEnd(%q) = %q, %v; want %q", prefix, got, ok, want)
		}
		if !utf8.ValidString(got) {
			t.Errorf("PrefixEnd(%q) = %q is not valid UTF-8", prefix, got)
		}
	}
}

// Every valid string is in [prefix, PrefixEnd(prefix)) exactly when it
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
		end, ok := driver.PrefixEnd(prefix)
		in := s >= prefix && (!ok || s < end)
		if in != strings.HasPrefix(s, prefix) {
			t.Fatalf("prefix %q, end %q (%v): %q in range = %v, has the prefix = %v", prefix, end, ok, s, in, !in)
		}
	}
}
