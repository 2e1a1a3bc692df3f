package sqlitedialect

import (
	"errors"
	"net/url"
	"testing"

	"github.com/watermill-inbox/inbox/stores"
)

func TestPath_forms(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"sqlite:rel/inbox.db":    "rel/inbox.db",
		"sqlite://rel/inbox.db":  "rel/inbox.db",
		"sqlite:///abs/inbox.db": "/abs/inbox.db",
		"sqlite::memory:":        ":memory:",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := path(u); err != nil || got != want {
			t.Errorf("path(%q) = %q, %v; want %q", raw, got, err, want)
		}
	}
	for _, raw := range []string{"sqlite://", "sqlite:///"} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := path(u); !errors.Is(err, stores.ErrInvalidURL) {
			t.Errorf("path(%q) = %q, %v; want an error wrapping stores.ErrInvalidURL", raw, got, err)
		}
	}
}
