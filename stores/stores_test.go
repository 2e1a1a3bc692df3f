package stores_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox/stores"
)

func TestURLMux_unknown_scheme_lists_known_ones(t *testing.T) {
	t.Parallel()
	var m stores.URLMux
	m.Register("mem", stores.OpenerFunc(func(context.Context, *url.URL, stores.Params) (stores.Store, error) { return nil, nil }))
	_, err := m.Open(context.Background(), "cassandra://u:secret@host/ks")
	if !errors.Is(err, stores.ErrUnknownScheme) || !strings.Contains(err.Error(), `"cassandra"`) || !strings.Contains(err.Error(), "mem") {
		t.Fatalf("error %v: want ErrUnknownScheme naming the scheme and listing mem", err)
	}
	if strings.Contains(err.Error(), "secret") {
		t.Fatalf("error leaks the password: %v", err)
	}
	if _, err := m.Open(context.Background(), "no-scheme-here"); !errors.Is(err, stores.ErrInvalidURL) {
		t.Fatalf("URL without scheme: %v", err)
	}
	for _, raw := range []string{"mem://u:p%zz@host", "mongodb://u:Xq7#Zk9@host:27017/db", "redis://u:Xq7/Zk9@host"} {
		_, err := m.Open(context.Background(), raw)
		if !errors.Is(err, stores.ErrInvalidURL) {
			t.Fatalf("unparsable URL %q: %v", raw, err)
		}
		for _, secret := range []string{"p%zz", "Xq7", "Zk9"} {
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("error for an unparsable URL quotes %q: %v", secret, err)
			}
		}
	}
}

func TestURLMux_shared_params_read_and_removed(t *testing.T) {
	t.Parallel()
	var m stores.URLMux
	var got stores.Params
	var rest *url.URL
	m.Register("mem", stores.OpenerFunc(func(_ context.Context, u *url.URL, p stores.Params) (stores.Store, error) {
		got, rest = p, u
		return nil, nil
	}))
	if _, err := m.Open(context.Background(), "MEM://x?retention=72h&lease=45s&table=t"); err != nil {
		t.Fatal(err)
	}
	if got.Retention != 72*time.Hour || got.Lease != 45*time.Second {
		t.Fatalf("params %+v", got)
	}
	if q := rest.Query(); q.Has("retention") || q.Has("lease") || q.Get("table") != "t" {
		t.Fatalf("driver sees query %v; want only table", q)
	}
	for _, bad := range []string{"mem://?retention=1", "mem://?lease=0s", "mem://?lease=1s&lease=2s", "mem://?retention=%zz"} {
		if _, err := m.Open(context.Background(), bad); !errors.Is(err, stores.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v, want ErrInvalidURL", bad, err)
		}
	}
}

func TestURLMux_register_twice_panics(t *testing.T) {
	t.Parallel()
	var m stores.URLMux
	o := stores.OpenerFunc(func(context.Context, *url.URL, stores.Params) (stores.Store, error) { return nil, nil })
	m.Register("x", o)
	defer func() {
		if recover() == nil {
			t.Fatal("second Register of a scheme did not panic")
		}
	}()
	m.Register("X", o)
}

func TestRejectUnknown_names_the_parameters(t *testing.T) {
	t.Parallel()
	err := stores.RejectUnknown("redis", url.Values{"prefx": {"a"}, "zzz": {"b"}}, "prefix")
	if !errors.Is(err, stores.ErrInvalidURL) || !strings.Contains(err.Error(), "prefx, zzz") || !strings.Contains(err.Error(), "prefix") {
		t.Fatalf("error %v: want both unknown names and the known list", err)
	}
	if err := stores.RejectUnknown("redis", url.Values{}); err != nil {
		t.Fatal(err)
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	u, _ := url.Parse("redis://user:hunter2@host:6379/0?token=abc&api_key=k&prefix=p")
	s := stores.Redact(u)
	for _, secret := range []string{"hunter2", "abc", "=k"} {
		if strings.Contains(s, secret) {
			t.Errorf("Redact kept %q: %s", secret, s)
		}
	}
	if !strings.Contains(s, "user") || !strings.Contains(s, "prefix=p") {
		t.Errorf("Redact dropped harmless parts: %s", s)
	}
}

func TestRedact_keepsTheURLForm(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"memory://",
		"memory://?retention=1h",
		"sqlite:///tmp/inbox.db?table=t",
		"postgres://host:5432/db",
		"redis://host/0",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := stores.Redact(u); got != raw {
			t.Errorf("Redact(%s) = %s", raw, got)
		}
	}
}
