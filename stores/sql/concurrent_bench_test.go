package sqlstore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
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
// message; msg/s is its inverse. Where the store batches, it also reports
// the mean number of calls per round trip (calls/rt).
//
// This file uses the store's public API only, so that it runs unchanged on
// earlier versions of the store for before/after comparisons.
func BenchmarkConcurrentClaimComplete(b *testing.B) {
	for _, be := range backends {
		if be.mysql8 {
			continue
		}
		b.Run(be.name, func(b *testing.B) {
			db := openConcurrent(b, be)
			s := newStore(b, be, db, newTable(b, db, be.dialect), sqlstore.Options{})
			for _, workers := range []int{1, 16} {
				b.Run(fmt.Sprintf("goroutines=%d", workers), func(b *testing.B) {
					claimCompleteConcurrently(b, s, workers)
				})
			}
		})
	}
}

// openConcurrent opens be's database with a pool large enough for the
// concurrent benchmarks (one connection on SQLite, as the URL opener does).
func openConcurrent(b *testing.B, be backend) *sql.DB {
	db := be.open(b)
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	if be.dialect == sqlstore.SQLite {
		db.SetMaxOpenConns(1)
	}
	return db
}

// claimCompleteConcurrently runs b.N messages (TryBegin then Complete of a
// new key) through s from workers goroutines and reports msg/s and, where
// s batches, calls/rt.
func claimCompleteConcurrently(b *testing.B, s inbox.LeaseStore, workers int) {
	ctx := ctxT(b)
	var p [4]byte
	_, _ = rand.Read(p[:])
	prefix := hex.EncodeToString(p[:])
	stats, _ := s.(interface{ BatchStats() driver.BatchStats })
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
				if err := claimComplete(ctx, s, fmt.Sprintf("cbench:%s:%d", prefix, benchSeq.Add(1))); err != nil {
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
}

func claimComplete(ctx context.Context, s inbox.LeaseStore, key string) error {
	c, err := s.TryBegin(ctx, key, inbox.BeginOptions{})
	if err != nil {
		return err
	}
	if c.Status != inbox.Acquired {
		return fmt.Errorf("TryBegin(%s) = %v", key, c.Status)
	}
	return s.Complete(ctx, key, c.LeaseID)
}
