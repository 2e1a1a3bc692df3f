package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox"
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
	// not exist ([Store.Migrate]). Optional; default false: the table must
	// exist (see [DDL]).
	AutoMigrate bool

	// CleanupInterval, when positive, starts a janitor that runs
	// [Store.Cleanup] at this interval until [Store.Close]. Optional;
	// default zero (no janitor: call Cleanup from your own scheduler, or
	// leave expired rows, which every read already ignores).
	CleanupInterval time.Duration

	// CleanupBatch bounds the rows one cleanup statement deletes, so that
	// cleanup never holds many locks or a long transaction. Optional;
	// default [DefaultCleanupBatch].
	CleanupBatch int

	// Logger receives the janitor's errors. Optional; default no logging.
	Logger watermill.LoggerAdapter
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
	if o.Logger == nil {
		o.Logger = watermill.NopLogger{}
	}
}

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
	case o.CleanupBatch < 1:
		return fmt.Errorf("%w: sql store: CleanupBatch %d must be positive", inbox.ErrInvalidArgument, o.CleanupBatch)
	}
	return nil
}

// Store is the SQL [inbox.LeaseStore]. It is safe for concurrent use.
type Store struct {
	db   *sql.DB
	opts Options
	q    queries
	txq  txQueries // BeginTxClaim's

	// returning is true when TryBegin is one statement: always on
	// PostgreSQL and SQLite, on MariaDB 10.5+; false on MySQL.
	returning bool
	// ownsDB makes Close close db (stores opened by URL).
	ownsDB bool
	// onBatch, when set (tests), sees the rows each cleanup statement
	// deleted.
	onBatch func(n int64)

	// stmts holds prepared statements on SQLite, whose driver would
	// otherwise parse every statement anew (query -> *sql.Stmt).
	stmts sync.Map

	mu     sync.Mutex
	closed bool
	stop   context.CancelFunc
	done   chan struct{}
}

var _ inbox.LeaseStore = (*Store)(nil)

// New returns a store over db, which must be open on a database of
// opts.Dialect. It asks a MySQL-protocol server for its version (to tell
// MariaDB from MySQL) and, with [Options.AutoMigrate], creates the table;
// ctx bounds that work. The store does not close db.
//
// On MySQL and MariaDB, open db with parseTime=true and clientFoundRows=true
// (the URL opener does): the store does not depend on them for correctness,
// but they are the settings it is tested with. On SQLite, set a busy
// timeout and immediate transactions, and limit the pool to one connection
// (db.SetMaxOpenConns(1)): SQLite has one writer at a time, and waiting in
// the pool is cheaper than SQLite's busy loop. See the package documentation.
func New(ctx context.Context, db *sql.DB, opts Options) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: sql store: db is nil", inbox.ErrInvalidArgument)
	}
	opts.setDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &Store{db: db, opts: opts, q: buildQueries(opts.Dialect, opts.Table), txq: buildTxQueries(opts.Dialect, opts.Table), returning: opts.Dialect != MySQL}
	if opts.Dialect == MySQL {
		var version string
		if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
			return nil, s.wrap(ctx, "asking the server version", err)
		}
		s.returning = mariaDBReturning(version)
		if s.returning {
			s.q.tryBegin += "\nRETURNING state, lease_id, lease_until, attempts, payload_hash, last_seen, UTC_TIMESTAMP(6)"
		}
	}
	if opts.AutoMigrate {
		if err := s.Migrate(ctx); err != nil {
			return nil, err
		}
	}
	if opts.CleanupInterval > 0 {
		s.startJanitor()
	}
	return s, nil
}

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
func (s *Store) Dialect() Dialect { return s.opts.Dialect }

// Table returns the store's table name.
func (s *Store) Table() string { return s.opts.Table }

// Close stops the janitor and makes every later call fail with
// [inbox.ErrClosed]. It closes the *sql.DB only when the store opened it
// (stores opened by URL).
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	stop, done := s.stop, s.done
	s.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
	s.stmts.Range(func(k, v any) bool {
		_ = v.(*sql.Stmt).Close()
		s.stmts.Delete(k)
		return true
	})
	if s.ownsDB {
		return s.db.Close()
	}
	return nil
}

func (s *Store) enter(ctx context.Context, op string) error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return fmt.Errorf("sql store: %s: %w", op, inbox.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sql store: %s: %w", op, err)
	}
	return nil
}

func us(d time.Duration) int64 { return d.Microseconds() }

// stmt returns a prepared statement for q on SQLite, nil elsewhere (pgx
// caches statements itself; go-sql-driver interpolates parameters) or when
// preparing failed (the caller then runs q unprepared and reports its error).
func (s *Store) stmt(ctx context.Context, q string) *sql.Stmt {
	if s.opts.Dialect != SQLite {
		return nil
	}
	if v, ok := s.stmts.Load(q); ok {
		return v.(*sql.Stmt)
	}
	st, err := s.db.PrepareContext(ctx, q)
	if err != nil {
		return nil
	}
	if v, loaded := s.stmts.LoadOrStore(q, st); loaded {
		_ = st.Close()
		return v.(*sql.Stmt)
	}
	return st
}

func (s *Store) queryRow(ctx context.Context, q string, args ...any) *sql.Row {
	if st := s.stmt(ctx, q); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return s.db.QueryRowContext(ctx, q, args...)
}

func (s *Store) execStmt(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if st := s.stmt(ctx, q); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return s.db.ExecContext(ctx, q, args...)
}

func (s *Store) leaseFor(d time.Duration) time.Duration {
	if d == 0 {
		return s.opts.Lease
	}
	return d
}

// TryBegin implements [inbox.LeaseStore]. A retry by the lease's holder (the
// same [inbox.BeginOptions.LeaseID]) renews the lease for the requested
// length from now.
func (s *Store) TryBegin(ctx context.Context, key string, opts inbox.BeginOptions) (inbox.Claim, error) {
	if err := inbox.ValidateKey(key); err != nil {
		return inbox.Claim{}, err
	}
	if err := opts.Validate(); err != nil {
		return inbox.Claim{}, err
	}
	if err := s.enter(ctx, "TryBegin"); err != nil {
		return inbox.Claim{}, err
	}
	lease := s.leaseFor(opts.Lease)
	leaseID := opts.LeaseID
	if leaseID == "" {
		leaseID = inbox.NewLeaseID()
	}
	args := []any{key, leaseID, opts.Owner, us(lease), opts.PayloadHash, us(lease + s.opts.Retention)}

	var (
		state, attempts        int
		gotID, hash            string
		until, last, now       time.Time
		untilOK, lastOK, nowOK bool
	)
	dest := []any{&state, &gotID, s.timeDest(&until, &untilOK), &attempts, &hash, s.timeDest(&last, &lastOK), s.timeDest(&now, &nowOK)}
	var errTryBegin error
	if s.returning {
		errTryBegin = s.retry(ctx, func() error {
			return s.queryRow(ctx, s.q.tryBegin, args...).Scan(dest...)
		})
	} else {
		errTryBegin = s.retry(ctx, func() error {
			return s.inTx(ctx, func(tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, s.q.tryBegin, args...); err != nil {
					return err
				}
				return tx.QueryRowContext(ctx, s.q.selectLocked, key).Scan(dest...)
			})
		})
	}
	if errTryBegin != nil {
		return inbox.Claim{}, s.wrap(ctx, "TryBegin", errTryBegin)
	}
	mismatch := opts.PayloadHash != "" && hash != "" && hash != opts.PayloadHash
	switch {
	case state == stateProcessed:
		return inbox.Claim{Status: inbox.Processed, PayloadMismatch: mismatch}, nil
	case gotID == leaseID:
		// The statement acquired or renewed: a row held by the caller's
		// lease id is always written from now.
		return inbox.Claim{Status: inbox.Acquired, LeaseID: leaseID, ExpiresAt: until, Lease: lease, PayloadMismatch: mismatch}, nil
	default:
		// The clock was read when the statement began, and the statement may
		// have waited for the holder's row lock since: the holder's write
		// (its last_seen) happened before this reading, whatever the clock
		// says.
		if lastOK && last.After(now) {
			now = last
		}
		return inbox.Claim{Status: inbox.Busy, ExpiresAt: until, RetryAfter: max(until.Sub(now), time.Microsecond), PayloadMismatch: mismatch}, nil
	}
}

const (
	stateOpen      = 0
	stateProcessed = 1
)

func (s *Store) inTx(ctx context.Context, f func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// exec runs an UPDATE and returns the rows it matched.
func (s *Store) exec(ctx context.Context, query string, args ...any) (int64, error) {
	var n int64
	err := s.retry(ctx, func() error {
		res, err := s.execStmt(ctx, query, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n, err
}

// Complete implements [inbox.LeaseStore].
func (s *Store) Complete(ctx context.Context, key, leaseID string) error {
	if err := inbox.ValidateHolder(key, leaseID); err != nil {
		return err
	}
	if err := s.enter(ctx, "Complete"); err != nil {
		return err
	}
	args := []any{key, leaseID, us(s.opts.Retention)}
	if s.opts.Dialect == MySQL {
		args = []any{us(s.opts.Retention), key, leaseID}
	}
	n, err := s.exec(ctx, s.q.complete, args...)
	if err != nil {
		return s.wrap(ctx, "Complete", err)
	}
	if n == 1 {
		return nil
	}
	if s.opts.Dialect == MySQL {
		// Without clientFoundRows a repeated Complete changes nothing and
		// reports no row: ask whether this lease completed the key.
		var (
			state        int
			gotID        string
			expires, now time.Time
			expOK, nowOK bool
		)
		err := s.db.QueryRowContext(ctx, s.q.holder, key).Scan(&state, &gotID, s.timeDest(&expires, &expOK), s.timeDest(&now, &nowOK))
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return s.wrap(ctx, "Complete", err)
		case state == stateProcessed && gotID == leaseID && expires.After(now):
			return nil
		}
	}
	return fmt.Errorf("%w: key %q is not held by lease %q (expired and taken over, released, completed by another lease, or unknown)", inbox.ErrLeaseLost, key, leaseID)
}

// Release implements [inbox.LeaseStore].
func (s *Store) Release(ctx context.Context, key, leaseID string) error {
	if err := inbox.ValidateHolder(key, leaseID); err != nil {
		return err
	}
	if err := s.enter(ctx, "Release"); err != nil {
		return err
	}
	args := []any{key, leaseID, us(s.opts.Retention)}
	if s.opts.Dialect == MySQL {
		args = []any{us(s.opts.Retention), key, leaseID}
	}
	n, err := s.exec(ctx, s.q.release, args...)
	if err != nil {
		return s.wrap(ctx, "Release", err)
	}
	if n != 1 {
		return fmt.Errorf("%w: key %q is not held by lease %q (taken over, released, processed, or unknown)", inbox.ErrLeaseLost, key, leaseID)
	}
	return nil
}

// Extend implements [inbox.LeaseStore].
func (s *Store) Extend(ctx context.Context, key, leaseID string, lease time.Duration) (time.Time, error) {
	if err := inbox.ValidateHolder(key, leaseID); err != nil {
		return time.Time{}, err
	}
	if err := inbox.ValidateLease(lease); err != nil {
		return time.Time{}, err
	}
	if err := s.enter(ctx, "Extend"); err != nil {
		return time.Time{}, err
	}
	var (
		until   time.Time
		untilOK bool
		found   = true
	)
	var err error
	if s.opts.Dialect == MySQL {
		// No UPDATE ... RETURNING: update and read back in one transaction.
		err = s.retry(ctx, func() error {
			found = true
			return s.inTx(ctx, func(tx *sql.Tx) error {
				res, err := tx.ExecContext(ctx, s.q.extend, us(lease), us(lease+s.opts.Retention), key, leaseID)
				if err != nil {
					return err
				}
				if n, err := res.RowsAffected(); err != nil || n != 1 {
					found = false
					return err
				}
				return tx.QueryRowContext(ctx, s.q.selectLeaseUntil, key).Scan(s.timeDest(&until, &untilOK))
			})
		})
	} else {
		err = s.retry(ctx, func() error {
			found = true
			err := s.queryRow(ctx, s.q.extend, key, leaseID, us(lease), us(lease+s.opts.Retention)).Scan(s.timeDest(&until, &untilOK))
			if errors.Is(err, sql.ErrNoRows) {
				found = false
				return nil
			}
			return err
		})
	}
	if err != nil {
		return time.Time{}, s.wrap(ctx, "Extend", err)
	}
	if !found {
		return time.Time{}, fmt.Errorf("%w: key %q is not held by lease %q (taken over, released, processed, or unknown)", inbox.ErrLeaseLost, key, leaseID)
	}
	return until, nil
}

// Get implements [inbox.LeaseStore].
func (s *Store) Get(ctx context.Context, key string) (inbox.Record, error) {
	if err := inbox.ValidateKey(key); err != nil {
		return inbox.Record{}, err
	}
	if err := s.enter(ctx, "Get"); err != nil {
		return inbox.Record{}, err
	}
	return s.get(ctx, key)
}

func (s *Store) get(ctx context.Context, key string) (inbox.Record, error) {
	var (
		state, attempts                            int
		owner, hash                                string
		first, last, until, expires, now           time.Time
		firstOK, lastOK, untilOK, expiresOK, nowOK bool
	)
	err := s.retry(ctx, func() error {
		return s.queryRow(ctx, s.q.get, key).Scan(&state, &attempts,
			s.timeDest(&first, &firstOK), s.timeDest(&last, &lastOK), s.timeDest(&until, &untilOK),
			&owner, &hash, s.timeDest(&expires, &expiresOK), s.timeDest(&now, &nowOK))
	})
	if errors.Is(err, sql.ErrNoRows) {
		return inbox.Record{}, nil
	}
	if err != nil {
		return inbox.Record{}, s.wrap(ctx, "Get", err)
	}
	if !expires.After(now) {
		return inbox.Record{}, nil // expired: logically gone, awaiting cleanup
	}
	r := inbox.Record{Attempts: attempts, FirstSeen: first, LastSeen: last, Owner: owner, PayloadHash: hash}
	switch {
	case state == stateProcessed:
		r.State = inbox.StateProcessed
	case untilOK && until.After(now):
		r.State = inbox.StateInProgress
		r.LeaseUntil = until
	default:
		r.State = inbox.StateAvailable
	}
	return r, nil
}

// IsProcessed implements [inbox.Store].
func (s *Store) IsProcessed(ctx context.Context, key string) (bool, error) {
	if err := inbox.ValidateKey(key); err != nil {
		return false, err
	}
	if err := s.enter(ctx, "IsProcessed"); err != nil {
		return false, err
	}
	r, err := s.get(ctx, key)
	return r.State == inbox.StateProcessed, err
}

// MarkProcessed implements [inbox.Store]. It marks key processed whatever
// lease is held on it; the holder's Complete then fails with
// [inbox.ErrLeaseLost].
func (s *Store) MarkProcessed(ctx context.Context, key string) error {
	if err := inbox.ValidateKey(key); err != nil {
		return err
	}
	if err := s.enter(ctx, "MarkProcessed"); err != nil {
		return err
	}
	if _, err := s.exec(ctx, s.q.markProcessed, key, us(s.opts.Retention)); err != nil {
		return s.wrap(ctx, "MarkProcessed", err)
	}
	return nil
}
