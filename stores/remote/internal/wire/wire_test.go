package wire_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/watermill-inbox/inbox/stores/remote/internal/wire"
)

func TestEscapeKey(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]string{
		"abc-_~XYZ09": "abc-_~XYZ09",
		"..":          "%2E%2E",
		"a/b":         "a%2Fb",
		"%":           "%25",
		"?#":          "%3F%23",
		" +":          "%20%2B",
		"é":           "%C3%A9",
	} {
		if got := wire.EscapeKey(key); got != want {
			t.Errorf("EscapeKey(%q) = %q, want %q", key, got, want)
		}
	}
}

func FuzzEscapeKey_round_trip(f *testing.F) {
	for _, k := range []string{"", ".", "..", "a/../b", "%2e%2e", "%", "?q=1#f", "ключ", "\x00\xff", "//", "a b+c"} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		esc := wire.EscapeKey(key)
		for i := 0; i < len(esc); i++ {
			c := esc[i]
			if c == '.' || c == '/' || c == '?' || c == '#' || c >= 0x80 || c <= ' ' {
				t.Fatalf("EscapeKey(%q) = %q keeps byte %q", key, esc, c)
			}
		}
		got, ok, err := wire.KeyFromPath(wire.KeyPrefix + esc)
		if !ok || err != nil || got != key {
			t.Fatalf("KeyFromPath(EscapeKey(%q)) = %q, %v, %v", key, got, ok, err)
		}
		// The escaped path survives net/url unchanged, as the client sends it.
		u, err := url.Parse("http://h" + wire.KeyPrefix + esc)
		if err != nil || u.EscapedPath() != wire.KeyPrefix+esc {
			t.Fatalf("net/url alters %q: %v, %v", esc, u, err)
		}
	})
}

func FuzzDecode(f *testing.F) {
	for _, b := range []string{`{"key":"k","leaseSeconds":30,"leaseId":"x","owner":"o","payloadHash":"h"}`, `{"key":1}`,
		`{"leaseSeconds":1e400}`, `{"leaseSeconds":-0.0}`, `[]`, `null`, `{"key":"a"}x`, `{"leaseSeconds":"3"}`, `{"leaseId":null}`,
		`{"retryAfterMs":-1,"dead":true,"reason":"r"}`, `{"limit":1.5,"olderThanMs":"x","state":1}`, `{"acceptDead":"yes"}`} {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for name, decode := range map[string]func([]byte) error{
			"try-begin": func(b []byte) error { _, err := wire.DecodeTryBegin(b); return err },
			"lease":     func(b []byte) error { _, err := wire.DecodeLease(b); return err },
			"fail":      func(b []byte) error { _, err := wire.DecodeFail(b); return err },
			"list":      func(b []byte) error { _, err := wire.DecodeList(b); return err },
			"key":       func(b []byte) error { _, err := wire.DecodeKey(b); return err },
		} {
			err := decode(body)
			if err == nil {
				continue
			}
			de, ok := err.(*wire.DecodeError)
			if !ok || de.Message == "" || !strings.HasPrefix(de.Code, "invalid_") {
				t.Fatalf("%s: error %#v is not a DecodeError with an invalid_ code and a message", name, err)
			}
		}
	})
}
