package sqlstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/faultproxy"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
)

func randomTable() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "inbox_test_" + hex.EncodeToString(b[:])
}

func withParams(raw string, params string) string {
	if strings.Contains(raw, "?") {
		return raw + "&" + params
	}
	return raw + "?" + params
}

// roundTrip claims and completes a key through s.
func roundTrip(t *testing.T, s inbox.LeaseStore) {
	t.Helper()
	c, err := s.TryBegin(ctxT(t), "url:key", inbox.BeginOptions{})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin = %+v, %v", c, err)
	}
	if err := s.Complete(ctxT(t), "url:key", c.LeaseID); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if ok, err := s.IsProcessed(ctxT(t), "url:key"); err != nil || !ok {
		t.Fatalf("IsProcessed = %v, %v", ok, err)
	}
}

func TestOpen_by_URL(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name, url string
		db        func(t *testing.T) string // the service URL, or "" for SQLite
	}{
		{"postgres", "", func(t *testing.T) string { return testenv.Postgres.URL(t) }},
		{"postgresql", "", func(t *testing.T) string {
			return strings.Replace(testenv.Postgres.URL(t), "postgres://", "postgresql://", 1)
		}},
		{"mysql", "", func(t *testing.T) string { return testenv.MySQL.URL(t) }},
		{"sqlite-absolute", "sqlite://" + filepath.Join(dir, "abs.db"), nil},
		{"sqlite-memory", "sqlite::memory:", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			table := randomTable()
			raw := c.url
			if c.db != nil {
				raw = c.db(t)
			}
			raw = withParams(raw, "table="+table+"&migrate=true&retention=1h&lease=10s&cleanup_batch=10&max_conns=4")
			s, err := stores.Open(ctxT(t), raw)
			if err != nil {
				t.Fatalf("Open(%s): %v", raw, err)
			}
			ss, ok := s.(*sqlstore.Store)
			if !ok {
				t.Fatalf("Open returned %T, want *sqlstore.Store", s)
			}
			if ss.Table() != table {
				t.Fatalf("table %q, want %q", ss.Table(), table)
			}
			roundTrip(t, s)
			c2, err := s.TryBegin(ctxT(t), "url:lease", inbox.BeginOptions{})
			if err != nil || c2.Lease != 10*time.Second {
				t.Fatalf("default lease from the URL: %+v, %v", c2, err)
			}
			if c.db != nil {
				// Drop the table through a store-independent connection.
				t.Cleanup(func() {
					open := openPostgres
					if c.name == "mysql" {
						open = openMySQL
					}
					if _, err := open(t).ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table); err != nil {
						t.Errorf("drop %s: %v", table, err)
					}
				})
			}
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if _, err := s.Get(ctxT(t), "url:key"); !errors.Is(err, inbox.ErrClosed) {
				t.Fatalf("Get after Close: %v, want ErrClosed", err)
			}
		})
	}
}

func TestOpen_sqlite_relative_and_file_reopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keep.db")
	s, err := stores.Open(ctxT(t), "sqlite://"+path+"?migrate=true")
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, s)
	_ = s.Close()
	// The data outlives the store: a new store on the file sees the key.
	s2, err := stores.Open(ctxT(t), "sqlite://"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if ok, err := s2.IsProcessed(ctxT(t), "url:key"); err != nil || !ok {
		t.Fatalf("IsProcessed after reopening the file = %v, %v", ok, err)
	}
	for raw, want := range map[string]string{
		"sqlite:rel/inbox.db":    "rel/inbox.db",
		"sqlite://rel/inbox.db":  "rel/inbox.db",
		"sqlite:///abs/inbox.db": "/abs/inbox.db",
		"sqlite::memory:":        ":memory:",
	} {
		got, err := sqlstore.SQLitePath(raw)
		if err != nil || got != want {
			t.Errorf("SQLitePath(%q) = %q, %v; want %q", raw, got, err, want)
		}
	}
}

func TestOpen_rejects_bad_parameters_by_name(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"postgres://u@127.0.0.1:1/db?bogus=1":               "bogus",
		"postgresql://u@127.0.0.1:1/db?sslmode=disable&x=1": "x",
		"mysql://u@127.0.0.1:1/db?parseTme=true":            "parseTme",
		"sqlite:///tmp/x.db?journal=wal":                    "journal",
		"postgres://u@127.0.0.1:1/db?table=a%3Bdrop":        "table",
		"mysql://u@127.0.0.1:1/db?table=1abc":               "table",
		"sqlite:///tmp/x.db?migrate=maybe":                  "migrate",
		"sqlite:///tmp/x.db?cleanup_batch=0":                "cleanup_batch",
		"sqlite:///tmp/x.db?busy_timeout=soon":              "busy_timeout",
		"mysql://u@127.0.0.1:1/":                            "database",
		"sqlite://":                                         "no database file",
	} {
		_, err := stores.Open(ctxT(t), raw)
		if !errors.Is(err, stores.ErrInvalidURL) || !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%q): %v, want ErrInvalidURL naming %q", raw, err, want)
		}
	}
}

func TestOpen_never_prints_the_password(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"postgres://user:s3cr%40t@127.0.0.1:1/test?connect_timeout=2",
		"postgres://user:s3cr%40t@127.0.0.1:1/test?bogus=1",
		"mysql://user:s3cr%40t@127.0.0.1:1/test?timeout=2s",
		"mysql://user:s3cr%40t@127.0.0.1:1/test?bogus=1",
	} {
		_, err := stores.Open(ctxT(t), raw)
		if err == nil {
			t.Fatalf("Open(%s) succeeded on a closed port", raw)
		}
		if msg := err.Error(); strings.Contains(msg, "s3cr") {
			t.Errorf("error quotes the password: %s", msg)
		}
	}
}

func TestStore_link_cut_is_unavailable_then_recovers(t *testing.T) {
	for _, b := range []backend{backends[0], backends[1]} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			svc := map[string]testenv.Service{"postgres": testenv.Postgres, "mariadb": testenv.MySQL}[b.name]
			direct := b.open(t)
			table := newTable(t, direct, b.dialect)
			u, err := url.Parse(svc.URL(t))
			if err != nil {
				t.Fatal(err)
			}
			p := faultproxy.New(t, u.Host)
			u.Host = p.Addr()
			s, err := stores.Open(ctxT(t), withParams(u.String(), "table="+table))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			roundTrip(t, s)

			p.Cut()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err = s.TryBegin(ctx, "cut:key", inbox.BeginOptions{})
			if !errors.Is(err, inbox.ErrStoreUnavailable) {
				t.Fatalf("TryBegin with the link cut: %v, want ErrStoreUnavailable", err)
			}
			p.Restore()
			deadline := time.Now().Add(30 * time.Second)
			for {
				c, err := s.TryBegin(ctxT(t), "cut:key", inbox.BeginOptions{})
				if err == nil {
					if c.Status != inbox.Acquired {
						t.Fatalf("TryBegin after restore = %v: the failed call must not have claimed", c.Status)
					}
					break
				}
				if !errors.Is(err, inbox.ErrStoreUnavailable) || time.Now().After(deadline) {
					t.Fatalf("TryBegin after restore: %v", err)
				}
				time.Sleep(50 * time.Millisecond) // polling interval
			}
		})
	}
}

func TestDDL_and_table_names(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"", "inbox; DROP TABLE x", "a.b.c", "1abc", "in-box", `in"box`, "in`box", strings.Repeat("a", 49), "ta ble", "é"} {
		if err := sqlstore.ValidateTable(bad); !errors.Is(err, inbox.ErrInvalidArgument) {
			t.Errorf("ValidateTable(%q) = %v, want ErrInvalidArgument", bad, err)
		}
	}
	for _, good := range []string{"inbox", "Inbox_2", "_x", "app.inbox", strings.Repeat("a", 48)} {
		if err := sqlstore.ValidateTable(good); err != nil {
			t.Errorf("ValidateTable(%q) = %v", good, err)
		}
	}
	for d, want := range map[sqlstore.Dialect]string{
		sqlstore.Postgres: `CREATE TABLE IF NOT EXISTS "app"."inbox"`,
		sqlstore.MySQL:    "CREATE TABLE IF NOT EXISTS `app`.`inbox`",
		sqlstore.SQLite:   `CREATE TABLE IF NOT EXISTS "app"."inbox"`,
	} {
		ddl, err := sqlstore.DDL(d, "app.inbox")
		if err != nil || !strings.HasPrefix(ddl, want) || !strings.Contains(ddl, "expires_at") {
			t.Errorf("DDL(%s) = %q, %v", d, ddl, err)
		}
	}
	if _, err := sqlstore.DDL("oracle", "inbox"); !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Errorf("DDL of an unknown dialect: %v", err)
	}
	if _, err := sqlstore.DDL(sqlstore.Postgres, "x;y"); !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Errorf("DDL of a bad table: %v", err)
	}
	if _, err := sqlstore.New(ctxT(t), nil, sqlstore.Options{Dialect: sqlstore.SQLite}); !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Errorf("New with a nil db: %v", err)
	}
}

func TestMigrate_idempotent_and_concurrent(t *testing.T) {
	for _, b := range []backend{backends[0], backends[1], backends[3]} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			table := randomTable()
			t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table) })

			s := newStore(t, b, db, table, sqlstore.Options{})
			_, err := s.TryBegin(ctxT(t), "k", inbox.BeginOptions{})
			if !errors.Is(err, inbox.ErrStoreUnavailable) || !strings.Contains(err.Error(), "Migrate") {
				t.Fatalf("TryBegin before Migrate: %v, want ErrStoreUnavailable naming Migrate", err)
			}
			var wg sync.WaitGroup
			errs := make([]error, 4)
			for i := range errs {
				wg.Add(1)
				go func() { defer wg.Done(); errs[i] = s.Migrate(ctxT(t)) }()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("concurrent Migrate: %v", err)
			}
			roundTrip(t, s)
			if err := s.Migrate(ctxT(t)); err != nil {
				t.Fatalf("Migrate again: %v", err)
			}
			if ok, err := s.IsProcessed(ctxT(t), "url:key"); err != nil || !ok {
				t.Fatalf("Migrate again lost data: %v, %v", ok, err)
			}
		})
	}
}
