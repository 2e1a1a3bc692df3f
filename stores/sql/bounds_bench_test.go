package sqlstore_test

import (
	"fmt"
	"testing"

	"github.com/watermill-inbox/inbox/stores/driver"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
)

// BenchmarkBatchBounds runs BenchmarkConcurrentClaimComplete's 16 callers
// under several batching bounds (batch=1 turns batching off), which is how
// the dialects' bounds were chosen. Select one bound per run and alternate
// runs, so that the machine's load weighs on all alike:
//
//	go test -run '^$' -bench 'BatchBounds/postgres/batch=64/inflight=2$' ./stores/sql/
func BenchmarkBatchBounds(b *testing.B) {
	for _, be := range backends {
		if be.mysql8 {
			continue
		}
		b.Run(be.name, func(b *testing.B) {
			db := openConcurrent(b, be)
			table := newTable(b, db, be.dialect)
			for _, bb := range []driver.Batch{
				{MaxBatch: 1},
				{MaxBatch: 64, MaxInFlight: 1}, {MaxBatch: 64, MaxInFlight: 2}, {MaxBatch: 64, MaxInFlight: 4}, {MaxBatch: 64, MaxInFlight: 8},
				{MaxBatch: 8, MaxInFlight: 2},
			} {
				s := newStore(b, be, db, table, sqlstore.WithBatch(sqlstore.Options{}, bb))
				b.Run(fmt.Sprintf("batch=%d/inflight=%d", bb.MaxBatch, bb.MaxInFlight), func(b *testing.B) {
					claimCompleteConcurrently(b, s, 16)
				})
			}
		})
	}
}
