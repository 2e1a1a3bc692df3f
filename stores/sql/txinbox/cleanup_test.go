package txinbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	"github.com/watermill-inbox/inbox/stores/sql/internal/sqltest"
	"github.com/watermill-inbox/inbox/stores/sql/txinbox"
)

// A transactional store configured with only a retention (10 s) cleans up
// by default: after a minute of 100 claims and commits a second (6,000
// keys), its table holds at most 1,500 rows, the last 10 s of keys and
// what the janitor has yet to delete, at every sample from the 20th second
// on. The keys are claimed by 8 goroutines, as a router's handlers would.
func TestCleanup_on_by_default_keeps_the_table_at_the_retention(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			if b.dialect != sqlstore.SQLite {
				db.SetMaxOpenConns(8)
			}
			table := newTable(t, db, b.dialect)
			s, err := txinbox.New(txinbox.Config{DB: db, Dialect: b.dialect, Table: table, Retention: 10 * time.Second, Logger: watermill.NewStdLogger(false, false)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			rows := func() int { return countRows(t, db, table, "1 = 1") }

			start := time.Now()
			claims, most := sqltest.Pace(t, time.Minute, 100, 8, func(ctx context.Context, key string) error {
				c, err := s.BeginTx(ctx, key)
				if err == nil && c.Status != inbox.Acquired {
					err = fmt.Errorf("status %v, want Acquired", c.Status)
				}
				if err == nil {
					err = c.Finish(nil, nil)
				}
				return err
			}, rows)
			end := time.Now()
			if err := s.Close(); err != nil { // stops the janitor
				t.Fatal(err)
			}
			left := rows()
			most = max(most, left)
			st := s.CleanupStats()
			t.Logf("%s: %d keys claimed and committed in %s; %d rows %s after the end, at most %d from the 20th second; janitor: %d rows deleted in %d passes (%d failed), backlog %d",
				b.name, claims, end.Sub(start).Round(time.Second), left, time.Since(end).Round(time.Millisecond), most, st.Deleted, st.Passes, st.Failed, st.Backlog)
			if claims != 6_000 {
				t.Fatalf("%d keys claimed, want 6,000", claims)
			}
			if most > 1_500 {
				t.Fatalf("the table held %d rows, want at most 1,500 (without cleanup it holds every key claimed: %d)", most, claims)
			}
			if st.Deleted+int64(left) != int64(claims) {
				t.Fatalf("CleanupStats.Deleted %d + %d rows left = %d, want the %d keys claimed", st.Deleted, left, st.Deleted+int64(left), claims)
			}
		})
	}
}

// A Config that both turns the janitor off and sets its interval is
// refused, naming both.
func TestConfig_cleanup_off_excludes_an_interval(t *testing.T) {
	t.Parallel()
	_, err := txinbox.New(txinbox.Config{DB: openSQLite(t), Dialect: sqlstore.SQLite, DisableCleanup: true, CleanupInterval: time.Second})
	if !errors.Is(err, inbox.ErrInvalidArgument) || !strings.Contains(err.Error(), "CleanupInterval 1s with DisableCleanup") {
		t.Fatalf("New with DisableCleanup and CleanupInterval: %v, want ErrInvalidArgument naming both", err)
	}
}
