package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"hash/fnv"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox"
)

// Migrate creates the store's table and index when they do not exist. It is
// idempotent and safe to run from several processes at once (on PostgreSQL
// it holds a transaction-scoped advisory lock). It never alters an existing
// table. The statements are those of [DDL].
func (s *Store) Migrate(ctx context.Context) error {
	d := s.d
	if err := d.enter(ctx, "Migrate"); err != nil {
		return err
	}
	stmts := ddl(d.opts.Dialect, d.opts.Table)
	var err error
	if d.opts.Dialect == Postgres {
		h := fnv.New64a()
		_, _ = h.Write([]byte("watermill-inbox:" + d.opts.Table))
		err = d.inTx(ctx, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", int64(h.Sum64())); err != nil {
				return err
			}
			for _, q := range stmts {
				if _, err := tx.ExecContext(ctx, q); err != nil {
					return err
				}
			}
			return nil
		})
	} else {
		for _, q := range stmts {
			if _, err = d.db.ExecContext(ctx, q); err != nil {
				break
			}
		}
	}
	return d.wrap(ctx, "Migrate", err)
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
