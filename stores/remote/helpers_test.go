package remote_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/memory"
	"github.com/watermill-inbox/inbox/stores/remote"
	"github.com/watermill-inbox/inbox/stores/remote/server"
)

// newMemory returns a memory store closed at the end of the test.
func newMemory(t testing.TB, retention time.Duration) *memory.Store {
	t.Helper()
	m, err := memory.New(memory.Options{Retention: retention})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// serve starts inboxd's handler for cfg on a loopback port (real HTTP) and
// returns its base URL. Tests get a one-second lease minimum unless cfg says
// otherwise.
func serve(t testing.TB, cfg server.Config) string {
	t.Helper()
	if cfg.LeaseMin == 0 {
		cfg.LeaseMin = time.Second
	}
	h, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return serveHandler(t, h)
}

func serveHandler(t testing.TB, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// newClient returns a remote store for base, closed at the end of the test.
func newClient(t testing.TB, opts remote.Options) *remote.Store {
	t.Helper()
	s, err := remote.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func ctxT(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustBegin(t testing.TB, s inbox.LeaseStore, key string, want inbox.Status) inbox.Claim {
	t.Helper()
	c, err := s.TryBegin(ctxT(t), key, inbox.BeginOptions{Lease: 30 * time.Second})
	if err != nil {
		t.Fatalf("TryBegin(%q): %v", key, err)
	}
	if c.Status != want {
		t.Fatalf("TryBegin(%q) = %v, want %v", key, c.Status, want)
	}
	return c
}
