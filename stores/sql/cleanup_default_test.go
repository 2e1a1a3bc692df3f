package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	"github.com/watermill-inbox/inbox/stores/sql/internal/sqltest"
)

// A store opened from a URL that sets only the retention (10 s) cleans up
// by default: after a minute of 100 claims and marks a second (6,000 keys),
// its table holds at most 1,500 rows, the last 10 s of keys and what the
// janitor has yet to delete, at every sample from the 20th second on. The
// keys are claimed by 8 goroutines, as a router's handlers would.
func TestCleanup_on_by_default_keeps_the_table_at_the_retention(t *testing.T) {
	cases := []struct {
		name string
		url  func(t *testing.T) (raw string, count func(t *testing.T, table string) int)
	}{
		{"postgres", func(t *testing.T) (string, func(*testing.T, string) int) {
			db := openPostgres(t)
			return testenv.Postgres.URL(t), func(t *testing.T, table string) int { return countRows(t, db, table, "1 = 1") }
		}},
		{"mariadb", func(t *testing.T) (string, func(*testing.T, string) int) {
			db := openMySQL(t)
			return testenv.MySQL.URL(t), func(t *testing.T, table string) int { return countRows(t, db, table, "1 = 1") }
		}},
		{"sqlite", func(t *testing.T) (string, func(*testing.T, string) int) {
			path := filepath.Join(t.TempDir(), "inbox.db")
			var db *sql.DB // opened once the store has made the file
			return "sqlite://" + path, func(t *testing.T, table string) int {
				if db == nil {
					db = sqltest.OpenSQLiteFile(t, path)
				}
				return countRows(t, db, table, "1 = 1")
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			raw, count := c.url(t)
			table := randomTable()
			s, err := stores.Open(ctxT(t), withParams(raw, "table="+table+"&migrate=true&retention=10s"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			if c.name != "sqlite" {
				t.Cleanup(func() {
					open := openPostgres
					if c.name == "mariadb" {
						open = openMySQL
					}
					if _, err := open(t).ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table+"_order"); err != nil {
						t.Errorf("drop %s_order: %v", table, err)
					}
					if _, err := open(t).ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table); err != nil {
						t.Errorf("drop %s: %v", table, err)
					}
				})
			}
			start := time.Now()
			claims, most := sqltest.Pace(t, time.Minute, 100, 8, func(ctx context.Context, key string) error {
				c, err := s.TryBegin(ctx, key, inbox.BeginOptions{})
				if err == nil && c.Status != inbox.Acquired {
					err = fmt.Errorf("status %v, want Acquired", c.Status)
				}
				if err == nil {
					err = s.Complete(ctx, key, c.LeaseID)
				}
				return err
			}, func() int { return count(t, table) })
			end := time.Now()
			if err := s.Close(); err != nil { // stops the janitor
				t.Fatal(err)
			}
			rows := count(t, table)
			st := s.(*sqlstore.Store).CleanupStats()
			t.Logf("%s: %d keys claimed and marked in %s; %d rows %s after the end, at most %d from the 20th second; janitor: %d rows deleted in %d passes, backlog %d",
				c.name, claims, end.Sub(start).Round(time.Second), rows, time.Since(end).Round(time.Millisecond), most, st.Deleted, st.Passes, st.Backlog)
			if claims != 6_000 {
				t.Fatalf("%d keys claimed, want 6,000", claims)
			}
			if most > 1_500 {
				t.Fatalf("the table held %d rows, want at most 1,500 (without cleanup it holds every key claimed: %d)", most, claims)
			}
			if st.Deleted+int64(rows) != int64(claims) {
				t.Fatalf("CleanupStats.Deleted %d + %d rows left = %d, want the %d keys claimed", st.Deleted, rows, st.Deleted+int64(rows), claims)
			}
			if st.Passes < 30 || st.Counted.IsZero() || st.Backlog > 200 {
				t.Fatalf("CleanupStats %+v: want a pass a second or so (interval 1 s), each leaving a small backlog", st)
			}
		})
	}
}

func TestDefaultCleanupInterval_follows_the_retention(t *testing.T) {
	t.Parallel()
	for retention, want := range map[time.Duration]time.Duration{
		7 * 24 * time.Hour:    time.Hour,
		5 * time.Hour:         30 * time.Minute,
		10 * time.Second:      time.Second,
		time.Minute:           6 * time.Second,
		50 * time.Millisecond: time.Second, // at least a second
	} {
		if got := sqlstore.DefaultCleanupInterval(retention); got != want {
			t.Errorf("DefaultCleanupInterval(%s) = %s, want %s", retention, got, want)
		}
	}
}

// Options that both turn the janitor off and set its interval are refused,
// naming both.
func TestOptions_cleanup_off_excludes_an_interval(t *testing.T) {
	t.Parallel()
	_, err := sqlstore.New(ctxT(t), openSQLite(t), sqlstore.Options{Dialect: sqlstore.SQLite, DisableCleanup: true, CleanupInterval: time.Minute})
	if !errors.Is(err, inbox.ErrInvalidArgument) || !strings.Contains(err.Error(), "CleanupInterval 1m0s with DisableCleanup") {
		t.Fatalf("New with DisableCleanup and CleanupInterval: %v, want ErrInvalidArgument naming both", err)
	}
}

// Two stores on one table, opened by URL with the retention of 1 s (so a
// janitor's interval of 1 s): the one opened with cleanup=off makes no
// pass while the other's janitor makes three and deletes the expired rows.
func TestOpen_cleanup_off_runs_no_janitor(t *testing.T) {
	t.Parallel()
	raw := "sqlite://" + filepath.Join(t.TempDir(), "inbox.db") + "?migrate=true&retention=1s"
	open := func(params string) *sqlstore.Store {
		s, err := stores.Open(ctxT(t), raw+params)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s.(*sqlstore.Store)
	}
	off := open("&cleanup=off")
	if err := off.MarkProcessed(ctxT(t), "k"); err != nil {
		t.Fatal(err)
	}
	on := open("")
	testenv.Eventually(t, 30*time.Second, "three passes of the default janitor", func() bool { return on.CleanupStats().Passes >= 3 })
	if st := off.CleanupStats(); st.Passes != 0 || !st.Counted.IsZero() {
		t.Fatalf("the store opened with cleanup=off made janitor passes: %+v", st)
	}
	testenv.Eventually(t, 30*time.Second, "the expired key deleted by the default janitor", func() bool { return on.CleanupStats().Deleted == 1 })
	if n, err := off.Backlog(ctxT(t)); err != nil || n != 0 {
		t.Fatalf("Backlog after the janitor's passes = %d, %v; want 0", n, err)
	}
}
