package sqlstore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
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
					if _, err := open(t).ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table+"_order"); err != nil {
						t.Errorf("drop %s_order: %v", table, err)
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
}

func TestOpen_rejects_bad_parameters_by_name(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"postgres://u@127.0.0.1:1/db?bogus=1":                "bogus",
		"postgresql://u@127.0.0.1:1/db?sslmode=disable&x=1":  "x",
		"mysql://u@127.0.0.1:1/db?parseTme=true":             "parseTme",
		"sqlite:///tmp/x.db?journal=wal":                     "journal",
		"postgres://u@127.0.0.1:1/db?table=a%3Bdrop":         "table",
		"mysql://u@127.0.0.1:1/db?table=1abc":                "table",
		"sqlite:///tmp/x.db?migrate=maybe":                   "migrate",
		"sqlite:///tmp/x.db?cleanup_batch=0":                 "cleanup_batch",
		"sqlite:///tmp/x.db?cleanup=false":                   "cleanup=\"false\" is not on or off",
		"sqlite:///tmp/x.db?cleanup=off&cleanup_interval=1m": "cleanup=off and cleanup_interval=1m0s",
		"sqlite:///tmp/x.db?cleanup_interval=0":              "cleanup_interval",
		"sqlite:///tmp/x.db?busy_timeout=soon":               "busy_timeout",
		"mysql://u@127.0.0.1:1/":                             "database",
		"sqlite://":                                          "no database file",
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
			t.Cleanup(func() { dropTables(db, table, table+"_order") })

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

// openSecret is the password the URLs of the check tests carry; no error may
// quote it.
const openSecret = "s3cr3t-Open-pw"

// withUser returns raw with its user info replaced.
func withUser(t *testing.T, raw string, user *url.Userinfo) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.User = user
	return u.String()
}

// withPath returns raw with its path replaced.
func withPath(t *testing.T, raw, path string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = path
	return u.String()
}

// sqlOpenFails opens raw, which must fail at Open with an error wrapping
// inbox.ErrStoreUnavailable, and stores.ErrMisconfigured exactly when
// misconfigured is set, holding every one of want and not the password.
// With check=false the URL must open, and the first call fail with
// inbox.ErrStoreUnavailable (and, when misconfigured, the same diagnosis).
func sqlOpenFails(t *testing.T, raw string, misconfigured bool, want ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := stores.Open(ctx, raw)
	if err == nil {
		_ = s.Close()
		t.Fatalf("Open(%s) succeeded", raw)
	}
	t.Logf("Open: %v", err)
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, inbox.ErrStoreUnavailable) {
			t.Errorf("%s: error does not wrap inbox.ErrStoreUnavailable: %v", what, err)
		}
		if errors.Is(err, stores.ErrMisconfigured) != misconfigured {
			t.Errorf("%s: errors.Is(err, stores.ErrMisconfigured) = %v, want %v: %v", what, !misconfigured, misconfigured, err)
		}
		if strings.Contains(err.Error(), openSecret) {
			t.Errorf("%s: error quotes the password: %v", what, err)
		}
	}
	check("Open", err)
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Open: error does not say %q: %v", w, err)
		}
	}

	s, err = stores.Open(ctx, withParams(raw, "check=false"))
	if err != nil {
		t.Fatalf("Open with check=false: %v", err)
	}
	defer s.Close()
	_, err = s.TryBegin(ctx, "k", inbox.BeginOptions{})
	if err == nil {
		t.Fatal("the first call of a store opened with check=false succeeded")
	}
	t.Logf("first call: %v", err)
	if !errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Errorf("first call: error does not wrap inbox.ErrStoreUnavailable: %v", err)
	}
	if strings.Contains(err.Error(), openSecret) {
		t.Errorf("first call: error quotes the password: %v", err)
	}
}

func TestOpen_checks_the_store(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cases := []struct {
		name          string
		url           func(t *testing.T) string
		misconfigured bool
		want          []string
	}{
		{"postgres/missing table", func(t *testing.T) string {
			return withParams(testenv.Postgres.URL(t), "table=nosuch_"+randomTable())
		}, true, []string{"table nosuch_inbox_test_", "does not exist in database test at", "add migrate=true to the URL"}},
		{"postgres/unknown role", func(t *testing.T) string {
			return withUser(t, testenv.Postgres.URL(t), url.UserPassword("nobody_inbox", openSecret))
		}, true, []string{"refused user nobody_inbox for database test"}},
		{"postgres/unknown database", func(t *testing.T) string {
			return withPath(t, testenv.Postgres.URL(t), "/nosuch_inbox_db")
		}, true, []string{"database nosuch_inbox_db does not exist at"}},
		{"postgres/other layout", func(t *testing.T) string {
			table := randomTable()
			db := openPostgres(t)
			if _, err := db.ExecContext(ctxT(t), "CREATE TABLE "+table+" (msg_key TEXT PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { dropTables(db, table, table+"_order") })
			return withParams(testenv.Postgres.URL(t), "table="+table)
		}, true, []string{"is not an inbox table of this version"}},
		{"postgres/unreachable", func(*testing.T) string {
			return "postgres://postgres:" + openSecret + "@127.0.0.1:1/test?sslmode=disable"
		}, false, []string{"cannot reach database test at 127.0.0.1:1", "connection refused"}},
		{"mysql/missing table", func(t *testing.T) string {
			return withParams(testenv.MySQL.URL(t), "table=nosuch_"+randomTable())
		}, true, []string{"table nosuch_inbox_test_", "does not exist in database test at", "add migrate=true to the URL"}},
		{"mysql/wrong password", func(t *testing.T) string {
			u, err := url.Parse(testenv.MySQL.URL(t))
			if err != nil {
				t.Fatal(err)
			}
			return withUser(t, u.String(), url.UserPassword(u.User.Username(), openSecret))
		}, true, []string{"authentication failed for user root at", "check the user and password in the URL"}},
		{"mysql/unknown database", func(t *testing.T) string {
			return withPath(t, testenv.MySQL.URL(t), "/nosuch_inbox_db")
		}, true, []string{"database nosuch_inbox_db does not exist at"}},
		{"mysql/unreachable", func(*testing.T) string {
			return "mysql://root:" + openSecret + "@127.0.0.1:1/test"
		}, false, []string{"cannot reach database test at 127.0.0.1:1", "connection refused"}},
		{"sqlite/missing table", func(*testing.T) string {
			return "sqlite://" + filepath.Join(dir, "empty.db")
		}, true, []string{"table inbox does not exist in SQLite database", "add migrate=true to the URL"}},
		{"sqlite/missing directory", func(*testing.T) string {
			return "sqlite://" + filepath.Join(dir, "no", "such", "dir", "inbox.db")
		}, true, []string{"cannot open SQLite database", "directory exists"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sqlOpenFails(t, c.url(t), c.misconfigured, c.want...)
		})
	}
}

// migrate=true needs the server at Open: with check=false it is refused on
// the server databases, and done on SQLite.
func TestOpen_check_false_and_migrate(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"postgres://app:" + openSecret + "@127.0.0.1:1/db?migrate=true&check=false",
		"mysql://app:" + openSecret + "@127.0.0.1:1/db?check=false&migrate=true",
	} {
		_, err := stores.Open(ctxT(t), raw)
		if !errors.Is(err, stores.ErrInvalidURL) || !strings.Contains(err.Error(), "migrate=true and check=false") {
			t.Errorf("Open(%s) = %v; want ErrInvalidURL naming migrate and check", raw, err)
		}
	}
	s, err := stores.Open(ctxT(t), "sqlite://"+filepath.Join(t.TempDir(), "m.db")+"?migrate=true&check=false")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	roundTrip(t, s)
}

// A program that starts before its database: with check=false, Open
// succeeds while the server is out of reach, calls fail with
// ErrStoreUnavailable, and the store works once the server answers (on
// MySQL, the store is made by that first call).
func TestOpen_check_false_waits_for_the_server(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		svc  testenv.Service
		db   func(t testing.TB) *sql.DB
	}{
		{"postgres", testenv.Postgres, openPostgres},
		{"mysql", testenv.MySQL, openMySQL},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			u, err := url.Parse(c.svc.URL(t))
			if err != nil {
				t.Fatal(err)
			}
			// The table exists (migrated beforehand), the server does not
			// answer yet.
			table := randomTable()
			ms, err := stores.Open(ctxT(t), withParams(u.String(), "table="+table+"&migrate=true"))
			if err != nil {
				t.Fatal(err)
			}
			_ = ms.Close()
			db := c.db(t)
			t.Cleanup(func() { dropTables(db, table, table+"_order") })
			p := faultproxy.New(t, u.Host)
			p.Cut()
			u.Host = p.Addr()
			raw := withParams(u.String(), "table="+table)

			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if _, err := stores.Open(ctx, raw); !errors.Is(err, inbox.ErrStoreUnavailable) || errors.Is(err, stores.ErrMisconfigured) {
				t.Fatalf("Open with the server out of reach: %v; want ErrStoreUnavailable, not ErrMisconfigured", err)
			}
			s, err := stores.Open(ctx, withParams(raw, "check=false"))
			if err != nil {
				t.Fatalf("Open with check=false and the server out of reach: %v", err)
			}
			t.Cleanup(func() { _ = s.Close() })
			if _, err := s.Get(ctx, "url:key"); !errors.Is(err, inbox.ErrStoreUnavailable) {
				t.Fatalf("Get with the server out of reach: %v; want ErrStoreUnavailable", err)
			}
			if _, err := s.Get(ctx, ""); !errors.Is(err, inbox.ErrInvalidKey) {
				t.Fatalf("Get of an empty key: %v; want ErrInvalidKey, before any connection", err)
			}
			p.Restore()
			roundTrip(t, s)
			// The operators' side too (on MySQL, the store made by the first
			// call).
			a, ok := s.(inbox.Admin)
			if !ok {
				t.Fatalf("%T does not implement inbox.Admin", s)
			}
			if pg, err := a.List(ctx, inbox.ListOptions{Prefix: "url:"}); err != nil || len(pg.Items) != 1 || pg.Items[0].State != inbox.StateProcessed {
				t.Fatalf("List = %+v, %v; want url:key, processed", pg, err)
			}
			if err := a.ForceRelease(ctx, "url:key"); err != nil {
				t.Fatal(err)
			}
			if err := a.Forget(ctx, "url:key"); err != nil {
				t.Fatal(err)
			}
			c, err := s.TryBegin(ctx, "url:key", inbox.BeginOptions{})
			if err != nil || c.Status != inbox.Acquired || c.Attempts != 1 {
				t.Fatalf("TryBegin after Forget = %+v, %v", c, err)
			}
			if err := s.Fail(ctx, "url:key", c.LeaseID, inbox.FailOptions{Dead: true, Reason: "r"}); err != nil {
				t.Fatal(err)
			}
			if r, err := s.Get(ctx, "url:key"); err != nil || r.State != inbox.StateDead {
				t.Fatalf("Get after Fail = %+v, %v", r, err)
			}
		})
	}
}
