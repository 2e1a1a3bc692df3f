package ferrettest_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
	_ "github.com/watermill-inbox/inbox/stores/mongo"
)

// TestFerretDB_open_url_shared_parameters is the mongodb:// case of
// stores/opentest (whose module cannot embed FerretDB): a store opened with
// lease=3s and retention=2s grants 3 s leases and forgets a completed key
// once 2 s have passed, not after the 7-day default.
func TestFerretDB_open_url_shared_parameters(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := openFerret(ctx, t, "lease=3s&retention=2s&collection=shared_params")

	c, err := s.TryBegin(ctx, "k", inbox.BeginOptions{})
	if err != nil || c.Status != inbox.Acquired || c.Lease != 3*time.Second {
		t.Fatalf("TryBegin = %+v, %v; want Acquired with the URL's 3s lease", c, err)
	}
	busy, err := s.TryBegin(ctx, "k", inbox.BeginOptions{})
	if err != nil || busy.Status != inbox.Busy || busy.RetryAfter <= 0 || busy.RetryAfter > 3*time.Second {
		t.Errorf("second TryBegin = %+v, %v; want Busy with RetryAfter in (0, 3s]", busy, err)
	}
	completed := time.Now()
	if err := s.Complete(ctx, "k", c.LeaseID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		rec, err := s.Get(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != inbox.StateProcessed {
			if waited := time.Since(completed); waited < time.Second {
				t.Errorf("the processed key expired after %s, before the URL's 2s retention", waited)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("key still processed 30s after Complete: retention=2s was ignored")
		}
		time.Sleep(50 * time.Millisecond)
	}
	fresh, err := s.TryBegin(ctx, "k", inbox.BeginOptions{})
	if err != nil || fresh.Status != inbox.Acquired {
		t.Fatalf("TryBegin after the retention = %+v, %v; want Acquired", fresh, err)
	}
	if rec, err := s.Get(ctx, "k"); err != nil || rec.Attempts != 1 {
		t.Errorf("Get after the retention = %+v, %v; want a fresh record with 1 attempt", rec, err)
	}
}

// TestFerretDB_open_url_check_false: a store opened with check=false sends
// nothing at Open and reads the server's clock at its first call; it then
// works as one opened with the check. retention takes days.
func TestFerretDB_open_url_check_false(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := openFerret(ctx, t, "check=false&lease=3s&retention=1d12h&collection=check_false")
	c, err := s.TryBegin(ctx, "k", inbox.BeginOptions{})
	if err != nil || c.Status != inbox.Acquired || c.Lease != 3*time.Second {
		t.Fatalf("TryBegin = %+v, %v; want Acquired with the URL's 3s lease", c, err)
	}
	if until := time.Until(c.ExpiresAt); until <= 0 || until > 4*time.Second {
		t.Fatalf("the lease ends in %s: the server's clock was not read before the first claim", until)
	}
	if err := s.Complete(ctx, "k", c.LeaseID); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, "k"); err != nil || rec.State != inbox.StateProcessed {
		t.Fatalf("Get after Complete = %+v, %v", rec, err)
	}
}

// openFerret opens a store by URL on a new FerretDB, database opentest,
// with query as the URL's parameters; it is closed when the test ends.
func openFerret(ctx context.Context, t *testing.T, query string) stores.Store {
	t.Helper()
	u, err := url.Parse(startFerretDB(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path, u.RawQuery = "/opentest", query
	s, err := stores.Open(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}
