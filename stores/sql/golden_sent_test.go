package sqlstore_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	inboxdriver "github.com/watermill-inbox/inbox/stores/driver"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	"github.com/watermill-inbox/inbox/stores/sql/internal/sqltest"
	sqlitedialect "github.com/watermill-inbox/inbox/stores/sql/sqlite"
)

// The golden files hold what the store sends: a workload that calls every
// method of the store, with batches of each shape the golden files show,
// runs through a database/sql driver that records each statement's text.
// Every statement sent (its table's name read as the default one) is a
// statement of the dialect's golden file, and every statement of the file
// was sent. SQLite runs in process; PostgreSQL and MariaDB are the test
// services (the MySQL file is the MariaDB run and the MySQL 8 path's).
func TestGolden_statements_are_those_sent(t *testing.T) {
	files := map[sqlstore.Dialect]sqlstore.GoldenFile{}
	for _, f := range sqlstore.GoldenFiles() {
		files[f.Dialect] = f
	}
	runs := map[sqlstore.Dialect][]backend{}
	for _, b := range backends {
		runs[b.dialect] = append(runs[b.dialect], b)
	}
	for _, d := range []sqlstore.Dialect{sqlstore.Postgres, sqlstore.MySQL, sqlstore.SQLite} {
		f := files[d]
		t.Run(f.Name, func(t *testing.T) {
			t.Parallel()
			rec := &recorder{sent: map[string]bool{}}
			skipped := false
			for _, b := range runs[d] {
				t.Run(b.name, func(t *testing.T) {
					defer func() { skipped = skipped || t.Skipped() }()
					sendEverything(t, b, rec)
				})
			}
			if skipped {
				t.Skip("a database of the file was not available: its statements were not all sent")
			}
			if t.Failed() {
				return
			}
			golden := map[string]string{}
			for _, s := range f.Statements {
				golden[s.SQL] = s.Name
			}
			t.Logf("%d distinct statements sent; testdata/%s holds %d statements, %d distinct", len(rec.sorted()), f.Name, len(f.Statements), len(golden))
			for _, q := range rec.sorted() {
				if _, ok := golden[q]; !ok {
					t.Errorf("sent, but not in testdata/%s:\n%s", f.Name, q)
				}
			}
			for _, s := range f.Statements {
				if !rec.sent[s.SQL] {
					t.Errorf("statement %q of testdata/%s was not sent by the workload", s.Name, f.Name)
				}
			}
		})
	}
}

// sendEverything runs the workload on b's database, recording the
// statements in rec with the tables' names replaced by the default one.
func sendEverything(t *testing.T, b backend, rec *recorder) {
	ctx := ctxT(t)
	var (
		plain     *sql.DB
		name, dsn string
	)
	switch b.dialect {
	case sqlstore.Postgres:
		plain, name, dsn = b.open(t), "pgx", testenv.Postgres.URL(t)
	case sqlstore.MySQL:
		plain, name, dsn = b.open(t), "mysql", sqltest.MySQLDSN(t, testenv.MySQL.URL(t))
	default:
		path := sqltest.SQLiteFile(t)
		plain, name, dsn = sqltest.OpenSQLiteFile(t, path), "sqlite", sqlitedialect.DSN(path, 10*time.Second)
	}
	table, earlier := newTable(t, plain, b.dialect), newTable(t, plain, b.dialect)
	loadEarlier(t, plain, b.dialect, earlier, time.Now())
	if _, err := plain.ExecContext(ctx, "ALTER TABLE "+earlier+" DROP COLUMN reason"); err != nil {
		t.Fatalf("dropping reason from %s: %v", earlier, err)
	}
	db := rec.open(t, name, dsn, strings.NewReplacer(table, sqlstore.DefaultTable, earlier, sqlstore.DefaultTable))
	if b.dialect == sqlstore.SQLite {
		db.SetMaxOpenConns(1)
	}
	open := func(table string) *sqlstore.Store {
		s, err := sqlstore.New(ctx, db, sqlstore.Options{Dialect: b.dialect, Table: table, AutoMigrate: true, Retention: time.Hour, DisableCleanup: b.mysql8})
		if err != nil {
			t.Fatalf("New on %s: %v", table, err)
		}
		t.Cleanup(func() { _ = s.Close() })
		if b.mysql8 {
			sqlstore.UseMySQL8Path(s)
		}
		return s
	}
	_ = open(earlier) // Migrate of the earliest layout, and its upgrade
	s := open(table)
	check := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	n := 0
	key := func() string { n++; return fmt.Sprintf("sent:%03d", n) }
	claim := func() (string, string) {
		t.Helper()
		k := key()
		c, err := s.TryBegin(ctx, k, inbox.BeginOptions{})
		if err != nil || c.Status != inbox.Acquired {
			t.Fatalf("TryBegin(%q): %+v, %v", k, c, err)
		}
		return k, c.LeaseID
	}
	apply := func(ops ...inboxdriver.Op) {
		t.Helper()
		if _, _, err := sqlstore.Apply(ctx, s, ops); err != nil {
			t.Fatalf("Apply(%+v): %v", ops, err)
		}
	}
	op := func(kind inboxdriver.Kind, k, leaseID string) inboxdriver.Op {
		o := inboxdriver.Op{Kind: kind, Key: k, LeaseID: leaseID, Lease: time.Minute}
		if kind == inboxdriver.Fail {
			o.Failure = inbox.FailOptions{Reason: "r", RetryAfter: time.Minute}
		}
		return o
	}
	held := func(kind inboxdriver.Kind) inboxdriver.Op { k, l := claim(); return op(kind, k, l) }

	// Calls alone in their batches.
	k, l := claim()
	_, err := s.Extend(ctx, k, l, time.Minute)
	check("Extend", err)
	check("Complete", s.Complete(ctx, k, l))
	if err := s.Complete(ctx, k, "another lease"); err == nil {
		t.Fatal("Complete by another lease succeeded")
	}
	k, l = claim()
	check("Release", s.Release(ctx, k, l))
	k, l = claim()
	check("Fail", s.Fail(ctx, k, l, inbox.FailOptions{Reason: "r", RetryAfter: time.Minute}))
	check("MarkProcessed", s.MarkProcessed(ctx, key()))
	_, err = s.Get(ctx, k)
	check("Get", err)
	_, err = s.IsProcessed(ctx, k)
	check("IsProcessed", err)
	for _, o := range []inbox.ListOptions{{}, {Prefix: "bus:group:"}, {Prefix: "bus:group:", Cursor: "bus:group:a:1"},
		{State: inbox.StateProcessed}, {State: inbox.StateDead}, {State: inbox.StateInProgress}, {State: inbox.StateAvailable},
		{OlderThan: time.Hour}} {
		_, err := s.List(ctx, o)
		check("List", err)
	}
	k, _ = claim()
	check("ForceRelease", s.ForceRelease(ctx, k))
	check("Forget", s.Forget(ctx, k))
	_, err = s.Cleanup(ctx)
	check("Cleanup", err)
	_, err = s.Backlog(ctx)
	check("Backlog", err)

	// Batches of 3 of one kind, and waves of one of a kind with another.
	for _, kind := range []inboxdriver.Kind{inboxdriver.Claim, inboxdriver.Mark} {
		apply(op(kind, key(), "l1"), op(kind, key(), "l2"), op(kind, key(), "l3"))
	}
	for _, kind := range []inboxdriver.Kind{inboxdriver.Complete, inboxdriver.Release, inboxdriver.Fail} {
		apply(held(kind), held(kind), held(kind))
		apply(op(inboxdriver.Mark, key(), ""), held(kind))
	}
	// On PostgreSQL a wave is one statement per set of kinds: every set.
	if b.dialect == sqlstore.Postgres {
		for mask := 1; mask < 32; mask++ {
			var ops []inboxdriver.Op
			for kind := inboxdriver.Claim; kind <= inboxdriver.Fail; kind++ {
				if mask&(1<<(kind-inboxdriver.Claim)) != 0 {
					ops = append(ops, op(kind, key(), "l"))
				}
			}
			if len(ops) == 1 { // a batch of one is not a wave
				ops = append(ops, op(ops[0].Kind, key(), "l"))
			}
			apply(ops...)
		}
	}

	// On PostgreSQL, the order of order keys: a gate opened by a Fail,
	// a key queued behind it, the head released, the next key processed
	// (the gate removed), and a batch mixing ops with and without one.
	if b.dialect == sqlstore.Postgres {
		ok := key()
		begin := func(k string, want inbox.Status) inbox.Claim {
			t.Helper()
			c, err := s.TryBegin(ctx, k, inbox.BeginOptions{OrderKey: ok})
			if err != nil || c.Status != want {
				t.Fatalf("TryBegin(%q) with an OrderKey: %+v, %v; want %v", k, c, err, want)
			}
			return c
		}
		head, next := key(), key()
		c := begin(head, inbox.Acquired)
		check("Fail with an OrderKey", s.Fail(ctx, head, c.LeaseID, inbox.FailOptions{Dead: true, OrderKey: ok}))
		begin(next, inbox.Behind)
		_, err := s.Order(ctx, ok)
		check("Order", err)
		check("ReleaseOrder", s.ReleaseOrder(ctx, ok, head))
		c = begin(next, inbox.Acquired)
		check("Complete", s.Complete(ctx, next, c.LeaseID))
		_, err = s.Order(ctx, ok)
		check("Order", err)
		o := op(inboxdriver.Claim, key(), "l")
		o.OrderKey = ok
		apply(op(inboxdriver.Mark, key(), ""), o, op(inboxdriver.Mark, key(), ""))
	}

	// The transactional mode: a new key, a processed one, and one whose
	// lease was released (its row removed, then claimed).
	txClaim := func(k string, wantProcessed bool) {
		t.Helper()
		tx, end, processed, err := s.BeginTxClaim(ctx, k, sqlstore.TxClaimOptions{LockTimeout: 10 * time.Second})
		if err != nil || processed != wantProcessed {
			t.Fatalf("BeginTxClaim(%q): processed %v, %v; want processed %v", k, processed, err, wantProcessed)
		}
		if tx != nil {
			check("commit", end(true))
		}
	}
	k = key()
	txClaim(k, false)
	txClaim(k, true)
	k, l = claim()
	check("Release", s.Release(ctx, k, l))
	txClaim(k, false)
}

// recorder is a database/sql driver's wrapper that records the text of
// every statement run or prepared.
type recorder struct {
	mu      sync.Mutex
	sent    map[string]bool
	replace *strings.Replacer
}

func (r *recorder) add(query string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.replace != nil {
		query = r.replace.Replace(query)
	}
	r.sent[query] = true
}

func (r *recorder) sorted() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	qs := make([]string, 0, len(r.sent))
	for q := range r.sent {
		qs = append(qs, q)
	}
	sort.Strings(qs)
	return qs
}

// open opens dsn with the registered driver name, recording the statements
// of the returned database with replace applied.
func (r *recorder) open(t *testing.T, name, dsn string, replace *strings.Replacer) *sql.DB {
	t.Helper()
	probe, err := sql.Open(name, dsn)
	if err != nil {
		t.Fatal(err)
	}
	drv := probe.Driver()
	_ = probe.Close()
	c := &recConnector{drv: drv, dsn: dsn, rec: r}
	if dc, ok := drv.(driver.DriverContext); ok {
		if c.inner, err = dc.OpenConnector(dsn); err != nil {
			t.Fatal(err)
		}
	}
	r.mu.Lock()
	r.replace = replace // the runs of one recorder are sequential
	r.mu.Unlock()
	db := sql.OpenDB(c)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

type recConnector struct {
	drv   driver.Driver
	inner driver.Connector // nil: drv.Open(dsn)
	dsn   string
	rec   *recorder
}

func (c *recConnector) Connect(ctx context.Context) (driver.Conn, error) {
	var (
		conn driver.Conn
		err  error
	)
	if c.inner != nil {
		conn, err = c.inner.Connect(ctx)
	} else {
		conn, err = c.drv.Open(c.dsn)
	}
	if err != nil {
		return nil, err
	}
	return &recConn{Conn: conn, rec: c.rec}, nil
}

func (c *recConnector) Driver() driver.Driver { return c.drv }

// recConn records the statements of its connection and forwards every
// optional interface database/sql uses.
type recConn struct {
	driver.Conn
	rec *recorder
}

func (c *recConn) Prepare(query string) (driver.Stmt, error) {
	c.rec.add(query)
	return c.Conn.Prepare(query)
}

func (c *recConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	c.rec.add(query)
	if p, ok := c.Conn.(driver.ConnPrepareContext); ok {
		return p.PrepareContext(ctx, query)
	}
	return c.Conn.Prepare(query)
}

func (c *recConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	q, ok := c.Conn.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip // database/sql prepares it
	}
	c.rec.add(query)
	return q.QueryContext(ctx, query, args)
}

func (c *recConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := c.Conn.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	c.rec.add(query)
	return e.ExecContext(ctx, query, args)
}

func (c *recConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if b, ok := c.Conn.(driver.ConnBeginTx); ok {
		return b.BeginTx(ctx, opts)
	}
	//lint:ignore SA1019 database/sql falls back to Begin too
	return c.Conn.Begin()
}

func (c *recConn) CheckNamedValue(v *driver.NamedValue) error {
	if n, ok := c.Conn.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(v)
	}
	return driver.ErrSkip
}

func (c *recConn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *recConn) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *recConn) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}
