package sqlstore_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
)

// BenchmarkConcurrentClaimComplete measures one message's store work, a new
// key's TryBegin then Complete, made by 1 and by 16 goroutines at once (the
// consumers of a 16-partition topic), per database. ns/op is wall time per
// message, so msg/s is 1e9 / ns/op. Where the store batches, it also
// reports the mean number of calls per round trip (calls/rt).
//
// It uses the store's public API only, so that it runs unchanged on earlier
// versions of the store for before/after comparisons.
func BenchmarkConcurrentClaimComplete(b *testing.B) {
	for _, be := range backends {
		if be.mysql8 {
			continue
		}
		b.Run(be.name, func(b *testing.B) {
			db := be.open(b)
			db.SetMaxOpenConns(32)
			db.SetMaxIdleConns(32)
			if be.dialect == sqlstore.SQLite {
				db.SetMaxOpenConns(1)
			}
			table := newTable(b, db, be.dialect)
			s := newStore(b, be, db, table, sqlstore.Options{})
			var p [4]byte
			_, _ = rand.Read(p[:])
			prefix := hex.EncodeToString(p[:])
			for _, workers := range []int{1, 16} {
				b.Run(fmt.Sprintf("goroutines=%d", workers), func(b *testing.B) {
					ctx := ctxT(b)
					stats, _ := any(s).(interface{ BatchStats() driver.BatchStats })
					var before driver.BatchStats
					if stats != nil {
						before = stats.BatchStats()
					}
					var (
						next atomic.Int64
						wg   sync.WaitGroup
						fail atomic.Pointer[error]
					)
					n := int64(b.N)
					b.ResetTimer()
					start := time.Now()
					for range workers {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for next.Add(1) <= n && fail.Load() == nil {
								key := fmt.Sprintf("cbench:%s:%d", prefix, benchSeq.Add(1))
								c, err := s.TryBegin(ctx, key, inbox.BeginOptions{})
								if err == nil && c.Status != inbox.Acquired {
									err = fmt.Errorf("TryBegin(%s) = %v", key, c.Status)
								}
								if err == nil {
									err = s.Complete(ctx, key, c.LeaseID)
								}
								if err != nil {
									fail.CompareAndSwap(nil, &err)
								}
							}
						}()
					}
					wg.Wait()
					elapsed := time.Since(start)
					b.StopTimer()
					if err := fail.Load(); err != nil {
						b.Fatal(*err)
					}
					b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msg/s")
					if stats != nil {
						if d := stats.BatchStats().Sub(before); d.RoundTrips > 0 {
							b.ReportMetric(d.Mean(), "calls/rt")
						}
					}
				})
			}
		})
	}
}
