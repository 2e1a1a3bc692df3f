package sqlstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
)

// txBackends are the databases of the transactional claim's tests. The
// transactional mode's behaviour (duplicates waiting, crashes, the outbox,
// the middleware) is tested in package txinbox.
var txBackends = []backend{backends[0], backends[1], backends[3]}

var txOpts = sqlstore.TxClaimOptions{Owner: "tester", LockTimeout: 5 * time.Second}

func TestBeginTxClaim_commit_marks_rollback_does_not(t *testing.T) {
	for _, b := range txBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			s := newStore(t, b, db, newTable(t, db, b.dialect), sqlstore.Options{Retention: time.Hour})
			ctx := ctxT(t)
			const key = "bus:group:alias:tx-1"

			tx, end, processed, err := s.BeginTxClaim(ctx, key, txOpts)
			if err != nil || processed || tx == nil || end == nil {
				t.Fatalf("claim of a new key: %v, %v, %v, %v", tx, end != nil, processed, err)
			}
			if err := end(false); err != nil {
				t.Fatalf("end(false): %v", err)
			}
			if r, err := s.Get(ctx, key); err != nil || r.State != inbox.StateNotFound {
				t.Fatalf("after a rollback: %+v, %v; want NotFound", r, err)
			}

			tx, end, processed, err = s.BeginTxClaim(ctx, key, txOpts)
			if err != nil || processed || tx == nil {
				t.Fatalf("claim after the rollback: %v, %v", processed, err)
			}
			if err := end(true); err != nil {
				t.Fatalf("end(true): %v", err)
			}
			r, err := s.Get(ctx, key)
			if err != nil || r.State != inbox.StateProcessed || r.Owner != "tester" || r.Attempts != 1 {
				t.Fatalf("after the commit: %+v, %v; want Processed, owner tester, 1 attempt", r, err)
			}
			tx, end, processed, err = s.BeginTxClaim(ctx, key, txOpts)
			if err != nil || !processed || tx != nil || end != nil {
				t.Fatalf("claim of a processed key: %v, %v, %v, %v; want processed, no tx", tx, end != nil, processed, err)
			}
		})
	}
}

func TestBeginTxClaim_expired_processed_row_is_claimed_afresh(t *testing.T) {
	for _, b := range txBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			s := newStore(t, b, db, newTable(t, db, b.dialect), sqlstore.Options{Retention: 50 * time.Millisecond})
			ctx := ctxT(t)
			const key = "bus:group:alias:tx-expiring"
			_, end, _, err := s.BeginTxClaim(ctx, key, txOpts)
			if err != nil {
				t.Fatal(err)
			}
			if err := end(true); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond) // past the retention
			_, end, processed, err := s.BeginTxClaim(ctx, key, txOpts)
			if err != nil || processed {
				t.Fatalf("claim after the retention: processed %v, %v; want a new claim", processed, err)
			}
			if err := end(true); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestBeginTxClaim_bad_input_and_closed(t *testing.T) {
	t.Parallel()
	b := backends[3] // SQLite: no server needed
	db := b.open(t)
	s := newStore(t, b, db, newTable(t, db, b.dialect), sqlstore.Options{})
	ctx := ctxT(t)
	for name, c := range map[string]struct {
		key  string
		opts sqlstore.TxClaimOptions
		want string
	}{
		"long key":        {strings.Repeat("k", 1025), txOpts, "key"},
		"no lock timeout": {"k", sqlstore.TxClaimOptions{}, "LockTimeout 0s"},
		"bad owner":       {"k", sqlstore.TxClaimOptions{Owner: "a\x00b", LockTimeout: time.Second}, "owner"},
	} {
		if _, _, _, err := s.BeginTxClaim(ctx, c.key, c.opts); !errors.Is(err, inbox.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalidArgument naming %q", name, err, c.want)
		}
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, _, err := s.BeginTxClaim(canceled, "k", txOpts); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled context: %v", err)
	}
	_ = s.Close()
	if _, _, _, err := s.BeginTxClaim(ctx, "k", txOpts); !errors.Is(err, inbox.ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}

// A key of the lease store that a failed attempt left in a backoff, or
// marked dead, is busy for the transactional mode, as a live lease is; an
// ended backoff is claimed afresh.
func TestBeginTxClaim_backoff_and_dead_keys_are_busy(t *testing.T) {
	for _, b := range txBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			s := newStore(t, b, db, newTable(t, db, b.dialect), sqlstore.Options{Retention: time.Hour})
			ctx := ctxT(t)
			fail := func(key string, opts inbox.FailOptions) {
				t.Helper()
				c, err := s.TryBegin(ctx, key, inbox.BeginOptions{})
				if err == nil {
					err = s.Fail(ctx, key, c.LeaseID, opts)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			fail("tx:backoff", inbox.FailOptions{RetryAfter: time.Hour})
			fail("tx:dead", inbox.FailOptions{Dead: true, Reason: "poison"})
			fail("tx:ended", inbox.FailOptions{RetryAfter: time.Millisecond})
			for _, key := range []string{"tx:backoff", "tx:dead"} {
				_, _, processed, err := s.BeginTxClaim(ctx, key, txOpts)
				var busy *inbox.BusyError
				if !errors.As(err, &busy) || processed || busy.RetryAfter < 59*time.Minute {
					t.Fatalf("BeginTxClaim(%s) = %v, %v; want an *inbox.BusyError of about an hour", key, processed, err)
				}
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				_, end, processed, err := s.BeginTxClaim(ctx, "tx:ended", txOpts)
				if err == nil && !processed {
					if err := end(true); err != nil {
						t.Fatal(err)
					}
					break
				}
				if !errors.Is(err, inbox.ErrBusy) || time.Now().After(deadline) {
					t.Fatalf("BeginTxClaim after the backoff = %v, %v; want a claim", processed, err)
				}
				time.Sleep(5 * time.Millisecond) // polling interval
			}
			if r, err := s.Get(ctx, "tx:dead"); err != nil || r.State != inbox.StateDead || r.Reason != "poison" {
				t.Fatalf("the dead key after BeginTxClaim: %+v, %v", r, err)
			}
		})
	}
}
