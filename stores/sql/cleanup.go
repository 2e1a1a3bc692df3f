package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"hash/fnv"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox"
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
// until none is left. It returns how many rows it deleted. Reads already
// ignore expired rows, so cleanup only reclaims space; it can run at any
// time, alongside claims, from any number of processes.
//
// Each batch is its own short statement: it never holds more than one
// batch's row locks, and on PostgreSQL it skips rows that a concurrent
// claim has locked. A key claimed again between the choice of a batch and
// its deletion is not deleted: the delete checks expiry again.
func (s *Store) Cleanup(ctx context.Context) (int64, error) {
	return s.d.cleanup(ctx)
}

func (d *sqlDriver) cleanup(ctx context.Context) (int64, error) {
	if err := d.enter(ctx, "Cleanup"); err != nil {
		return 0, err
	}
	var total int64
	for {
		n, err := d.exec(ctx, d.q.cleanup, d.opts.CleanupBatch)
		total += n
		if d.onCleanupBatch != nil {
			d.onCleanupBatch(n)
		}
		if err != nil {
			return total, d.wrap(ctx, "Cleanup", err)
		}
		if n < int64(d.opts.CleanupBatch) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, d.wrap(ctx, "Cleanup", err)
		}
	}
}

// startJanitor starts the goroutine that runs cleanup every
// CleanupInterval until Close.
func (d *sqlDriver) startJanitor() {
	ctx, cancel := context.WithCancel(context.Background())
	d.stop, d.done = cancel, make(chan struct{})
	go func() {
		defer close(d.done)
		t := time.NewTicker(d.opts.CleanupInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			n, err := d.cleanup(ctx)
			if err != nil && ctx.Err() == nil && !errors.Is(err, inbox.ErrClosed) {
				d.opts.Logger.Error("inbox sql store: cleanup failed", err, watermill.LogFields{"table": d.opts.Table, "deleted": n})
			} else if n > 0 {
				d.opts.Logger.Debug("inbox sql store: cleanup", watermill.LogFields{"table": d.opts.Table, "deleted": n})
			}
		}
	}()
}
