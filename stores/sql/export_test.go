package sqlstore

import (
	"context"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
)

// UseMySQL8Path makes a store on MariaDB run the statements it runs on MySQL
// 8, which has no RETURNING (claims followed by a locking read in a
// transaction), so the MySQL 8 path is tested against the MariaDB server
// this project's CI has.
func UseMySQL8Path(s *Store) {
	s.d.returning = false
	s.d.q = buildQueries(s.d.opts.Dialect, s.d.opts.Table, false)
}

// UsesReturning reports whether a claim is one statement.
func UsesReturning(s *Store) bool { return s.d.returning }

// WithBatch returns o with the batching bounds b instead of the dialect's.
func WithBatch(o Options, b driver.Batch) Options {
	o.batch = &b
	return o
}

// Apply runs ops through the store's driver as one batch, bypassing the
// layer (and its batcher), so that tests can craft batches.
func Apply(ctx context.Context, s *Store, ops []driver.Op) ([]inbox.Claim, []error, error) {
	res, errs := make([]inbox.Claim, len(ops)), make([]error, len(ops))
	err := s.d.Apply(ctx, ops, res, errs)
	return res, errs, err
}

// OnCleanupBatch makes s call f with the rows each cleanup statement
// deleted.
func OnCleanupBatch(s *Store, f func(n int64)) { s.d.onCleanupBatch = f }

// Statements returns the statements that a batch of one TryBegin and a
// batch of one Complete run (not on the MySQL 8 path, where a claim is a
// transaction), each with a function giving its arguments, for the
// benchmark that runs them without the store around them.
func Statements(s *Store) (tryBegin string, tryBeginArgs func(key, leaseID string) []any, complete string, completeArgs func(key, leaseID string) []any) {
	d := s.d
	lease, ret := us(d.opts.Lease), us(d.opts.Retention)
	return d.q.claimOne, func(key, id string) []any { return []any{key, leaseBytes(id), "", lease, []byte(nil), lease + ret} },
		d.q.complete, func(key, id string) []any {
			switch d.opts.Dialect {
			case Postgres:
				return []any{ret, key, leaseBytes(id)}
			case MySQL:
				return append(myCompleteArgs(d.opts.Retention), key, leaseBytes(id), leaseFP(id))
			}
			return []any{ret, key, leaseBytes(id), leaseFP(id)}
		}
}
