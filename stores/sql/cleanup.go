package sqlstore

import (
	"context"
	"database/sql"
	"hash/fnv"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox/stores/sql/internal/dialect"
)

// Migrate creates the store's table and index when they do not exist, and
// upgrades a table of an earlier layout: it adds the column reason to one
// made before Fail and dead keys (its default describes every row of such a
// table), then copies the rows of one made before the compact layout to a
// table of that layout, which takes its place (see upgradeLayout). It
// never alters a table otherwise
// (one that is not an inbox table is left as it is, and the store's
// statements fail on it). It is idempotent and safe to run from several
// processes at once (on PostgreSQL it holds a transaction-scoped advisory
// lock). The statements are those of [DDL].
func (s *Store) Migrate(ctx context.Context) error {
	d := s.d
	if err := d.enter(ctx, "Migrate"); err != nil {
		return err
	}
	err := d.runDDL(ctx, ddl(d.opts.Dialect, d.opts.Table))
	if err == nil {
		var missing []int
		if missing, err = d.earlierLayout(ctx); err == nil && len(missing) > 0 {
			err = d.addColumns(ctx, missing)
		}
	}
	if err == nil {
		err = d.upgradeLayout(ctx)
	}
	return d.wrap(ctx, "Migrate", err)
}

// pgAdvisoryLock takes a transaction-scoped advisory lock ($1: its bigint
// id) on PostgreSQL.
const pgAdvisoryLock = "SELECT pg_advisory_xact_lock($1)"

// runDDL runs stmts: on PostgreSQL in one transaction holding an advisory
// lock of the table's, so that concurrent migrations wait for each other.
func (d *sqlDriver) runDDL(ctx context.Context, stmts []string) error {
	if d.opts.Dialect != Postgres {
		for _, q := range stmts {
			if _, err := d.db.ExecContext(ctx, q); err != nil {
				return err
			}
		}
		return nil
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte("watermill-inbox:" + d.opts.Table))
	return d.inTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, pgAdvisoryLock, int64(h.Sum64())); err != nil {
			return err
		}
		for _, q := range stmts {
			if _, err := tx.ExecContext(ctx, q); err != nil {
				return err
			}
		}
		return nil
	})
}

// probe reads no row of the columns cols of the table: it fails when one
// of them does not exist.
func (d *sqlDriver) probe(ctx context.Context, cols string) error {
	rows, err := d.db.QueryContext(ctx, probeQuery(d.q.t, cols))
	if err != nil {
		return err
	}
	return rows.Close()
}

// probeQuery reads no row of the columns cols of table t.
func probeQuery(t, cols string) string {
	return "SELECT " + cols + " FROM " + t + " WHERE 1 = 0"
}

// missingColumns returns the indexes in addedColumns of the columns the
// table lacks.
func (d *sqlDriver) missingColumns(ctx context.Context) ([]int, error) {
	var missing []int
	for i, c := range addedColumns {
		err := d.probe(ctx, c.name)
		switch {
		case err == nil:
		case classify(err) == dialect.NoColumn:
			missing = append(missing, i)
		default:
			return nil, err
		}
	}
	return missing, nil
}

// earlierLayout returns the indexes in addedColumns of the columns the
// table lacks when it is of the earlier layout (it has the columns of that
// layout, without some of those added since), and none otherwise. Its
// error is that of missingColumns.
func (d *sqlDriver) earlierLayout(ctx context.Context) ([]int, error) {
	missing, err := d.missingColumns(ctx)
	if err != nil || len(missing) == 0 || d.probe(ctx, cols) != nil {
		return nil, err
	}
	return missing, nil
}

// addColumns adds the columns of addedColumns at the indexes missing. On
// MySQL and SQLite, whose ALTER TABLE has no IF NOT EXISTS, a column that
// a concurrent migration added first is no error.
func (d *sqlDriver) addColumns(ctx context.Context, missing []int) error {
	stmts := make([]string, len(missing))
	for j, i := range missing {
		stmts[j] = addColumn(d.opts.Dialect, d.opts.Table, i)
	}
	if d.opts.Dialect == Postgres {
		return d.runDDL(ctx, stmts)
	}
	for _, q := range stmts {
		if _, err := d.db.ExecContext(ctx, q); err != nil && classify(err) != dialect.DuplicateColumn {
			return err
		}
	}
	return nil
}

// Cleanup deletes the records that have expired (processed keys past the
// retention; released or abandoned leases past their lease plus the
// retention), in statements of at most [Options.CleanupBatch] rows each,
// until a statement deletes fewer: it keeps up with rows that expire while
// it runs. It returns how many rows it deleted, which [Store.CleanupStats]
// adds to its count. Reads already ignore expired rows, so cleanup only
// reclaims space; it can run at any time, alongside claims and the janitor,
// from any number of processes.
//
// Each batch is its own short statement: it never holds more than one
// batch's row locks, and on PostgreSQL it skips rows that a concurrent
// claim has locked. A key claimed again between the choice of a batch and
// its deletion is not deleted: the delete checks expiry again.
func (s *Store) Cleanup(ctx context.Context) (int64, error) {
	if err := s.d.enter(ctx, "Cleanup"); err != nil {
		return 0, err
	}
	n, _, err := s.d.cleanup(ctx, time.Time{}, 0)
	return n, s.d.wrap(ctx, "Cleanup", err)
}

// MaxBacklog bounds the count of [Store.Backlog]: counting stops there, so
// that the count reads at most that many index entries.
const MaxBacklog = 100_000

// Backlog counts the rows that have expired and are not deleted yet, up to
// [MaxBacklog] (a count of MaxBacklog means at least that many). It reads
// the index on expires_at only: one bounded statement.
func (s *Store) Backlog(ctx context.Context) (int64, error) {
	if err := s.d.enter(ctx, "Backlog"); err != nil {
		return 0, err
	}
	n, err := s.d.backlog(ctx)
	return n, s.d.wrap(ctx, "Backlog", err)
}

func (d *sqlDriver) backlog(ctx context.Context) (int64, error) {
	var n int64
	err := retryDeadlocks(ctx, func() error {
		return d.queryRow(ctx, d.q.backlog, MaxBacklog).Scan(&n)
	})
	return n, err
}

// CleanupStats are what a store's cleanup did, its janitor's and
// [Store.Cleanup]'s, since [New]. [Store.CleanupStats] returns them;
// package github.com/watermill-inbox/inbox/metrics exports them.
type CleanupStats struct {
	// Deleted counts the expired rows deleted.
	Deleted int64
	// Backlog is the count of expired rows left at the end of the
	// janitor's latest pass (see [Store.Backlog]; at most [MaxBacklog]).
	// A janitor that keeps up leaves the rows that expired during its last
	// statement: a few, against many when it falls behind or fails.
	Backlog int64
	// Counted is when Backlog was counted: zero before the janitor's first
	// pass, and with the janitor off (Options.DisableCleanup).
	Counted time.Time
	// Passes counts the janitor's passes, and Failed those a failed
	// statement ended (the error is logged).
	Passes, Failed int64
}

// CleanupStats returns what the store's cleanup did since [New].
func (s *Store) CleanupStats() CleanupStats {
	st := &s.d.stats
	c := CleanupStats{
		Deleted: st.deleted.Load(), Backlog: st.backlog.Load(),
		Passes: st.passes.Load(), Failed: st.failed.Load(),
	}
	if at := st.counted.Load(); at != 0 {
		c.Counted = time.Unix(0, at)
	}
	return c
}

// cleanupStats are the counters of CleanupStats, written by cleanup and the
// janitor.
type cleanupStats struct {
	deleted, backlog, counted, passes, failed atomic.Int64
}

// cleanup deletes batches of expired rows until a statement deletes fewer
// than a batch, or, with a non-zero until, that time has passed (bounded is
// then true), each statement bounded by stmtTimeout when positive. Then,
// on PostgreSQL, it deletes the expired gates of order keys the same way
// (cleanupGates).
func (d *sqlDriver) cleanup(ctx context.Context, until time.Time, stmtTimeout time.Duration) (total int64, bounded bool, err error) {
	total, bounded, err = d.cleanupBatches(ctx, d.q.cleanup, until, stmtTimeout)
	if err != nil || bounded || d.q.order.cleanup == "" {
		return total, bounded, err
	}
	n, bounded, err := d.cleanupGates(ctx, until, stmtTimeout)
	return total + n, bounded, err
}

// cleanupGates deletes expired gates of order keys in batches. A gate
// outlives its last change by the retention and the default lease, and is
// deleted as soon as its last key has passed: the expired ones are those
// whose head never came back. A store whose gate table is missing (its
// table was created before order keys, and nobody ran Migrate since) has
// none to delete.
func (d *sqlDriver) cleanupGates(ctx context.Context, until time.Time, stmtTimeout time.Duration) (int64, bool, error) {
	n, bounded, err := d.cleanupBatches(ctx, d.q.order.cleanup, until, stmtTimeout)
	if err != nil && classify(err) == dialect.NoTable {
		return n, bounded, nil
	}
	return n, bounded, err
}

// cleanupBatches runs the cleanup statement q (whose parameter is the
// batch) until it deletes fewer than a batch or until has passed.
func (d *sqlDriver) cleanupBatches(ctx context.Context, q string, until time.Time, stmtTimeout time.Duration) (total int64, bounded bool, err error) {
	for {
		sctx, cancel := ctx, context.CancelFunc(func() {})
		if stmtTimeout > 0 {
			sctx, cancel = context.WithTimeout(ctx, stmtTimeout)
		}
		n, err := d.exec(sctx, q, d.opts.CleanupBatch)
		cancel()
		total += n
		d.stats.deleted.Add(n)
		if d.onCleanupBatch != nil {
			d.onCleanupBatch(n)
		}
		if err != nil {
			return total, false, err
		}
		if n < int64(d.opts.CleanupBatch) {
			return total, false, nil
		}
		if err := ctx.Err(); err != nil {
			return total, false, err
		}
		if !until.IsZero() && !time.Now().Before(until) {
			return total, true, nil
		}
	}
}

// DefaultCleanupInterval is the janitor's interval for a retention when
// Options.CleanupInterval is zero: a tenth of the retention, at most an
// hour, and at least a second (for retentions under 10 s, which tests
// use).
func DefaultCleanupInterval(retention time.Duration) time.Duration {
	return min(max(retention/10, time.Second), time.Hour)
}

// startJanitor starts the goroutine that runs cleanup passes until Close:
// the first within a random part of the interval (at most a minute), so
// that processes started together do not clean at once, then one each
// CleanupInterval. A pass deletes until a statement deletes fewer than a
// batch, or until it has run for the interval (its bound): then the next
// pass starts at once, so that a janitor behind runs without pause. After
// each pass it counts the backlog.
func (d *sqlDriver) startJanitor() {
	ctx, cancel := context.WithCancel(context.Background())
	d.stop, d.done = cancel, make(chan struct{})
	interval := d.opts.CleanupInterval
	go func() {
		defer close(d.done)
		t := time.NewTimer(rand.N(min(interval, time.Minute)))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if d.janitorPass(ctx, interval) {
				t.Reset(0)
			} else {
				t.Reset(interval)
			}
		}
	}()
}

// janitorPass runs one pass of the janitor, bounded by bound, counts the
// backlog it left and logs what it did. It reports whether the pass ended
// at its bound.
func (d *sqlDriver) janitorPass(ctx context.Context, bound time.Duration) (behind bool) {
	fields := func(f watermill.LogFields) watermill.LogFields {
		f["table"] = d.opts.Table
		return f
	}
	var (
		n   int64
		err = d.prepare(ctx)
	)
	if err == nil {
		n, behind, err = d.cleanup(ctx, time.Now().Add(bound), d.opts.Timeout)
	}
	if ctx.Err() != nil {
		return false // closing
	}
	d.stats.passes.Add(1)
	if err != nil {
		d.stats.failed.Add(1)
		d.opts.Logger.Error("inbox sql store: cleanup failed", d.wrap(ctx, "Cleanup", err), fields(watermill.LogFields{"deleted": n}))
	}
	left := int64(-1)
	if d.ready.Load() {
		bctx, cancel := ctx, context.CancelFunc(func() {})
		if d.opts.Timeout > 0 {
			bctx, cancel = context.WithTimeout(ctx, d.opts.Timeout)
		}
		var cerr error
		left, cerr = d.backlog(bctx)
		cancel()
		if cerr == nil {
			d.stats.backlog.Store(left)
			d.stats.counted.Store(time.Now().UnixNano())
		} else if ctx.Err() == nil && err == nil {
			d.opts.Logger.Error("inbox sql store: counting the cleanup backlog failed", d.wrap(ctx, "Backlog", cerr), fields(watermill.LogFields{}))
		}
	}
	switch {
	case behind:
		d.opts.Logger.Info("inbox sql store: cleanup falls behind: the pass ran for its whole interval; the next starts at once",
			fields(watermill.LogFields{"deleted": n, "backlog": left, "interval": bound.String()}))
	case n > 0:
		d.opts.Logger.Debug("inbox sql store: cleanup", fields(watermill.LogFields{"deleted": n, "backlog": left}))
	}
	return behind
}
