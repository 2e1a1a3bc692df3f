package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
)

// insertProcessed bulk-inserts processed records for keys whose row expires
// at expiresAt, in multi-row statements of 500 rows.
func insertProcessed(t testing.TB, db *sql.DB, d sqlstore.Dialect, table string, keys []string, expiresAt time.Time) {
	t.Helper()
	seen := expiresAt.Add(-time.Hour)
	val := func(tm time.Time) any {
		if d == sqlstore.SQLite {
			return tm.UnixMicro()
		}
		return tm.UTC()
	}
	for len(keys) > 0 {
		chunk := keys[:min(500, len(keys))]
		keys = keys[len(chunk):]
		var sb strings.Builder
		sb.WriteString("INSERT INTO " + table + " (msg_key, state, lease, owner, lease_until, attempts, first_seen, last_seen, payload_hash, expires_at) VALUES ")
		args := make([]any, 0, 5*len(chunk))
		for i, k := range chunk {
			if i > 0 {
				sb.WriteString(", ")
			}
			ph := func() string {
				args = append(args, nil)
				if d == sqlstore.Postgres {
					return fmt.Sprintf("$%d", len(args))
				}
				return "?"
			}
			p1, p2, p3, p4 := ph(), ph(), ph(), ph()
			args[len(args)-4], args[len(args)-3], args[len(args)-2], args[len(args)-1] = k, val(seen), val(seen), val(expiresAt)
			fmt.Fprintf(&sb, "(%s, 1, NULL, NULL, NULL, 1, %s, %s, NULL, %s)", p1, p2, p3, p4)
		}
		if _, err := db.ExecContext(ctxT(t), sb.String(), args...); err != nil {
			t.Fatalf("bulk insert: %v", err)
		}
	}
}

func countRows(t testing.TB, db *sql.DB, table, where string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(ctxT(t), "SELECT COUNT(*) FROM "+table+" WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func keysWithPrefix(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s%06d", prefix, i)
	}
	return keys
}

// 10,000 expired records are removed in bounded batches while other keys are
// claimed and completed; live records stay.
func TestCleanup_expired_records_in_batches_while_claiming(t *testing.T) {
	for _, b := range []backend{backends[0], backends[1], backends[3]} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			if b.dialect != sqlstore.SQLite {
				db.SetMaxOpenConns(8)
			}
			table := newTable(t, db, b.dialect)
			const expired, live, batch = 10_000, 1_000, 100
			insertProcessed(t, db, b.dialect, table, keysWithPrefix("expired:", expired), time.Now().Add(-time.Hour))
			insertProcessed(t, db, b.dialect, table, keysWithPrefix("live:", live), time.Now().Add(time.Hour))

			s := newStore(t, b, db, table, sqlstore.Options{CleanupBatch: batch, DisableCleanup: true})
			var (
				mu      sync.Mutex
				batches []int64
			)
			if n, err := s.Backlog(ctxT(t)); err != nil || n != expired {
				t.Fatalf("Backlog before Cleanup = %d, %v; want the %d expired rows", n, err, expired)
			}
			sqlstore.OnCleanupBatch(s, func(n int64) {
				mu.Lock()
				batches = append(batches, n)
				mu.Unlock()
			})

			// Claimers run until cleanup is done, and at least 20 claims each.
			ctx, cancel := context.WithCancel(ctxT(t))
			defer cancel()
			var (
				wg      sync.WaitGroup
				claims  atomic.Int64
				claimMu sync.Mutex
				failure error
			)
			for w := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ctx.Err() == nil || i < 20; i++ {
						key := fmt.Sprintf("claim:%d:%d", w, i)
						c, err := s.TryBegin(context.Background(), key, inbox.BeginOptions{})
						if err == nil && c.Status != inbox.Acquired {
							err = fmt.Errorf("TryBegin(%s) = %v, want Acquired", key, c.Status)
						}
						if err == nil {
							err = s.Complete(context.Background(), key, c.LeaseID)
						}
						if err != nil {
							claimMu.Lock()
							failure = errors.Join(failure, err)
							claimMu.Unlock()
							return
						}
						claims.Add(1)
					}
				}()
			}
			n, err := s.Cleanup(ctxT(t))
			cancel()
			wg.Wait()
			if err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			if failure != nil {
				t.Fatalf("claims failed during cleanup: %v", failure)
			}
			if n != expired {
				t.Fatalf("Cleanup deleted %d rows, want %d", n, expired)
			}
			if len(batches) < expired/batch {
				t.Fatalf("Cleanup ran %d statements, want at least %d of at most %d rows", len(batches), expired/batch, batch)
			}
			for i, got := range batches {
				if got > batch {
					t.Fatalf("cleanup statement %d deleted %d rows, above the batch size %d", i, got, batch)
				}
			}
			if n, err := s.Backlog(ctxT(t)); err != nil || n != 0 {
				t.Fatalf("Backlog after Cleanup = %d, %v; want 0", n, err)
			}
			if st := s.CleanupStats(); st.Deleted != expired {
				t.Fatalf("CleanupStats().Deleted = %d, want %d", st.Deleted, expired)
			}
			if c := countRows(t, db, table, "msg_key LIKE 'expired:%'"); c != 0 {
				t.Fatalf("%d expired rows left after Cleanup", c)
			}
			if c := countRows(t, db, table, "msg_key LIKE 'live:%'"); c != live {
				t.Fatalf("%d live rows after Cleanup, want %d untouched", c, live)
			}
			if c := countRows(t, db, table, "msg_key LIKE 'claim:%'"); int64(c) != claims.Load() {
				t.Fatalf("%d claimed rows after Cleanup, want the %d claims made", c, claims.Load())
			}
			ok, err := s.IsProcessed(ctxT(t), "live:000000")
			if err != nil || !ok {
				t.Fatalf("IsProcessed of a live record after Cleanup = %v, %v", ok, err)
			}
			t.Logf("%s: %d rows deleted in %d statements while %d claims completed", b.name, n, len(batches), claims.Load())
		})
	}
}

func TestCleanup_janitor_removes_expired_and_stops_on_close(t *testing.T) {
	for _, b := range []backend{backends[0], backends[1], backends[3]} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			table := newTable(t, db, b.dialect)
			insertProcessed(t, db, b.dialect, table, keysWithPrefix("expired:", 250), time.Now().Add(-time.Minute))
			s, err := sqlstore.New(ctxT(t), db, sqlstore.Options{Dialect: b.dialect, Table: table, CleanupInterval: 20 * time.Millisecond, CleanupBatch: 100})
			if err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for countRows(t, db, table, "1 = 1") != 0 {
				if time.Now().After(deadline) {
					t.Fatal("the janitor did not remove the expired rows within 30s")
				}
				time.Sleep(10 * time.Millisecond) // polling interval
			}
			closed := make(chan error, 1)
			go func() { closed <- s.Close() }()
			select {
			case err := <-closed:
				if err != nil {
					t.Fatalf("Close: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Close did not return: the janitor did not stop")
			}
			if _, err := s.Cleanup(ctxT(t)); !errors.Is(err, inbox.ErrClosed) {
				t.Fatalf("Cleanup after Close: %v, want ErrClosed", err)
			}
		})
	}
}

// Cleanup deletes a dead record once the retention from its Fail has
// passed, and a record in a backoff once the backoff and the retention
// after it have; a record of a longer retention stays.
func TestCleanup_dead_and_backoff_records(t *testing.T) {
	for _, b := range []backend{backends[0], backends[1], backends[3]} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			table := newTable(t, db, b.dialect)
			const retention, backoff = 50 * time.Millisecond, 2 * time.Second
			s := newStore(t, b, db, table, sqlstore.Options{Retention: retention})
			live := newStore(t, b, db, table, sqlstore.Options{Retention: time.Hour})
			fail := func(st *sqlstore.Store, key string, opts inbox.FailOptions) {
				t.Helper()
				c, err := st.TryBegin(ctxT(t), key, inbox.BeginOptions{Lease: time.Minute})
				if err == nil {
					err = st.Fail(ctxT(t), key, c.LeaseID, opts)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			start := time.Now()
			fail(s, "dead", inbox.FailOptions{Dead: true, Reason: "poison"})
			fail(s, "backoff", inbox.FailOptions{RetryAfter: backoff, Reason: "later"})
			fail(live, "live-dead", inbox.FailOptions{Dead: true})
			count := func(key string) int { return countRows(t, db, table, "msg_key = '"+key+"'") }
			poll := func(what string, done func() bool) {
				t.Helper()
				deadline := time.Now().Add(30 * time.Second)
				for !done() {
					if time.Now().After(deadline) {
						t.Fatalf("%s: not within 30s", what)
					}
					time.Sleep(20 * time.Millisecond) // polling interval
				}
			}
			poll("the dead record to be cleaned up", func() bool {
				if _, err := s.Cleanup(ctxT(t)); err != nil {
					t.Fatal(err)
				}
				return count("dead") == 0
			})
			if elapsed := time.Since(start); elapsed < backoff && count("backoff") != 1 {
				t.Fatalf("the record in a backoff of %s was deleted %s after its Fail", backoff, elapsed)
			}
			poll("the record in a backoff to be cleaned up", func() bool {
				if _, err := s.Cleanup(ctxT(t)); err != nil {
					t.Fatal(err)
				}
				return count("backoff") == 0
			})
			if elapsed := time.Since(start); elapsed < backoff+retention {
				t.Fatalf("the record in a backoff of %s was deleted %s after its Fail", backoff, elapsed)
			}
			if count("live-dead") != 1 {
				t.Fatal("Cleanup deleted a dead record within its retention")
			}
		})
	}
}
