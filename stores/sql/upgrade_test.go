package sqlstore_test

import (
	"database/sql"
	"encoding/json"
	"errors"
	"os"
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

// earlierRow is a row of the layout before the compact one, as
// testdata/upgrade holds it: times in microseconds relative to the clock.
type earlierRow struct {
	MsgKey      string `json:"msg_key"`
	State       int    `json:"state"`
	LeaseID     string `json:"lease_id"`
	Owner       string `json:"owner"`
	LeaseUntil  *int64 `json:"lease_until"`
	Attempts    int    `json:"attempts"`
	FirstSeen   int64  `json:"first_seen"`
	LastSeen    int64  `json:"last_seen"`
	ProcessedAt *int64 `json:"processed_at"`
	PayloadHash string `json:"payload_hash"`
	ExpiresAt   int64  `json:"expires_at"`
	Reason      string `json:"reason"`
}

// loadEarlier creates table with the DDL of the earlier layout of
// testdata/upgrade and loads its rows, their times moved to now, and
// returns them.
func loadEarlier(t *testing.T, db *sql.DB, d sqlstore.Dialect, table string, now time.Time) []earlierRow {
	t.Helper()
	name := map[sqlstore.Dialect]string{sqlstore.Postgres: "postgres", sqlstore.MySQL: "mysql", sqlstore.SQLite: "sqlite"}[d]
	ddl, err := os.ReadFile(filepath.Join("testdata", "upgrade", name+".ddl.sql"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctxT(t), "DROP TABLE "+table); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range strings.Split(string(ddl), ";\n") {
		if stmt = strings.TrimSpace(stmt); stmt == "" || strings.HasPrefix(stmt, "--") {
			continue
		}
		if _, err := db.ExecContext(ctxT(t), strings.ReplaceAll(stmt, "inbox", table)); err != nil {
			t.Fatalf("the earlier DDL: %v\n%s", err, stmt)
		}
	}
	buf, err := os.ReadFile(filepath.Join("testdata", "upgrade", name+".rows.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rows []earlierRow
	if err := json.Unmarshal(buf, &rows); err != nil {
		t.Fatal(err)
	}
	at := func(rel int64) any {
		tm := now.Add(time.Duration(rel) * time.Microsecond)
		if d == sqlstore.SQLite {
			return tm.UnixMicro()
		}
		return tm.UTC()
	}
	opt := func(rel *int64) any {
		if rel == nil {
			return nil
		}
		return at(*rel)
	}
	ph := "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"
	if d == sqlstore.Postgres {
		ph = "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12"
	}
	for _, r := range rows {
		_, err := db.ExecContext(ctxT(t), "INSERT INTO "+table+" (msg_key, state, lease_id, owner, lease_until, attempts, first_seen, last_seen, processed_at, payload_hash, expires_at, reason) VALUES ("+ph+")",
			r.MsgKey, r.State, r.LeaseID, r.Owner, opt(r.LeaseUntil), r.Attempts, at(r.FirstSeen), at(r.LastSeen), opt(r.ProcessedAt), r.PayloadHash, at(r.ExpiresAt), r.Reason)
		if err != nil {
			t.Fatalf("loading %s: %v", r.MsgKey, err)
		}
	}
	return rows
}

// A table of the layout before the compact one, with rows of every state
// as that version of the store wrote them (testdata/upgrade), is reported
// at Open with the fix; Migrate (migrate=true) copies it to the compact
// layout, and runs again as a no-op. Every record then reads with its
// state, attempts, owner, reason and payload hash; a processed key is
// Processed (not run again) and its completing lease's repeated Complete
// still succeeds while another's fails; the lease in flight still fences.
func TestUpgrade_earlier_layout_is_read_after_migrate(t *testing.T) {
	for _, b := range []backend{backends[0], backends[1], backends[3]} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			var (
				raw string
				db  *sql.DB
			)
			switch b.dialect {
			case sqlstore.Postgres:
				raw, db = testenv.Postgres.URL(t), openPostgres(t)
			case sqlstore.MySQL:
				raw, db = testenv.MySQL.URL(t), openMySQL(t)
			default:
				path := sqltest.SQLiteFile(t)
				raw, db = "sqlite://"+path, sqltest.OpenSQLiteFile(t, path)
			}
			table := newTable(t, db, b.dialect)
			rows := loadEarlier(t, db, b.dialect, table, time.Now())
			raw = withParams(raw, "table="+table)
			ctx := ctxT(t)

			_, err := stores.Open(ctx, raw)
			if !errors.Is(err, stores.ErrMisconfigured) || !strings.Contains(err.Error(), "layout of an earlier version") || !strings.Contains(err.Error(), "migrate=true") {
				t.Fatalf("Open of a table of the earlier layout: %v; want ErrMisconfigured naming the earlier layout and the fix", err)
			}
			t.Logf("Open: %v", err)
			for range 2 { // the second is a no-op
				st, err := stores.Open(ctx, withParams(raw, "migrate=true"))
				if err != nil {
					t.Fatalf("Open with migrate=true: %v", err)
				}
				_ = st.Close()
			}
			opened, err := stores.Open(ctx, raw)
			if err != nil {
				t.Fatalf("Open after Migrate: %v", err)
			}
			defer opened.Close()
			st := opened.(inbox.LeaseStore)

			now := time.Now()
			for _, r := range rows {
				want := inbox.Record{Attempts: r.Attempts, Reason: r.Reason, PayloadHash: r.PayloadHash}
				if len(r.PayloadHash) == 64 {
					want.PayloadHash = r.PayloadHash[:32] // the 16-byte prefix of a hex SHA-256
				}
				switch {
				case r.State == 1:
					want.State = inbox.StateProcessed
				case r.State == 2:
					want.State, want.Owner = inbox.StateDead, r.Owner
				case r.LeaseID != "" && r.LeaseUntil != nil && *r.LeaseUntil > 0:
					want.State, want.Owner = inbox.StateInProgress, r.Owner
				default:
					want.State, want.Owner = inbox.StateAvailable, r.Owner
				}
				got, err := st.Get(ctx, r.MsgKey)
				if err != nil {
					t.Fatalf("Get(%s): %v", r.MsgKey, err)
				}
				if got.State != want.State || got.Attempts != want.Attempts || got.Reason != want.Reason || got.PayloadHash != want.PayloadHash || got.Owner != want.Owner {
					t.Errorf("%s: %+v; want state %v, %d attempts, reason %q, hash %q, owner %q", r.MsgKey, got, want.State, want.Attempts, want.Reason, want.PayloadHash, want.Owner)
				}
				if first := now.Add(time.Duration(r.FirstSeen) * time.Microsecond); got.FirstSeen.Sub(first).Abs() > 5*time.Second {
					t.Errorf("%s: first seen %s, want about %s", r.MsgKey, got.FirstSeen, first)
				}
				if want.State == inbox.StateProcessed {
					if c, err := st.TryBegin(ctx, r.MsgKey, inbox.BeginOptions{PayloadHash: r.PayloadHash}); err != nil || c.Status != inbox.Processed || c.PayloadMismatch {
						t.Errorf("TryBegin(%s) after the upgrade: %+v, %v; want Processed, no mismatch", r.MsgKey, c, err)
					}
					if r.LeaseID != "" {
						if err := st.Complete(ctx, r.MsgKey, r.LeaseID); err != nil {
							t.Errorf("repeated Complete(%s) of its completing lease: %v", r.MsgKey, err)
						}
					}
					if err := st.Complete(ctx, r.MsgKey, "stale-"+r.LeaseID); !errors.Is(err, inbox.ErrLeaseLost) {
						t.Errorf("Complete(%s) of another lease: %v; want ErrLeaseLost", r.MsgKey, err)
					}
				}
				if want.State == inbox.StateDead {
					if c, err := st.TryBegin(ctx, r.MsgKey, inbox.BeginOptions{}); err != nil || c.Status != inbox.Dead || c.Reason != r.Reason {
						t.Errorf("TryBegin(%s) after the upgrade: %+v, %v; want Dead", r.MsgKey, c, err)
					}
				}
			}
			if c, err := st.TryBegin(ctx, "k:processed", inbox.BeginOptions{PayloadHash: "other"}); err != nil || c.Status != inbox.Processed || !c.PayloadMismatch {
				t.Errorf("TryBegin of a processed key with another payload: %+v, %v; want Processed with a mismatch", c, err)
			}

			// The lease in flight: it fences others, and its holder completes.
			const key, holder = "k:inflight", "lease-inflight-0123456789abcdef"
			if c, err := st.TryBegin(ctx, key, inbox.BeginOptions{LeaseID: "another"}); err != nil || c.Status != inbox.Busy {
				t.Fatalf("TryBegin of the key in flight: %+v, %v; want Busy", c, err)
			}
			for _, f := range []func() error{
				func() error { return st.Complete(ctx, key, "another") },
				func() error { return st.Release(ctx, key, "another") },
				func() error { _, err := st.Extend(ctx, key, "another", time.Minute); return err },
			} {
				if err := f(); !errors.Is(err, inbox.ErrLeaseLost) {
					t.Fatalf("a call of another lease on the key in flight: %v; want ErrLeaseLost", err)
				}
			}
			if c, err := st.TryBegin(ctx, key, inbox.BeginOptions{LeaseID: holder}); err != nil || c.Status != inbox.Acquired || c.Attempts != 1 {
				t.Fatalf("TryBegin of its holder: %+v, %v; want Acquired again, 1 attempt", c, err)
			}
			for range 2 {
				if err := st.Complete(ctx, key, holder); err != nil {
					t.Fatalf("Complete of the holder: %v", err)
				}
			}
			if c, err := st.TryBegin(ctx, key, inbox.BeginOptions{}); err != nil || c.Status != inbox.Processed {
				t.Fatalf("TryBegin after Complete: %+v, %v", c, err)
			}
			// The key in a backoff stays in it; a released key is free.
			if c, err := st.TryBegin(ctx, "k:backoff", inbox.BeginOptions{}); err != nil || c.Status != inbox.Busy || !c.BackingOff {
				t.Fatalf("TryBegin in the backoff: %+v, %v; want Busy, backing off", c, err)
			}
			if c, err := st.TryBegin(ctx, "k:released", inbox.BeginOptions{}); err != nil || c.Status != inbox.Acquired || c.Attempts != 2 {
				t.Fatalf("TryBegin of the released key: %+v, %v; want Acquired, 2 attempts", c, err)
			}
		})
	}
}
