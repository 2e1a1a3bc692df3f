package wire_test

import (
	"errors"
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

// A body whose text is not valid UTF-8 (raw bytes, or an escaped lone
// surrogate) is refused, not read with U+FFFD in place, which would make two
// different keys one record; so is an object naming a member twice.
// Surrogate pairs, escaped backslashes and U+FFFD itself are fine.
func TestDecode_refuses_invalid_unicode_and_duplicate_members(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		"{\"key\":\"a\xffb\"}",
		"{\"key\":\"a\xc3\"}",
		`{"key":"a\udc00b"}`,
		`{"key":"a\ud800b"}`,
		`{"key":"a\ud800\u0041"}`,
		`{"key":"a\uD800"}`,
		`{"owner":"\udfff","key":"k"}`,
		`{"key":"a","key":"b"}`,
		`{"key":"a","k\u0065y":"b"}`,
		`{"key":"a","x":1,"x":2}`,
	} {
		_, err := wire.DecodeTryBegin([]byte(body))
		var de *wire.DecodeError
		if !errors.As(err, &de) || de.Code != wire.CodeInvalidJSON {
			t.Errorf("DecodeTryBegin(%q) = %v, want an invalid_json DecodeError", body, err)
		}
	}
	for body, key := range map[string]string{
		`{"key":"a\ud83d\ude00b"}`:   "a\U0001F600b",
		`{"key":"a\\ud800"}`:         `a\ud800`,
		`{"key":"\ufffd"}`:           "\uFFFD",
		`{"key":"\\\"\ud83d\ude00"}`: "\\\"\U0001F600",
		`{"key":"k","KEY":"other"}`:  "k",
	} {
		r, err := wire.DecodeTryBegin([]byte(body))
		if err != nil || r.Key != key {
			t.Errorf("DecodeTryBegin(%q) = %q, %v; want key %q", body, r.Key, err, key)
		}
	}
}
