package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
)

// DefaultCleanupBatch is the number of rows one cleanup statement deletes
// when [Options.CleanupBatch] is zero.
const DefaultCleanupBatch = 1000

// Options configure a [Store].
type Options struct {
	// Dialect is the database the *sql.DB talks to. Required.
	Dialect Dialect

	// Table is the table's name, optionally "schema.table". Optional;
	// default [DefaultTable] ("inbox"). Checked with [ValidateTable].
	Table string

	// Retention is how long a processed key stays processed. Optional;
	// default inbox.DefaultRetention (7 days).
	Retention time.Duration

	// Lease is the lease granted when TryBegin asks for none. Optional;
	// default inbox.DefaultLease (30 s).
	Lease time.Duration

	// AutoMigrate makes [New] create the table and its index when they do
	// not exist, and add the columns a table of the earlier layout lacks
	// ([Store.Migrate]). Optional; default false: the table must exist (see
	// [DDL]).
	AutoMigrate bool

	// CleanupInterval is how often the janitor, a goroutine that New starts
	// and [Store.Close] stops, deletes expired rows ([Store.Cleanup]).
	// Optional; default [DefaultCleanupInterval] of the Retention: a tenth
	// of it, at most an hour (at least a second). A pass of the janitor
	// deletes until a statement deletes fewer than CleanupBatch rows; one
	// that runs for the whole interval is behind, and the next starts at
	// once. After each pass the janitor counts the expired rows left
	// ([Store.CleanupStats]).
	CleanupInterval time.Duration

	// DisableCleanup turns the janitor off: expired rows then stay in the
	// table (every read ignores them) until [Store.Cleanup] runs, from a
	// scheduler of your own or `inboxctl cleanup`. Optional; default false:
	// the janitor runs. It excludes a CleanupInterval.
	DisableCleanup bool

	// CleanupBatch bounds the rows one cleanup statement deletes, so that
	// cleanup never holds many locks or a long transaction. Optional;
	// default [DefaultCleanupBatch].
	CleanupBatch int

	// Timeout bounds each call, its wait in the batch queue included; a
	// call that has no answer by then fails with an error wrapping
	// inbox.ErrStoreUnavailable and context.DeadlineExceeded, and its round
	// trip is canceled once every call it carries has timed out. Optional;
	// default [DefaultTimeout] (10 s: longer than SQLite's busy timeout, so
	// that a locked database answers with its own error first); negative
	// means no bound.
	Timeout time.Duration

	// Logger receives the janitor's errors (error level), its passes that
	// fall behind (info) and its other passes that deleted rows (debug).
	// Optional; default no logging.
	Logger watermill.LoggerAdapter

	// batch, when set (tests and benchmarks), replaces the dialect's
	// batching bounds.
	batch *driver.Batch
}

func (o *Options) setDefaults() {
	if o.Table == "" {
		o.Table = DefaultTable
	}
	if o.Retention == 0 {
		o.Retention = inbox.DefaultRetention
	}
	if o.Lease == 0 {
		o.Lease = inbox.DefaultLease
	}
	if o.CleanupBatch == 0 {
		o.CleanupBatch = DefaultCleanupBatch
	}
	if o.CleanupInterval == 0 && !o.DisableCleanup {
		o.CleanupInterval = DefaultCleanupInterval(o.Retention)
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Logger == nil {
		o.Logger = watermill.NopLogger{}
	}
}

// DefaultTimeout is the default of Options.Timeout.
const DefaultTimeout = 10 * time.Second

// Validate reports whether o is usable after defaults. Errors wrap
// [inbox.ErrInvalidArgument].
func (o Options) Validate() error {
	if err := o.Dialect.Validate(); err != nil {
		return err
	}
	if err := ValidateTable(o.Table); err != nil {
		return err
	}
	switch {
	case o.Retention < time.Millisecond:
		return fmt.Errorf("%w: sql store: Retention %s is below the 1ms the store can keep", inbox.ErrInvalidArgument, o.Retention)
	case o.Lease < time.Millisecond:
		return fmt.Errorf("%w: sql store: Lease %s is below the 1ms the store can keep", inbox.ErrInvalidLease, o.Lease)
	case o.CleanupInterval < 0:
		return fmt.Errorf("%w: sql store: CleanupInterval %s is negative", inbox.ErrInvalidArgument, o.CleanupInterval)
	case o.DisableCleanup && o.CleanupInterval != 0:
		return fmt.Errorf("%w: sql store: CleanupInterval %s with DisableCleanup: the janitor is either off or runs at an interval", inbox.ErrInvalidArgument, o.CleanupInterval)
	case o.CleanupBatch < 1:
		return fmt.Errorf("%w: sql store: CleanupBatch %d must be positive", inbox.ErrInvalidArgument, o.CleanupBatch)
	}
	return nil
}

// Store is the SQL [inbox.LeaseStore] and [inbox.Admin]. It is safe for
// concurrent use. Its methods are those of the portable layer it embeds,
// [driver.Store] (TryBegin, Complete, Release, Fail, Extend, Get,
// IsProcessed, MarkProcessed, List, Forget, ForceRelease, Retention,
// BatchStats, Close; KeepsOrder, Order and ReleaseOrder: the store keeps
// the order of order keys on PostgreSQL, and elsewhere an OrderKey fails
// with [inbox.ErrNotSupported]), with
// the contracts of [inbox.LeaseStore] and [inbox.Admin], and its own
// below.
type Store struct {
	*driver.Store
	d *sqlDriver
}

var (
	_ inbox.LeaseStore = (*Store)(nil)
	_ inbox.Admin      = (*Store)(nil)
)

// sqlDriver is the store's [driver.Driver]: the statements of one table.
type sqlDriver struct {
	db   *sql.DB
	opts Options
	q    queries
	txq  txQueries // BeginTxClaim's

	// returning is true when a claim is one statement: always on
	// PostgreSQL and SQLite, on MariaDB 10.5+; false on MySQL. On MySQL and
	// MariaDB it and q are known once prepare has asked the server its
	// version: at New, or at the first call of a store opened with
	// check=false.
	returning bool
	ready     atomic.Bool
	prepMu    sync.Mutex
	// ownsDB makes Close close db (stores opened by URL).
	ownsDB bool
	// onCleanupBatch, when set (tests), sees the rows each cleanup
	// statement deleted.
	onCleanupBatch func(n int64)
	stats          cleanupStats

	// stmts holds prepared statements on SQLite, whose driver would
	// otherwise parse every statement anew (query -> *sql.Stmt).
	stmts sync.Map

	closed atomic.Bool // set by Close, which the layer calls once
	stop   context.CancelFunc
	done   chan struct{}
}

// New returns a store over db, which must be open on a database of
// opts.Dialect, whose package the program imports (see [Dialect]: New
// refuses a dialect that is not linked). It asks a MySQL-protocol server
// for its version (to tell MariaDB from MySQL) and, with
// [Options.AutoMigrate], creates the table; ctx bounds that work. The store
// does not close db.
//
// On MySQL and MariaDB, open db with parseTime=true and clientFoundRows=true
// (the URL opener does): the store does not depend on them for correctness,
// but they are the settings it is tested with. On SQLite, set a busy
// timeout and immediate transactions (the DSN of sqlitedialect.DSN does),
// and limit the pool to one connection (db.SetMaxOpenConns(1)): SQLite has
// one writer at a time, and waiting in the pool is cheaper than SQLite's
// busy loop.
func New(ctx context.Context, db *sql.DB, opts Options) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: sql store: db is nil", inbox.ErrInvalidArgument)
	}
	opts.setDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s, err := newStore(db, opts)
	if err != nil {
		return nil, err
	}
	if err := s.d.prepare(ctx); err != nil {
		return nil, err
	}
	if opts.AutoMigrate {
		if err := s.Migrate(ctx); err != nil {
			return nil, err
		}
	}
	if !opts.DisableCleanup {
		s.d.startJanitor()
	}
	return s, nil
}

// newStore makes the store without contacting the server (opts has its
// defaults and is valid).
func newStore(db *sql.DB, opts Options) (*Store, error) {
	d := &sqlDriver{db: db, opts: opts, txq: buildTxQueries(opts.Dialect, opts.Table), returning: opts.Dialect != MySQL}
	if opts.Dialect != MySQL {
		d.q = buildQueries(opts.Dialect, opts.Table, d.returning)
		d.ready.Store(true)
	}
	b := batchBounds(opts.Dialect)
	if opts.batch != nil {
		b = *opts.batch
	}
	ds, err := driver.New(d, driver.Config{Name: "sql store (" + string(opts.Dialect) + ")", Lease: opts.Lease, Retention: opts.Retention, Batch: b, Timeout: opts.Timeout,
		Order: opts.Dialect == Postgres})
	if err != nil {
		return nil, err
	}
	return &Store{Store: ds, d: d}, nil
}

// prepare asks a MySQL-protocol server its version, once it answers, and
// builds the statements that depend on it (MariaDB has RETURNING, MySQL
// does not). Every call of the driver goes through it; on PostgreSQL and
// SQLite it has nothing to do.
func (d *sqlDriver) prepare(ctx context.Context) error {
	if d.ready.Load() {
		return nil
	}
	d.prepMu.Lock()
	defer d.prepMu.Unlock()
	if d.ready.Load() {
		return nil
	}
	var version string
	if err := d.db.QueryRowContext(ctx, versionQuery).Scan(&version); err != nil {
		return d.wrap(ctx, "asking the server version", err)
	}
	d.returning = mariaDBReturning(version)
	d.q = buildQueries(d.opts.Dialect, d.opts.Table, d.returning)
	d.ready.Store(true)
	return nil
}

// versionQuery asks a MySQL-protocol server its version (see
// mariaDBReturning).
const versionQuery = "SELECT VERSION()"

// mariaDBReturning reports whether a server version string is MariaDB 10.5
// or later, which has INSERT ... RETURNING.
func mariaDBReturning(version string) bool {
	if !strings.Contains(strings.ToLower(version), "mariadb") {
		return false
	}
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return major > 10 || (major == 10 && minor >= 5)
}

// Dialect returns the store's dialect.
func (s *Store) Dialect() Dialect { return s.d.opts.Dialect }

// Table returns the store's table name.
func (s *Store) Table() string { return s.d.opts.Table }

// Close makes every later call fail with [inbox.ErrClosed], stops the
// janitor and frees the prepared statements. It closes the *sql.DB only
// when the store opened it (stores opened by URL). Closing twice is a no-op.
func (s *Store) Close() error { return s.Store.Close() }

// Close implements [driver.Driver]; [Store.Close] (the layer's) calls it
// once. It stops the janitor and frees the prepared statements; it closes
// the *sql.DB only when the store opened it (stores opened by URL).
func (d *sqlDriver) Close() error {
	d.closed.Store(true)
	if d.stop != nil {
		d.stop()
		<-d.done
	}
	d.stmts.Range(func(k, v any) bool {
		_ = v.(*sql.Stmt).Close()
		d.stmts.Delete(k)
		return true
	})
	if d.ownsDB {
		return d.db.Close()
	}
	return nil
}

// enter checks, for the store's own methods that the layer does not carry
// (Migrate, Cleanup, BeginTxClaim), that the store is open and ctx live.
func (d *sqlDriver) enter(ctx context.Context, op string) error {
	if d.closed.Load() {
		return fmt.Errorf("sql store: %s: %w", op, inbox.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sql store: %s: %w", op, err)
	}
	return d.prepare(ctx)
}

func us(d time.Duration) int64 { return d.Microseconds() }

// stmt returns a prepared statement for q on SQLite, nil elsewhere (pgx
// caches statements itself; go-sql-driver interpolates parameters) or when
// preparing failed (the caller then runs q unprepared and reports its error).
// It takes a connection of the pool: never call it while holding one (in a
// transaction), since SQLite's pool has one.
func (d *sqlDriver) stmt(ctx context.Context, q string) *sql.Stmt {
	if d.opts.Dialect != SQLite {
		return nil
	}
	if v, ok := d.stmts.Load(q); ok {
		return v.(*sql.Stmt)
	}
	st, err := d.db.PrepareContext(ctx, q)
	if err != nil {
		return nil
	}
	if v, loaded := d.stmts.LoadOrStore(q, st); loaded {
		_ = st.Close()
		return v.(*sql.Stmt)
	}
	return st
}

func (d *sqlDriver) queryRow(ctx context.Context, q string, args ...any) *sql.Row {
	if st := d.stmt(ctx, q); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return d.db.QueryRowContext(ctx, q, args...)
}

func (d *sqlDriver) execStmt(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if st := d.stmt(ctx, q); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return d.db.ExecContext(ctx, q, args...)
}

func (d *sqlDriver) inTx(ctx context.Context, f func(tx *sql.Tx) error) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// exec runs a statement and returns the rows it matched.
func (d *sqlDriver) exec(ctx context.Context, query string, args ...any) (int64, error) {
	var n int64
	err := retryDeadlocks(ctx, func() error {
		res, err := d.execStmt(ctx, query, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n, err
}

// Extend implements [driver.Driver].
func (d *sqlDriver) Extend(ctx context.Context, key, leaseID string, lease time.Duration) (time.Time, error) {
	if err := d.prepare(ctx); err != nil {
		return time.Time{}, err
	}
	var (
		until   time.Time
		untilOK bool
		found   = true
	)
	var err error
	if d.opts.Dialect == MySQL {
		// No UPDATE ... RETURNING: update and read back in one transaction.
		err = retryDeadlocks(ctx, func() error {
			found = true
			return d.inTx(ctx, func(tx *sql.Tx) error {
				res, err := tx.ExecContext(ctx, d.q.extend, us(lease), us(lease+d.opts.Retention), key, leaseBytes(leaseID))
				if err != nil {
					return err
				}
				if n, err := res.RowsAffected(); err != nil || n != 1 {
					found = false
					return err
				}
				return tx.QueryRowContext(ctx, d.q.selectLeaseUntil, key).Scan(d.timeDest(&until, &untilOK))
			})
		})
	} else {
		err = retryDeadlocks(ctx, func() error {
			found = true
			err := d.queryRow(ctx, d.q.extend, key, leaseBytes(leaseID), us(lease), us(lease+d.opts.Retention)).Scan(d.timeDest(&until, &untilOK))
			if errors.Is(err, sql.ErrNoRows) {
				found = false
				return nil
			}
			return err
		})
	}
	if err != nil {
		return time.Time{}, d.fault(err)
	}
	if !found {
		return time.Time{}, fmt.Errorf("%w: not held by lease %q (taken over, released, processed, or unknown)", inbox.ErrLeaseLost, leaseID)
	}
	return until, nil
}

// Get implements [driver.Driver].
func (d *sqlDriver) Get(ctx context.Context, key string) (inbox.Record, error) {
	if err := d.prepare(ctx); err != nil {
		return inbox.Record{}, err
	}
	var r recordRow
	err := retryDeadlocks(ctx, func() error {
		return d.queryRow(ctx, d.q.get, key).Scan(d.recordDests(&r)...)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return inbox.Record{}, nil
	}
	if err != nil {
		return inbox.Record{}, d.fault(err)
	}
	rec, _ := r.record()
	return rec, nil
}
