package stores_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
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

// A scheme of a driver this project ships, whose package the program does
// not import, is answered with the import that registers it.
func TestURLMux_unknown_scheme_of_a_shipped_driver_names_its_package(t *testing.T) {
	t.Parallel()
	var m stores.URLMux
	_, err := m.Open(context.Background(), "postgres://app@db:5432/app")
	if !errors.Is(err, stores.ErrUnknownScheme) || !strings.Contains(err.Error(), `import _ "github.com/watermill-inbox/inbox/stores/sql/postgres"`) {
		t.Fatalf("error %v: want ErrUnknownScheme naming the import of stores/sql/postgres", err)
	}
}

func TestURLMux_shared_params_read_and_removed(t *testing.T) {
	t.Parallel()
	m, rec := recordingMux()
	if _, err := m.Open(context.Background(), "MEM://x?retention=72h&lease=45s&table=t"); err != nil {
		t.Fatal(err)
	}
	if got := rec.Params; got.Retention != 72*time.Hour || got.Lease != 45*time.Second {
		t.Fatalf("params %+v", got)
	}
	if q := rec.URL.Query(); q.Has("retention") || q.Has("lease") || q.Get("table") != "t" {
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

func TestPopDuration_days(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{
		"7d":        7 * 24 * time.Hour,
		"1d12h":     36 * time.Hour,
		"1d12h30m":  36*time.Hour + 30*time.Minute,
		"0d1s":      time.Second,
		"30d":       30 * 24 * time.Hour,
		"007d":      7 * 24 * time.Hour,
		"1d0.5h":    24*time.Hour + 30*time.Minute,
		"168h":      168 * time.Hour,
		"30s":       30 * time.Second,
		"1.5h":      90 * time.Minute,
		"106751d":   106751 * 24 * time.Hour,
		"106751d1h": 106751*24*time.Hour + time.Hour,
	} {
		q := url.Values{"retention": {in}}
		got, err := stores.PopDuration(q, "retention")
		if err != nil || got != want {
			t.Errorf("PopDuration(retention=%s) = %s, %v; want %s", in, got, err, want)
		}
		if q.Has("retention") {
			t.Errorf("PopDuration(retention=%s) left the parameter in the query", in)
		}
	}
	if d, err := stores.PopDuration(url.Values{}, "retention"); d != 0 || err != nil {
		t.Errorf("absent parameter: %s, %v; want 0, nil", d, err)
	}
}

func TestPopDuration_bad_forms_name_the_parameter_and_value(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		"7dd", "d", "-1d", "+1d", "1.5d", "d1h", "1h2d", "1d-1h", "1d+1h", "1d2d", "7 d", "7D", "1w",
		"0d", "0d0s", "7", "", "abc", "-1h", "0",
		"106752d",                 // past math.MaxInt64 nanoseconds
		"106751d24h",              // likewise, through the rest
		"99999999999999999999d",   // past int64
		"9223372036854775807d",    // int64, but its days overflow
		"1d9223372036854775807ns", // the sum overflows
	} {
		_, err := stores.PopDuration(url.Values{"retention": {in}}, "retention")
		if !errors.Is(err, stores.ErrInvalidURL) {
			t.Errorf("PopDuration(retention=%q) = %v; want ErrInvalidURL", in, err)
			continue
		}
		if !strings.Contains(err.Error(), "retention") || !strings.Contains(err.Error(), `"`+in+`"`) {
			t.Errorf("PopDuration(retention=%q): error %q names neither the parameter nor the value", in, err)
		}
	}
}

func TestURLMux_check_parameter(t *testing.T) {
	t.Parallel()
	m, rec := recordingMux()
	for raw, lazy := range map[string]bool{
		"mem://x":                          false,
		"mem://x?check=true":               false,
		"mem://x?check=false":              true,
		"mem://x?check=0&t=1":              true,
		"mem://x?retention=7d&check=false": true,
	} {
		*rec = opened{}
		if _, err := m.Open(context.Background(), raw); err != nil {
			t.Fatalf("Open(%s): %v", raw, err)
		}
		got, rest := rec.Params, rec.URL
		if got.Lazy != lazy {
			t.Errorf("Open(%s): Params.Lazy = %v, want %v", raw, got.Lazy, lazy)
		}
		if rest.Query().Has("check") {
			t.Errorf("Open(%s): the driver sees check in %s", raw, rest.RawQuery)
		}
		if strings.Contains(raw, "retention=7d") && got.Retention != 7*24*time.Hour {
			t.Errorf("Open(%s): retention=7d read as %s", raw, got.Retention)
		}
	}
	for _, bad := range []string{"mem://?check=maybe", "mem://?check=", "mem://?check=true&check=false"} {
		_, err := m.Open(context.Background(), bad)
		if !errors.Is(err, stores.ErrInvalidURL) || !strings.Contains(err.Error(), "check") {
			t.Errorf("Open(%q) = %v; want ErrInvalidURL naming check", bad, err)
		}
	}
	if err := stores.RejectUnknown("mem", url.Values{"chek": {"false"}}); err == nil || !strings.Contains(err.Error(), "check") {
		t.Errorf("RejectUnknown does not list check among the known parameters: %v", err)
	}
}

func TestMisconfigured_wraps_both_sentinels_and_the_cause(t *testing.T) {
	t.Parallel()
	cause := &url.Error{Op: "dial", URL: "x", Err: errors.New("refused")}
	err := stores.Misconfigured("redis store: authentication failed: check the password", cause)
	if !errors.Is(err, stores.ErrMisconfigured) || !errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Fatalf("%v wraps not both ErrMisconfigured and inbox.ErrStoreUnavailable", err)
	}
	var ue *url.Error
	if !errors.As(err, &ue) || ue != cause {
		t.Fatalf("%v does not keep its cause for errors.As", err)
	}
	if want := "redis store: authentication failed: check the password (" + cause.Error() + ")"; err.Error() != want {
		t.Fatalf("text %q, want %q", err, want)
	}
	if err := stores.Misconfigured("no table", nil); err.Error() != "no table" || !errors.Is(err, stores.ErrMisconfigured) {
		t.Fatalf("without a cause: %v", err)
	}
	if errors.Unwrap(stores.ErrMisconfigured) != nil {
		t.Fatal("ErrMisconfigured wraps another error")
	}
}

// opened is what the opener of a recordingMux received.
type opened struct {
	Params stores.Params
	URL    *url.URL
}

// recordingMux is a mux whose scheme mem records in the returned opened the
// parameters and the URL its opener receives, and opens nothing.
func recordingMux() (*stores.URLMux, *opened) {
	m, rec := &stores.URLMux{}, &opened{}
	m.Register("mem", stores.OpenerFunc(func(_ context.Context, u *url.URL, p stores.Params) (stores.Store, error) {
		rec.Params, rec.URL = p, u
		return nil, nil
	}))
	return m, rec
}
