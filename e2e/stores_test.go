package e2e_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox/e2e/internal/harness"
	"github.com/watermill-inbox/inbox/internal/testenv"
	inboxmw "github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores"
	_ "github.com/watermill-inbox/inbox/stores/all"
	"github.com/watermill-inbox/inbox/stores/remote/server"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	sqlitedialect "github.com/watermill-inbox/inbox/stores/sql/sqlite"
	"github.com/watermill-inbox/inbox/stores/sql/txinbox"
)

const (
	noNetwork  = "no network link to cut: the store is in-process or embedded"
	oneProcess = "the memory store lives in one process: no other process can share it"
)

// storeKinds are the rows of the matrix in this module (MongoDB is in the
// e2e/mongo module).
func storeKinds() []harness.StoreKind {
	return []harness.StoreKind{
		{Name: "memory", New: newMemory, NoCrossProcess: oneProcess, NoOutage: noNetwork},
		{Name: "redis", New: newRedis},
		{Name: "postgres", New: sqlKind(testenv.Postgres, false)},
		{Name: "mariadb", New: sqlKind(testenv.MySQL, false)},
		{Name: "sqlite", New: newSQLite(false), NoOutage: noNetwork},
		{Name: "remote", New: newRemote},
		{Name: "postgres-tx", New: sqlKind(testenv.Postgres, true), Tx: true},
		{Name: "mariadb-tx", New: sqlKind(testenv.MySQL, true), Tx: true},
		{Name: "sqlite-tx", New: newSQLite(true), Tx: true, NoOutage: noNetwork},
	}
}

// only keeps the kinds named.
func only(kinds []harness.StoreKind, names ...string) []harness.StoreKind {
	var out []harness.StoreKind
	for _, k := range kinds {
		if slices.Contains(names, k.Name) {
			out = append(out, k)
		}
	}
	return out
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func open(t *testing.T, rawURL string) stores.Store {
	t.Helper()
	s, err := stores.Open(ctx(t), rawURL)
	if err != nil {
		t.Fatalf("opening %s: %v", stores.Redact(mustParse(t, rawURL)), err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func mustParse(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// withParams returns raw with the query parameters set.
func withParams(t *testing.T, raw string, kv ...string) string {
	u := mustParse(t, raw)
	q := u.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

func unique() string { return strings.ToLower(watermill.NewShortUUID()[:10]) }

func newMemory(t *testing.T) harness.StoreCase {
	s := open(t, "memory://")
	return harness.StoreCase{Spec: harness.StoreSpec{URL: "memory://"}, Shared: s, Inspect: s}
}

// newRemote serves the remote inbox protocol (package server, as inboxd
// does) over a memory store, on a loopback port, and returns the http://
// URL of the remote store. Consumers in other processes reach it too. It has
// no tokens and serves loopback only, so, as inboxd does there, it opens the
// admin extension (inboxctl) without a token.
func newRemote(t *testing.T) harness.StoreCase {
	backing := open(t, "memory://")
	return harness.StoreCase{Spec: harness.StoreSpec{URL: serveRemote(t, server.Config{Store: backing, LeaseMin: time.Second, AdminNoAuth: true})}, Inspect: backing}
}

// serveRemote serves cfg on a loopback port until the test ends and returns
// the service's http:// URL.
func serveRemote(t *testing.T, cfg server.Config) string {
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	return "http://" + ln.Addr().String() + "/"
}

func newRedis(t *testing.T) harness.StoreCase {
	prefix := "e2e:" + unique() + ":"
	direct := withParams(t, testenv.Redis.URL(t), "prefix", prefix, "retention", "1h")
	opts, err := redis.ParseURL(testenv.Redis.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c := redis.NewClient(opts)
		defer c.Close()
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+"*", 500).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("deleting the keys under %s: %v", prefix, err)
		}
	})
	sc := harness.StoreCase{Spec: harness.StoreSpec{URL: direct}, Inspect: open(t, direct)}
	return sc
}

// sqlKind is PostgreSQL or MariaDB, with the leased store or the
// transactional mode, in a new table per case.
func sqlKind(svc testenv.Service, tx bool) func(t *testing.T) harness.StoreCase {
	return func(t *testing.T) harness.StoreCase {
		base := svc.URL(t)
		table := "e2e_" + unique()
		direct := withParams(t, base, "table", table, "migrate", "true", "retention", "1h")
		inspect := open(t, direct)
		db := openDB(t, base)
		t.Cleanup(func() {
			for _, tb := range []string{table, table + "_order", table + "_ledger"} {
				if _, err := db.Exec("DROP TABLE IF EXISTS " + tb); err != nil {
					t.Errorf("dropping %s: %v", tb, err)
				}
			}
		})
		sc := harness.StoreCase{Spec: harness.StoreSpec{URL: direct}, Inspect: inspect}
		if tx {
			sc.Spec.Mode = "tx"
			sc.Ledger = newTableLedger(t, db, table+"_ledger")
		}
		return sc
	}
}

func newSQLite(tx bool) func(t *testing.T) harness.StoreCase {
	return func(t *testing.T) harness.StoreCase {
		path := filepath.Join(t.TempDir(), "inbox.db")
		direct := "sqlite://" + path + "?table=inbox&migrate=true&retention=1h"
		sc := harness.StoreCase{Spec: harness.StoreSpec{URL: direct}, Inspect: open(t, direct)}
		if tx {
			sc.Spec.Mode = "tx"
			db := openDB(t, direct)
			sc.Ledger = newTableLedger(t, db, "inbox_ledger")
		}
		return sc
	}
}

// sqlDB opens the database a store URL names, without the store's own
// parameters.
func sqlDB(raw string) (*sql.DB, sqlstore.Dialect, string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, "", "", err
	}
	q := u.Query()
	table := q.Get("table")
	if table == "" {
		table = sqlstore.DefaultTable
	}
	for _, p := range []string{"table", "migrate", "retention", "lease"} {
		q.Del(p)
	}
	u.RawQuery = q.Encode()
	switch u.Scheme {
	case "postgres", "postgresql":
		db, err := sql.Open("pgx", u.String())
		return db, sqlstore.Postgres, table, err
	case "mysql":
		cfg := mysql.NewConfig()
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
		cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, strings.TrimPrefix(u.Path, "/")
		cfg.ParseTime = true
		db, err := sql.Open("mysql", cfg.FormatDSN())
		return db, sqlstore.MySQL, table, err
	case "sqlite":
		db, err := sql.Open("sqlite", sqlitedialect.DSN(u.Path, 10*time.Second))
		if err == nil {
			db.SetMaxOpenConns(1) // SQLite has one writer: the transaction's connection
		}
		return db, sqlstore.SQLite, table, err
	}
	return nil, "", "", fmt.Errorf("no SQL database for scheme %q", u.Scheme)
}

func openDB(t *testing.T, raw string) *sql.DB {
	t.Helper()
	db, _, _, err := sqlDB(raw)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// tableLedger is the transactional mode's ledger: a table in the inbox's
// database, written by the handler through the message's transaction.
type tableLedger struct {
	db    *sql.DB
	table string
}

func newTableLedger(t *testing.T, db *sql.DB, table string) *tableLedger {
	t.Helper()
	if _, err := db.Exec(fmt.Sprintf("CREATE TABLE %s (id VARCHAR(255) NOT NULL)", table)); err != nil {
		t.Fatalf("creating the ledger table: %v", err)
	}
	return &tableLedger{db: db, table: table}
}

func (l *tableLedger) Counts(t testing.TB) map[string]int {
	t.Helper()
	rows, err := l.db.Query("SELECT id, COUNT(*) FROM " + l.table + " GROUP BY id")
	if err != nil {
		t.Fatalf("reading the ledger table: %v", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// txMode builds the inbox middleware over the SQL transactional store for a
// consumer: its effect is a row in the ledger table, inserted through the
// message's transaction.
func txMode(_ context.Context, spec harness.ConsumerSpec) (*harness.Inbox, error) {
	db, d, table, err := sqlDB(spec.Store.URL)
	if err != nil {
		return nil, err
	}
	txs, err := txinbox.New(txinbox.Config{DB: db, Dialect: d, Table: table, LockTimeout: 5 * time.Second})
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	outcomes := &harness.Outcomes{}
	ib, err := inboxmw.New(inboxmw.Config{
		Store: txs,
		Bus:   spec.Broker.Bus(), Group: spec.Group, IDSources: spec.IDSources(),
		MissingKey:  spec.MissingKey(),
		MaxBusyWait: spec.MaxBusyWait,
		Redelivery:  spec.Redelivery,
		Backoff:     spec.BackoffFunc(),
		Metrics:     outcomes,
		Logger:      outcomes.Logger(),
	})
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	insert := "INSERT INTO " + table + "_ledger (id) VALUES (?)"
	if d == sqlstore.Postgres {
		insert = "INSERT INTO " + table + "_ledger (id) VALUES ($1)"
	}
	return &harness.Inbox{
		Middleware: ib.Middleware,
		Effect: func(msg *message.Message, id string) error {
			tx, ok := txinbox.TxFromContext(msg.Context())
			if !ok {
				return fmt.Errorf("no transaction in the message context")
			}
			_, err := tx.ExecContext(msg.Context(), insert, id)
			return err
		},
		Outcomes: outcomes,
		Close: func(ctx context.Context) error {
			return errors.Join(ib.Close(ctx), txs.Close(), db.Close())
		},
	}, nil
}

// misconfiguredKinds are stores opened with check=false whose first call
// fails on a configuration mistake.
func misconfiguredKinds() []harness.StoreKind {
	return []harness.StoreKind{
		{Name: "postgres-no-table", New: func(t *testing.T) harness.StoreCase {
			u := withParams(t, testenv.Postgres.URL(t), "table", "missing_"+unique(), "check", "false")
			return harness.StoreCase{Spec: harness.StoreSpec{URL: u}}
		}},
		{Name: "redis-wrong-password", New: func(t *testing.T) harness.StoreCase {
			addr := redisWithPassword(t, "right-"+unique())
			return harness.StoreCase{Spec: harness.StoreSpec{URL: "redis://:wrong@" + addr + "/0?check=false"}}
		}},
		{Name: "remote-no-token", New: func(t *testing.T) harness.StoreCase {
			u := serveRemote(t, server.Config{Store: open(t, "memory://"), Tokens: []string{"e2e-token-" + unique()}})
			return harness.StoreCase{Spec: harness.StoreSpec{URL: u + "?check=false"}}
		}},
	}
}

// redisWithPassword starts a private redis-server (the shared one accepts
// any password) that requires password, and returns its address.
func redisWithPassword(t *testing.T, password string) string {
	t.Helper()
	testenv.Redis.URL(t) // skips (or fails, services required) without Redis
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server, needed for a Redis with a password: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	_ = ln.Close()
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--requirepass", password, "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	testenv.Eventually(t, 10*time.Second, "the private redis-server listening", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})
	return addr
}
