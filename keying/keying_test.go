package keying_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
)

// validKeys are keys with their exact string form; String and Parse must map
// each to the other.
var validKeys = []struct {
	name string
	key  keying.Key
	s    string
}{
	{"plain", keying.Key{Bus: "rabbit", Group: "orders", Alias: "OrderPlaced", ID: "123"}, "rabbit:orders:OrderPlaced:123"},
	{"urn uuid id verbatim", keying.Key{Bus: "rabbit", Group: "orders", Alias: "OrderPlaced", ID: "urn:uuid:4b0c9a1e-4c3d-4f6a-9b1e-2d3c4b5a6f70"},
		"rabbit:orders:OrderPlaced:urn:uuid:4b0c9a1e-4c3d-4f6a-9b1e-2d3c4b5a6f70"},
	{"id keeps percent", keying.Key{Bus: "b", Group: "g", Alias: "a", ID: "50%:%3A"}, "b:g:a:50%:%3A"},
	{"colon in bus", keying.Key{Bus: "kafka:prod", Group: "g", Alias: "a", ID: "1"}, "kafka%3Aprod:g:a:1"},
	{"percent in group", keying.Key{Bus: "b", Group: "50%", Alias: "a", ID: "1"}, "b:50%25:a:1"},
	{"literal escape in alias", keying.Key{Bus: "b", Group: "g", Alias: "%3A", ID: "1"}, "b:g:%253A:1"},
	{"only specials", keying.Key{Bus: ":", Group: "%", Alias: "::%%", ID: ":"}, "%3A:%25:%3A%3A%25%25::"},
	{"unicode", keying.Key{Bus: "bus-ñ", Group: "grüppe:ü", Alias: "日本:語", ID: "🙂"}, "bus-ñ:grüppe%3Aü:日本%3A語:🙂"},
	{"spaces and slashes", keying.Key{Bus: " ", Group: "a/b", Alias: "x y", ID: "../.."}, " :a/b:x y:../.."},
	{"id hashed form", keying.Key{Bus: "b", Group: "g", Alias: "a", ID: keying.HashID("x")}, "b:g:a:" + keying.HashID("x")},
	{"exactly MaxLen", keying.Key{Bus: "b", Group: "g", Alias: "a", ID: strings.Repeat("i", keying.MaxLen-6)},
		"b:g:a:" + strings.Repeat("i", keying.MaxLen-6)},
	{"exactly MaxLen escaped", keying.Key{Bus: ":", Group: "g", Alias: "a", ID: strings.Repeat("i", keying.MaxLen-8)},
		"%3A:g:a:" + strings.Repeat("i", keying.MaxLen-8)},
}

func TestKey_String(t *testing.T) {
	t.Parallel()
	for _, tc := range validKeys {
		if got := tc.key.String(); got != tc.s {
			t.Errorf("%s: String() = %q, want %q", tc.name, got, tc.s)
		}
	}
}

func TestKey_Validate_accepts(t *testing.T) {
	t.Parallel()
	for _, tc := range validKeys {
		if err := tc.key.Validate(); err != nil {
			t.Errorf("%s: Validate() = %v, want nil", tc.name, err)
		}
		if err := inbox.ValidateKey(tc.key.String()); err != nil {
			t.Errorf("%s: inbox.ValidateKey(String()) = %v, want nil", tc.name, err)
		}
	}
}

func TestParse_inverse_of_String(t *testing.T) {
	t.Parallel()
	for _, tc := range validKeys {
		got, err := keying.Parse(tc.s)
		if err != nil {
			t.Errorf("%s: Parse(%q) = %v", tc.name, tc.s, err)
			continue
		}
		if got != tc.key {
			t.Errorf("%s: Parse(%q) = %#v, want %#v", tc.name, tc.s, got, tc.key)
		}
	}
}

func TestKey_Validate_rejects(t *testing.T) {
	t.Parallel()
	ok := keying.Key{Bus: "b", Group: "g", Alias: "a", ID: "i"}
	with := func(f func(*keying.Key)) keying.Key { k := ok; f(&k); return k }
	tests := []struct {
		name string
		key  keying.Key
		want []string
	}{
		{"zero key", keying.Key{}, []string{"keying: bus segment is empty"}},
		{"empty bus", with(func(k *keying.Key) { k.Bus = "" }), []string{"keying: bus segment is empty"}},
		{"empty group", with(func(k *keying.Key) { k.Group = "" }), []string{"keying: group segment is empty"}},
		{"empty alias", with(func(k *keying.Key) { k.Alias = "" }), []string{"keying: alias segment is empty"}},
		{"empty id", with(func(k *keying.Key) { k.ID = "" }), []string{"keying: id segment is empty"}},
		{"bus not UTF-8", with(func(k *keying.Key) { k.Bus = "b\xff" }), []string{`keying: bus segment "b\xff" is not valid UTF-8`}},
		{"group not UTF-8", with(func(k *keying.Key) { k.Group = "\xc3" }), []string{`group segment "\xc3" is not valid UTF-8`}},
		{"alias not UTF-8", with(func(k *keying.Key) { k.Alias = "\xed\xa0\x80" }), []string{"alias segment", "not valid UTF-8"}},
		{"id not UTF-8", with(func(k *keying.Key) { k.ID = "x\x80" }), []string{`keying: id segment "x\x80" is not valid UTF-8`}},
		{"bus NUL", with(func(k *keying.Key) { k.Bus = "a\x00" }), []string{`keying: bus segment "a\x00" holds a NUL byte`}},
		{"group NUL", with(func(k *keying.Key) { k.Group = "\x00" }), []string{"group segment", "NUL"}},
		{"alias NUL", with(func(k *keying.Key) { k.Alias = "\x00a" }), []string{"alias segment", "NUL"}},
		{"id NUL", with(func(k *keying.Key) { k.ID = "1\x002" }), []string{"id segment", "NUL"}},
		{"long id quoted short", with(func(k *keying.Key) { k.ID = strings.Repeat("x", 500) + "\xff" }),
			[]string{"id segment", "... (501 bytes)", "not valid UTF-8"}},
		{"one byte over MaxLen", with(func(k *keying.Key) { k.ID = strings.Repeat("i", keying.MaxLen-5) }),
			[]string{"key is 1025 bytes, longer than the limit of 1024", "bus 1, group 1, alias 1, id 1019"}},
		{"over MaxLen once escaped", with(func(k *keying.Key) { k.Alias = ":"; k.ID = strings.Repeat("i", keying.MaxLen-7) }),
			[]string{"key is 1025 bytes", "alias 3"}},
	}
	for _, tc := range tests {
		err := tc.key.Validate()
		wantErr(t, err, invalidKey, tc.want...)
		// Whatever Validate rejects, Parse rejects in String form.
		if _, perr := keying.Parse(tc.key.String()); perr == nil {
			t.Errorf("%s: Parse(%q) accepted a key Validate rejects", tc.name, tc.key.String())
		}
	}
}

func TestParse_rejects(t *testing.T) {
	t.Parallel()
	long := "b:g:a:" + strings.Repeat("i", keying.MaxLen-5)
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"empty", "", []string{"keying: key is empty"}},
		{"no colon", "abc", []string{`key "abc" has 0 of the 3 colons a key needs`, "the group segment is missing"}},
		{"one colon", "a:b", []string{"has 1 of the 3 colons", "the alias segment is missing"}},
		{"two colons", "a:b:c", []string{"has 2 of the 3 colons", "the id segment is missing"}},
		{"empty bus", ":g:a:i", []string{"keying: bus segment is empty"}},
		{"empty group", "b::a:i", []string{"keying: group segment is empty"}},
		{"empty alias", "b:g::i", []string{"keying: alias segment is empty"}},
		{"empty id", "b:g:a:", []string{"keying: id segment is empty"}},
		{"all empty", ":::", []string{"keying: bus segment is empty"}},
		{"lower-case escape", "b%3a:g:a:i", []string{`bus segment "b%3a" has the escape "%3a" at byte 1`}},
		{"escape of a plain byte", "b:g%41:a:i", []string{`group segment "g%41" has the escape "%41" at byte 1`}},
		{"percent alone", "b:%:a:i", []string{`group segment "%" has the escape "%" at byte 0`}},
		{"lone percent", "b:g:a%:i", []string{`alias segment "a%" has the escape "%" at byte 1`}},
		{"short escape", "b:g:%2:i", []string{`alias segment "%2" has the escape "%2" at byte 0`}},
		{"bad escape after good one", "b:%25%3A%2f:a:i", []string{`group segment "%25%3A%2f" has the escape "%2f" at byte 6`}},
		{"escaped NUL", "b:%00:a:i", []string{`group segment "%00" has the escape "%00"`}},
		{"bus not UTF-8", "\xff:g:a:i", []string{`keying: bus segment "\xff" is not valid UTF-8`}},
		{"group not UTF-8", "b:\xc3:a:i", []string{"group segment", "not valid UTF-8"}},
		{"alias not UTF-8", "b:g:\x80:i", []string{"alias segment", "not valid UTF-8"}},
		{"id not UTF-8", "b:g:a:i\xfe", []string{`keying: id segment "i\xfe" is not valid UTF-8`}},
		{"id not UTF-8 after colon", "b:g:a:x:\xff", []string{"id segment", "not valid UTF-8"}},
		{"bus NUL", "\x00:g:a:i", []string{"bus segment", "holds a NUL byte"}},
		{"group NUL", "b:\x00:a:i", []string{"group segment", "holds a NUL byte"}},
		{"alias NUL", "b:g:a\x00:i", []string{"alias segment", "holds a NUL byte"}},
		{"id NUL", "b:g:a:\x00", []string{"id segment", "holds a NUL byte"}},
		{"one byte over MaxLen", long, []string{"key is 1025 bytes, longer than the limit of 1024", "id 1019"}},
	}
	for _, tc := range tests {
		k, err := keying.Parse(tc.in)
		wantErr(t, err, invalidKey, tc.want...)
		if k != (keying.Key{}) {
			t.Errorf("%s: Parse returned %#v with its error, want the zero Key", tc.name, k)
		}
	}
}

func TestHashID(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"":    "~sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		"abc": "~sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
	}
	for in, want := range tests {
		if got := keying.HashID(in); got != want {
			t.Errorf("HashID(%q) = %q, want %q", in, got, want)
		}
	}
	long := strings.Repeat("\xff\x00", 5000)
	sum := sha256.Sum256([]byte(long))
	got := keying.HashID(long)
	if want := keying.HashedIDPrefix + hex.EncodeToString(sum[:]); got != want {
		t.Errorf("HashID(long) = %q, want %q", got, want)
	}
	if got != keying.HashID(long) {
		t.Error("HashID is not deterministic")
	}
	if keying.HashID("a") == keying.HashID("b") {
		t.Error(`HashID("a") == HashID("b")`)
	}
}
