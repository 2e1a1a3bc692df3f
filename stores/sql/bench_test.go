package sqlstore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
)

// BenchmarkClaimComplete measures one message's store work, a new key's
// TryBegin then Complete, by one caller (so every call is a batch of one),
// per database:
//
//   - store: this package;
//   - same-sql: the store's own two statements (those of a batch of one)
//     run directly through database/sql (the store's Go overhead is store
//     minus same-sql);
//   - insert-update: a plain INSERT of the row then an UPDATE marking it, on
//     the same table (the floor any SQL inbox pays).
//
// The MySQL 8 path (TryBegin as a transaction, no RETURNING) runs on MariaDB.
func BenchmarkClaimComplete(b *testing.B) {
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			db := be.open(b)
			table := newTable(b, db, be.dialect)
			s := newStore(b, be, db, table, sqlstore.Options{})
			var p [4]byte
			_, _ = rand.Read(p[:])
			prefix := hex.EncodeToString(p[:])

			b.Run("store", func(b *testing.B) {
				ctx := ctxT(b)
				for b.Loop() {
					key := fmt.Sprintf("bench:%s:store:%d", prefix, benchSeq.Add(1))
					c, err := s.TryBegin(ctx, key, inbox.BeginOptions{})
					if err != nil || c.Status != inbox.Acquired {
						b.Fatalf("TryBegin = %+v, %v", c, err)
					}
					if err := s.Complete(ctx, key, c.LeaseID); err != nil {
						b.Fatal(err)
					}
				}
			})
			if !be.mysql8 {
				sameSQL := sameStatements(s, db)
				b.Run("same-sql", func(b *testing.B) {
					ctx := ctxT(b)
					for b.Loop() {
						key := fmt.Sprintf("bench:%s:same:%d", prefix, benchSeq.Add(1))
						if err := sameSQL(ctx, key, inbox.NewLeaseID()); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
			ins, upd := floorStatements(be.dialect, table)
			b.Run("insert-update", func(b *testing.B) {
				ctx := ctxT(b)
				for b.Loop() {
					key := fmt.Sprintf("bench:%s:floor:%d", prefix, benchSeq.Add(1))
					id := inbox.NewLeaseID()
					if _, err := db.ExecContext(ctx, ins, key, id); err != nil {
						b.Fatal(err)
					}
					if _, err := db.ExecContext(ctx, upd, key, id); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// sameStatements returns a function that runs the statements of a batch of
// one TryBegin and of one Complete of s directly through database/sql,
// reading every column the claim answers.
func sameStatements(s *sqlstore.Store, db *sql.DB) func(ctx context.Context, key, leaseID string) error {
	tryBegin, tryBeginArgs, complete, completeArgs := sqlstore.Statements(s)
	run := func(ctx context.Context, q string, args []any) error {
		rows, err := db.QueryContext(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		cols, err := rows.Columns()
		if err != nil {
			return err
		}
		dest := make([]any, len(cols))
		for i := range dest {
			dest[i] = new(any)
		}
		for rows.Next() {
			if err := rows.Scan(dest...); err != nil {
				return err
			}
		}
		return rows.Err()
	}
	return func(ctx context.Context, key, leaseID string) error {
		if err := run(ctx, tryBegin, tryBeginArgs(key, leaseID)); err != nil {
			return err
		}
		return run(ctx, complete, completeArgs(key, leaseID))
	}
}

// benchSeq makes every benchmark key new, across the reruns of -count.
var benchSeq atomic.Int64

// floorStatements are a plain INSERT of a leased row and an UPDATE marking
// it processed, with the database clock, on the store's table.
func floorStatements(d sqlstore.Dialect, table string) (ins, upd string) {
	const cols = "(msg_key, state, lease, owner, lease_until, attempts, first_seen, last_seen, payload_hash, expires_at)"
	switch d {
	case sqlstore.Postgres:
		return "INSERT INTO " + table + " " + cols + " VALUES ($1, 0, convert_to($2::text, 'UTF8'), NULL, clock_timestamp() + interval '30 seconds', 1, clock_timestamp(), clock_timestamp(), NULL, clock_timestamp() + interval '7 days')",
			"UPDATE " + table + " SET state = 1, last_seen = clock_timestamp(), lease_until = NULL, expires_at = clock_timestamp() + interval '7 days' WHERE msg_key = $1 AND lease = convert_to($2::text, 'UTF8')"
	case sqlstore.MySQL:
		return "INSERT INTO " + table + " " + cols + " VALUES (?, 0, ?, NULL, UTC_TIMESTAMP(6) + INTERVAL 30 SECOND, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), NULL, UTC_TIMESTAMP(6) + INTERVAL 7 DAY)",
			"UPDATE " + table + " SET state = 1, last_seen = UTC_TIMESTAMP(6), lease_until = NULL, expires_at = UTC_TIMESTAMP(6) + INTERVAL 7 DAY WHERE msg_key = ? AND lease = ?"
	default:
		const now = "(CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)"
		return "INSERT INTO " + table + " " + cols + " VALUES (?1, 0, CAST(?2 AS BLOB), NULL, " + now + " + 30000000, 1, " + now + ", " + now + ", NULL, " + now + " + 604800000000)",
			"UPDATE " + table + " SET state = 1, last_seen = " + now + ", lease_until = NULL, expires_at = " + now + " + 604800000000 WHERE msg_key = ?1 AND lease = CAST(?2 AS BLOB)"
	}
}

// BenchmarkClaimCompleteInterleaved runs the three variants of
// BenchmarkClaimComplete in turn within every iteration and reports each one's
// mean time and the ratios, so that load on a shared machine, which shifts
// from one second to the next, weighs on all three alike.
func BenchmarkClaimCompleteInterleaved(b *testing.B) {
	for _, be := range backends {
		if be.mysql8 {
			continue
		}
		b.Run(be.name, func(b *testing.B) {
			db := be.open(b)
			table := newTable(b, db, be.dialect)
			s := newStore(b, be, db, table, sqlstore.Options{})
			sameSQL := sameStatements(s, db)
			ins, upd := floorStatements(be.dialect, table)
			var p [4]byte
			_, _ = rand.Read(p[:])
			prefix := hex.EncodeToString(p[:])
			ctx := ctxT(b)
			var tStore, tSame, tFloor time.Duration
			for b.Loop() {
				key := fmt.Sprintf("bench:%s:store:%d", prefix, benchSeq.Add(1))
				t0 := time.Now()
				c, err := s.TryBegin(ctx, key, inbox.BeginOptions{})
				if err != nil || c.Status != inbox.Acquired {
					b.Fatalf("TryBegin = %+v, %v", c, err)
				}
				if err := s.Complete(ctx, key, c.LeaseID); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()

				key = fmt.Sprintf("bench:%s:same:%d", prefix, benchSeq.Add(1))
				id := inbox.NewLeaseID()
				if err := sameSQL(ctx, key, id); err != nil {
					b.Fatal(err)
				}
				t2 := time.Now()

				key = fmt.Sprintf("bench:%s:floor:%d", prefix, benchSeq.Add(1))
				if _, err := db.ExecContext(ctx, ins, key, id); err != nil {
					b.Fatal(err)
				}
				if _, err := db.ExecContext(ctx, upd, key, id); err != nil {
					b.Fatal(err)
				}
				t3 := time.Now()
				tStore += t1.Sub(t0)
				tSame += t2.Sub(t1)
				tFloor += t3.Sub(t2)
			}
			n := float64(b.N)
			b.ReportMetric(float64(tStore.Nanoseconds())/n, "store-ns/op")
			b.ReportMetric(float64(tSame.Nanoseconds())/n, "same-sql-ns/op")
			b.ReportMetric(float64(tFloor.Nanoseconds())/n, "floor-ns/op")
			b.ReportMetric(float64(tStore)/float64(tFloor), "store/floor")
			b.ReportMetric(float64(tStore)/float64(tSame), "store/same-sql")
		})
	}
}
