package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/sql/internal/dialect"
)

// TxClaimOptions configure [Store.BeginTxClaim].
type TxClaimOptions struct {
	// Owner names the claimer in the key's row. Optional; checked as
	// [inbox.BeginOptions.Owner] is.
	Owner string

	// LockTimeout bounds the claim's waits: for a pooled connection, and
	// for the row of a concurrent claim of the key whose transaction has not
	// ended. Required: at least 1ms. On PostgreSQL it is the transaction's
	// lock_timeout (it also bounds the lock waits of the caller's own
	// statements in the transaction); on MySQL and MariaDB the connection's
	// innodb_lock_wait_timeout, in whole seconds rounded up, set before the
	// transaction and reset when the connection is given back; on SQLite the
	// wait for the pool's connection (the database's one writer).
	LockTimeout time.Duration
}

// txQueries are the statements of [Store.BeginTxClaim], built once per store.
type txQueries struct {
	claim   string // claim(key, owner, retentionUS): inserts the processed row, or nothing on conflict
	inspect string // inspect(key): state, lease_until, expires_at, now, locking the row
	remove  string // remove(key): deletes an expired or abandoned row before a new claim
}

func buildTxQueries(d Dialect, table string) txQueries {
	t := quoteIdent(d, table).table
	switch d {
	case Postgres:
		return txQueries{
			claim: `WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now)
INSERT INTO ` + t + ` (` + insertCols + `)
SELECT $1, 1, NULL, NULLIF($2::text, ''), NULL, 1, n.now, n.now, NULL, n.now + $3::bigint * interval '1 microsecond' FROM n
ON CONFLICT (msg_key) DO NOTHING`,
			inspect: `SELECT state, lease_until, expires_at, clock_timestamp() FROM ` + t + ` WHERE msg_key = $1 FOR UPDATE`,
			remove:  `DELETE FROM ` + t + ` WHERE msg_key = $1`,
		}
	case MySQL:
		const now = `UTC_TIMESTAMP(6)`
		return txQueries{
			claim: `INSERT IGNORE INTO ` + t + ` (` + insertCols + `)
VALUES (?, 1, NULL, NULLIF(?, ''), NULL, 1, ` + now + `, ` + now + `, NULL, ` + now + ` + INTERVAL ? MICROSECOND)`,
			// A shared lock: INSERT IGNORE took one on the duplicate row, and
			// asking for an exclusive one from every waiting duplicate would
			// deadlock them.
			inspect: `SELECT state, lease_until, expires_at, ` + now + ` FROM ` + t + ` WHERE msg_key = ? LOCK IN SHARE MODE`,
			remove:  `DELETE FROM ` + t + ` WHERE msg_key = ?`,
		}
	default:
		return txQueries{
			claim: `INSERT INTO ` + t + ` (` + insertCols + `)
VALUES (?1, 1, NULL, NULLIF(?2, ''), NULL, 1, ` + liteNow + `, ` + liteNow + `, NULL, ` + liteNow + ` + ?3)
ON CONFLICT (msg_key) DO NOTHING`,
			inspect: `SELECT state, lease_until, expires_at, ` + liteNow + ` FROM ` + t + ` WHERE msg_key = ?1`,
			remove:  `DELETE FROM ` + t + ` WHERE msg_key = ?1`,
		}
	}
}

// The statements that bound a claim's lock waits: on PostgreSQL the
// transaction's lock_timeout ($1, as "<n>ms"); on MySQL and MariaDB the
// connection's innodb_lock_wait_timeout (whole seconds), reset to the
// server's default before the connection goes back to the pool.
const (
	pgLockTimeout          = "SELECT set_config('lock_timeout', $1, true)"
	myLockWaitTimeoutReset = "SET SESSION innodb_lock_wait_timeout = DEFAULT"
)

func myLockWaitTimeout(secs int64) string {
	return "SET SESSION innodb_lock_wait_timeout = " + strconv.FormatInt(secs, 10)
}

// BeginTxClaim begins a transaction on a pooled connection of its own and
// claims key in it: the building block of the transactional mode
// (package github.com/watermill-inbox/inbox/stores/sql/txinbox), where a
// handler's writes and the key's mark commit together or not at all.
//
// The claim inserts the key's row already marked processed, uncommitted
// (INSERT ... ON CONFLICT DO NOTHING; INSERT IGNORE on MySQL and MariaDB).
// When the row exists and is committed, it decides by the row: processed
// (processed is true; tx and end are nil and the connection is given back),
// expired or an ended lease of this store (deleted and claimed afresh), or a
// live lease of this store, the backoff of its failed attempt or a key it
// marked dead (an [*inbox.BusyError] with the time the lease, the backoff
// or the dead record has left). A concurrent claim of key blocks on the uncommitted row: it
// sees the key processed when the other transaction commits, claims it when
// that one rolls back, and after opts.LockTimeout fails with an
// [*inbox.BusyError] (as does, on SQLite, a wait for the pool's connection
// longer than that). A deadlock between waiting claims, which InnoDB breaks
// by rolling one back, is retried. Other failures are mapped as the store's
// are ([inbox.ErrStoreUnavailable]; a canceled ctx wraps context.Canceled).
// An empty key claims nothing: the transaction is begun the same way, for a
// message without an id.
//
// Otherwise tx holds the claim; it is bound to ctx (database/sql rolls it
// back when ctx ends). The caller runs its writes in tx, must not commit or
// roll it back itself, and calls end exactly once: end(true) commits its
// writes with the mark and returns the commit's error, mapped as the store's
// are; end(false) rolls back and returns nil. Both give the connection back
// (on MySQL and MariaDB after resetting innodb_lock_wait_timeout).
func (s *Store) BeginTxClaim(ctx context.Context, key string, opts TxClaimOptions) (tx *sql.Tx, end func(commit bool) error, processed bool, err error) {
	if key != "" {
		if err := inbox.ValidateKey(key); err != nil {
			return nil, nil, false, err
		}
	}
	if opts.LockTimeout < time.Millisecond {
		return nil, nil, false, fmt.Errorf("%w: sql store: BeginTxClaim: LockTimeout %s is below 1ms", inbox.ErrInvalidArgument, opts.LockTimeout)
	}
	if err := (inbox.BeginOptions{Owner: opts.Owner}).Validate(); err != nil {
		return nil, nil, false, err
	}
	if err := s.d.enter(ctx, "BeginTxClaim"); err != nil {
		return nil, nil, false, err
	}
	const attempts = 5
	for i := 0; ; i++ {
		var release func()
		tx, release, processed, err = s.d.tryTxClaim(ctx, key, opts)
		if err == nil || i == attempts-1 || classify(err) != dialect.Retry {
			if err != nil {
				return nil, nil, false, s.d.txErr(ctx, key, err)
			}
			if processed {
				return nil, nil, true, nil
			}
			return tx, s.d.txEnd(ctx, tx, release), false, nil
		}
		// MySQL broke a deadlock between waiting duplicates by rolling one
		// back: nothing ran yet, claim again.
	}
}

// txErr maps an error of the claim: lock-wait timeouts are Busy.
func (s *sqlDriver) txErr(ctx context.Context, key string, err error) error {
	if ctx.Err() == nil && classify(err) == dialect.LockWait {
		return &inbox.BusyError{Key: key}
	}
	return s.wrap(ctx, "BeginTxClaim", err)
}

func (s *sqlDriver) txEnd(ctx context.Context, tx *sql.Tx, release func()) func(commit bool) error {
	return func(commit bool) error {
		defer release()
		if !commit {
			_ = tx.Rollback()
			return nil
		}
		if err := tx.Commit(); err != nil {
			return s.wrap(ctx, "commit", err)
		}
		return nil
	}
}

// tryTxClaim is one attempt of BeginTxClaim. Its errors are the driver's
// (classified by the caller), except Busy ones. release gives the
// connection back once tx has ended.
func (s *sqlDriver) tryTxClaim(ctx context.Context, key string, opts TxClaimOptions) (tx *sql.Tx, release func(), processed bool, err error) {
	d := s.opts.Dialect
	op := func(what string, err error) error { return fmt.Errorf("%s: %w", what, err) }

	// A bounded wait for a connection: on SQLite, whose pool has the one
	// writer connection, this is the wait for the other deliveries.
	connCtx, cancel := context.WithTimeout(ctx, opts.LockTimeout)
	conn, err := s.db.Conn(connCtx)
	cancel()
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) && d == SQLite {
			return nil, nil, false, &inbox.BusyError{Key: key}
		}
		return nil, nil, false, op("taking a connection", err)
	}
	release = func() { _ = conn.Close() }

	if d == MySQL {
		secs := int64((opts.LockTimeout + time.Second - 1) / time.Second)
		if _, err := conn.ExecContext(ctx, myLockWaitTimeout(secs)); err != nil {
			release()
			return nil, nil, false, op("setting innodb_lock_wait_timeout", err)
		}
		release = func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if _, err := conn.ExecContext(rctx, myLockWaitTimeoutReset); err != nil {
				// Do not hand a connection with our timeout back to the pool.
				_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			}
			_ = conn.Close()
		}
	}
	tx, err = conn.BeginTx(ctx, nil)
	if err != nil {
		release()
		return nil, nil, false, op("begin", err)
	}
	abort := func(what string, err error) (*sql.Tx, func(), bool, error) {
		_ = tx.Rollback()
		release()
		return nil, nil, false, op(what, err)
	}
	if d == Postgres {
		ms := strconv.FormatInt(max(opts.LockTimeout.Milliseconds(), 1), 10) + "ms"
		if _, err := tx.ExecContext(ctx, pgLockTimeout, ms); err != nil {
			return abort("setting lock_timeout", err)
		}
	}
	if key == "" {
		return tx, release, false, nil
	}
	ret := us(s.opts.Retention)
	for range 2 {
		res, err := tx.ExecContext(ctx, s.txq.claim, key, opts.Owner, ret)
		if err != nil {
			return abort("claim", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return abort("claim", err)
		}
		if n == 1 {
			return tx, release, false, nil
		}
		// The key has a committed row (a concurrent claim that committed was
		// waited for): processed, expired, or a lease store's.
		var (
			state                 int
			until, expires, now   time.Time
			untilOK, expOK, nowOK bool
		)
		err = tx.QueryRowContext(ctx, s.txq.inspect, key).Scan(&state, s.timeDest(&until, &untilOK), s.timeDest(&expires, &expOK), s.timeDest(&now, &nowOK))
		if errors.Is(err, sql.ErrNoRows) {
			continue // deleted since: claim again
		}
		if err != nil {
			return abort("reading the key's row", err)
		}
		// What keeps the key from this claim, until when: a live lease of
		// the lease store on the same key, its failed attempt's backoff (a
		// lease nobody holds), or its dead record.
		var busyUntil time.Time
		switch {
		case !expires.After(now):
		case state == stateProcessed:
			_ = tx.Rollback()
			release()
			return nil, nil, true, nil
		case state == stateDead:
			busyUntil = expires
		case untilOK && until.After(now):
			busyUntil = until
		}
		if busyUntil.IsZero() {
			// Expired, or a released or abandoned lease: start afresh.
			if _, err := tx.ExecContext(ctx, s.txq.remove, key); err != nil {
				return abort("removing the expired row", err)
			}
			continue
		}
		_ = tx.Rollback()
		release()
		return nil, nil, false, &inbox.BusyError{Key: key, RetryAfter: busyUntil.Sub(now)}
	}
	return abort("claim", errors.New("the key's row kept changing"))
}
