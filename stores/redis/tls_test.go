package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
	"github.com/watermill-inbox/inbox/stores/redis/internal/redistest"
	"github.com/watermill-inbox/inbox/stores/storetest"
)

// TestConformance_tls runs the suite over TLS, against a private
// redis-server that serves TLS only, with a client that verifies its
// certificate.
func TestConformance_tls(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{TLS: true})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), TLSConfig: srv.TLSConfig()})
	t.Cleanup(func() { _ = c.Close() })
	storetest.Run(t, withFaults(t, harness(t, c), c, func() *redis.Options {
		return &redis.Options{TLSConfig: srv.TLSConfig()}
	}))
}

// TestOpenURL_rediss opens the store with a rediss:// URL: certificates are
// verified unless the URL says skip_verify=true (go-redis's parameter), and
// a plain redis:// URL does not reach a TLS-only server. The first two open
// with check=false, so that the calls meet the mistakes (Open's check finds
// them first: TestOpenURL_tls_mistakes).
func TestOpenURL_rediss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.Start(t, redistest.Config{TLS: true})

	// The server's certificate is self-signed: a verifying client refuses it.
	s, err := stores.Open(ctx, "rediss://"+srv.Addr()+"/0?check=false&timeout=2s&max_retries=-1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.TryBegin(ctx, "tls:k", inbox.BeginOptions{})
	if !errors.Is(err, inbox.ErrStoreUnavailable) || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("TryBegin over rediss:// with an untrusted certificate: %v; want ErrStoreUnavailable naming the certificate", err)
	}
	_ = s.Close()

	// Plain TCP to the TLS port gets no answer the store accepts.
	plain, err := stores.Open(ctx, "redis://"+srv.Addr()+"/0?check=false&timeout=1s&max_retries=-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.TryBegin(ctx, "tls:k", inbox.BeginOptions{}); !errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Fatalf("TryBegin over redis:// to a TLS port: %v; want ErrStoreUnavailable", err)
	}
	_ = plain.Close()

	// With verification off, the store works over TLS.
	s, err = stores.Open(ctx, "rediss://"+srv.Addr()+"/0?timeout=2s&skip_verify=true")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := s.TryBegin(ctx, "tls:k", inbox.BeginOptions{})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin over rediss://: %+v, %v", c, err)
	}
	if err := s.Complete(ctx, "tls:k", c.LeaseID); err != nil {
		t.Fatalf("Complete over rediss://: %v", err)
	}
	if done, err := s.IsProcessed(ctx, "tls:k"); err != nil || !done {
		t.Fatalf("IsProcessed over rediss://: %v, %v", done, err)
	}
}
