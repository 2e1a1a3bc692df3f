package keying_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
)

// nastySegments seed the fuzzers: separators, escapes and their look-alikes,
// unicode, invalid UTF-8, NUL, empty.
var nastySegments = []string{
	"", "rabbit", ":", "::", "%", "%%", "%3A", "%3a", "%25", "%2525", "%253A", "a:b", "a%b", "%:", ":%",
	"urn:uuid:4b0c9a1e-4c3d-4f6a-9b1e-2d3c4b5a6f70", "日本:語", "🙂", "\xff", "\xc3", "\x00", "a\x00b",
	keying.HashedIDPrefix, keying.HashID("x"), " ", "%41", "%", "%G0",
}

func FuzzKeyRoundTrip(f *testing.F) {
	for i, s := range nastySegments {
		n := len(nastySegments)
		f.Add(s, nastySegments[(i+1)%n], nastySegments[(i+2)%n], nastySegments[(i+3)%n])
		f.Add("b", "g", s, s)
	}
	f.Add("b", "g", "a", strings.Repeat("i", keying.MaxLen-6))
	f.Add("b", "g", ":", strings.Repeat("i", keying.MaxLen-7))
	f.Fuzz(func(t *testing.T, bus, group, alias, id string) {
		k := keying.Key{Bus: bus, Group: group, Alias: alias, ID: id}
		s := k.String()
		err := k.Validate()
		got, perr := keying.Parse(s)
		if err != nil {
			if !errors.Is(err, inbox.ErrInvalidKey) {
				t.Fatalf("Validate(%#v) = %v, not wrapping ErrInvalidKey", k, err)
			}
			if perr == nil {
				t.Fatalf("Validate rejects %#v (%v) but Parse(%q) accepts it", k, err, s)
			}
			return
		}
		if perr != nil {
			t.Fatalf("Parse(String(%#v)) = %q: %v", k, s, perr)
		}
		if got != k {
			t.Fatalf("Parse(String(%#v)) = %#v", k, got)
		}
		if err := inbox.ValidateKey(s); err != nil {
			t.Fatalf("valid key %#v gives %q, which inbox.ValidateKey rejects: %v", k, s, err)
		}
		if !strings.HasSuffix(s, ":"+id) || strings.Count(s[:len(s)-len(id)], ":") != 3 {
			t.Fatalf("String(%#v) = %q: id not verbatim after the third colon", k, s)
		}
	})
}

func FuzzParse(f *testing.F) {
	for _, s := range nastySegments {
		f.Add(s)
		f.Add("b:g:a:" + s)
		f.Add(s + ":g:a:i")
		f.Add("b:" + s + ":" + s + ":" + s)
	}
	f.Add("rabbit:orders:OrderPlaced:urn:uuid:4b0c9a1e-4c3d-4f6a-9b1e-2d3c4b5a6f70")
	f.Add("%3A%25:%253A:%3a:x")
	f.Add(":::")
	f.Add("b:g:a:" + strings.Repeat("i", keying.MaxLen-6))
	f.Add("b:g:a:" + strings.Repeat("i", keying.MaxLen-5))
	f.Fuzz(func(t *testing.T, s string) {
		k, err := keying.Parse(s)
		if err != nil {
			if !errors.Is(err, inbox.ErrInvalidKey) {
				t.Fatalf("Parse(%q) = %v, not wrapping ErrInvalidKey", s, err)
			}
			if k != (keying.Key{}) {
				t.Fatalf("Parse(%q) returned %#v with an error", s, k)
			}
			return
		}
		if got := k.String(); got != s {
			t.Fatalf("Parse(%q) = %#v, which prints as %q", s, k, got)
		}
		if err := k.Validate(); err != nil {
			t.Fatalf("Parse(%q) = %#v, which Validate rejects: %v", s, k, err)
		}
		if err := inbox.ValidateKey(s); err != nil {
			t.Fatalf("Parse accepted %q, which inbox.ValidateKey rejects: %v", s, err)
		}
	})
}

func FuzzDistinct(f *testing.F) {
	f.Add("a:b", "c", "d", "e", "a", "b:c", "d", "e")
	f.Add("a", "b", "c", "d:e", "a", "b", "c:d", "e")
	f.Add("a%3Ab", "g", "a", "i", "a:b", "g", "a", "i")
	f.Add("%", "g", "a", "i", "%25", "g", "a", "i")
	f.Add("b", "g", "a", "i", "b", "g", "a", "i")
	f.Add("b", "g", "a:", "i", "b", "g", "a", ":i")
	f.Add("b", "g", "a%", "3Ai", "b", "g", "a", "%3Ai")
	for i, s := range nastySegments {
		t := nastySegments[(i+1)%len(nastySegments)]
		f.Add(s, t, "a", "i", t, s, "a", "i")
	}
	f.Fuzz(func(t *testing.T, b1, g1, a1, i1, b2, g2, a2, i2 string) {
		k1 := keying.Key{Bus: b1, Group: g1, Alias: a1, ID: i1}
		k2 := keying.Key{Bus: b2, Group: g2, Alias: a2, ID: i2}
		if k1.Validate() != nil || k2.Validate() != nil {
			return
		}
		if (k1 == k2) != (k1.String() == k2.String()) {
			t.Fatalf("%#v and %#v: String() = %q and %q", k1, k2, k1.String(), k2.String())
		}
	})
}

// FuzzBuilderKey checks Builder.Key on arbitrary configuration and ids: it
// either fails with an inbox sentinel or returns a valid key whose id is the
// raw id exactly when the raw id fits and is usable, its hash otherwise.
func FuzzBuilderKey(f *testing.F) {
	for _, s := range nastySegments {
		f.Add("b", "g", "a", s)
		f.Add(s, s, s, "id")
	}
	f.Add("b", "g", "a", strings.Repeat("i", keying.MaxLen-6))
	f.Add("b", "g", "a", strings.Repeat("i", keying.MaxLen-5))
	f.Add("b", "g", strings.Repeat(":", 315), "id")
	f.Fuzz(func(t *testing.T, bus, group, alias, id string) {
		b := &keying.Builder{Bus: bus, Group: group, Alias: keying.StaticAlias(alias)}
		msg := message.NewMessage("uuid", nil)
		msg.Metadata.Set(keying.DefaultIDMetadataKey, id)

		// The expected outcome, computed independently.
		wantSource := "metadata:IdempotencyKey"
		if id == "" {
			wantSource, id = "uuid", "uuid"
		}
		fixed := len(keying.Key{Bus: bus, Group: group, Alias: alias}.String()) // three colons, escaped segments
		wantID := id
		if !segmentOK(id) || strings.HasPrefix(id, keying.HashedIDPrefix) || fixed+len(id) > keying.MaxLen {
			wantID = keying.HashID(id)
		}
		wantOK := segmentOK(bus) && segmentOK(group) && segmentOK(alias) && fixed+len(wantID) <= keying.MaxLen

		k, source, err := b.Key(msg)
		if err != nil {
			if wantOK {
				t.Fatalf("Key failed: %v; want ID %q", err, wantID)
			}
			if !errors.Is(err, inbox.ErrInvalidArgument) {
				t.Fatalf("Key: %v does not wrap ErrInvalidArgument", err)
			}
			return
		}
		if !wantOK {
			t.Fatalf("Key = %#v, want an error", k)
		}
		want := keying.Key{Bus: bus, Group: group, Alias: alias, ID: wantID}
		if k != want || source != wantSource {
			t.Fatalf("Key = %#v from %q, want %#v from %q", k, source, want, wantSource)
		}
		if err := k.Validate(); err != nil {
			t.Fatalf("Key returned %#v, which Validate rejects: %v", k, err)
		}
		s, _, err := b.KeyString(msg)
		if err != nil || s != k.String() {
			t.Fatalf("KeyString = %q, %v; Key gave %q", s, err, k.String())
		}
		if p, err := keying.Parse(s); err != nil || p != k {
			t.Fatalf("Parse(%q) = %#v, %v", s, p, err)
		}
		// Builder.Validate accepts exactly the builders that leave room for a
		// one-byte alias and a hashed id.
		roomy := len(keying.Key{Bus: bus, Group: group, Alias: "a"}.String())+len(keying.HashID("")) <= keying.MaxLen
		if err := b.Validate(); (err == nil) != roomy {
			t.Fatalf("Validate() = %v for bus of %d bytes and group of %d bytes", err, len(bus), len(group))
		}
	})
}

// FuzzPreparedKey checks that Builder.Prepare fails exactly when
// Builder.Validate does, and that a Prepared gives what its Builder gives:
// the same key, source and error.
func FuzzPreparedKey(f *testing.F) {
	for _, s := range nastySegments {
		f.Add("b", "g", "a", s)
		f.Add(s, s, s, "id")
	}
	f.Add("b", "g", "a", strings.Repeat("i", keying.MaxLen-6))
	f.Add(strings.Repeat("b", 900), strings.Repeat(":", 16), "a", strings.Repeat("i", 2000))
	f.Add("b", "g", strings.Repeat(":", 315), "id")
	f.Fuzz(func(t *testing.T, bus, group, alias, id string) {
		b := &keying.Builder{Bus: bus, Group: group, Alias: keying.StaticAlias(alias)}
		p, err := b.Prepare()
		if verr := b.Validate(); verr != nil || err != nil {
			if verr == nil || err == nil || err.Error() != verr.Error() || p != nil {
				t.Fatalf("Prepare() = %v, %v; Validate() = %v", p, err, verr)
			}
			return
		}
		msg := message.NewMessage("uuid", nil)
		msg.Metadata.Set(keying.DefaultIDMetadataKey, id)
		bk, bsource, berr := b.Key(msg)
		pk, psource, perr := p.Key(msg)
		if pk != bk || psource != bsource || errString(perr) != errString(berr) {
			t.Fatalf("Prepared.Key = %#v, %q, %v; Builder.Key = %#v, %q, %v", pk, psource, perr, bk, bsource, berr)
		}
		bs, bsource, berr := b.KeyString(msg)
		ps, psource, perr := p.KeyString(msg)
		if ps != bs || psource != bsource || errString(perr) != errString(berr) {
			t.Fatalf("Prepared.KeyString = %q, %q, %v; Builder.KeyString = %q, %q, %v", ps, psource, perr, bs, bsource, berr)
		}
	})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func segmentOK(s string) bool {
	return s != "" && utf8.ValidString(s) && !strings.Contains(s, "\x00")
}
