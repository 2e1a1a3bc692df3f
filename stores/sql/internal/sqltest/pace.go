package sqltest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Pace claims and marks new keys (rabbit:billing:orders:NNNNNN) with claim
// at rate a second for d, paced by a ticker: at each tick the keys due are
// handed to workers goroutines (a router's concurrent handlers), so that a
// slow call delays the keys behind it, never loses them. From the 20th
// second on, every 5 s, it samples rows(). It returns the keys claimed and
// the largest sample, the last taken once every claim has returned. A
// failed claim fails the test.
func Pace(t *testing.T, d time.Duration, rate, workers int, claim func(ctx context.Context, key string) error, rows func() int) (claims, most int) {
	t.Helper()
	// Not Ctx's 2 minutes: on a busy machine the minute may run late.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	keys := make(chan string, int(d/time.Second+1)*rate)
	var (
		wg     sync.WaitGroup
		done   atomic.Int64
		failMu sync.Mutex
		failed error
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for key := range keys {
				if err := claim(ctx, key); err != nil {
					failMu.Lock()
					if failed == nil {
						failed = fmt.Errorf("claim and mark of %s: %w", key, err)
					}
					failMu.Unlock()
					cancel()
					return
				}
				done.Add(1)
			}
		}()
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	next, sent := start.Add(20*time.Second), 0
	for now := range tick.C {
		elapsed := min(now.Sub(start), d)
		for ; sent < int(elapsed*time.Duration(rate)/time.Second); sent++ {
			keys <- fmt.Sprintf("rabbit:billing:orders:%06d", sent)
		}
		if !now.Before(next) && ctx.Err() == nil {
			most = max(most, rows())
			next = next.Add(5 * time.Second)
		}
		if elapsed == d || ctx.Err() != nil {
			break
		}
	}
	close(keys)
	wg.Wait()
	if failed != nil {
		t.Fatal(failed)
	}
	return int(done.Load()), max(most, rows())
}
