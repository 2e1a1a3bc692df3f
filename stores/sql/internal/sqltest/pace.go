package sqltest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Pace claims and marks rate*d new keys (rabbit:billing:orders:NNNNNN)
// with claim, one at each tick of a ticker of period 1/rate, handed to
// workers goroutines (a router's concurrent handlers). The rate is never
// exceeded: when the workers fall behind (a busy machine), the next key
// waits for one of them and the ticker drops the ticks missed, so the run
// takes longer rather than catching up in a burst. From the 20th second on,
// every 5 s, it samples rows(). It returns the keys claimed and the largest
// sample, the last taken once every claim has returned. A failed claim
// fails the test.
func Pace(t *testing.T, d time.Duration, rate, workers int, claim func(ctx context.Context, key string) error, rows func() int) (claims, most int) {
	t.Helper()
	// Not Ctx's 2 minutes: on a busy machine the run may take longer.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	keys := make(chan string)
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
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	next := time.Now().Add(20 * time.Second)
	n := int(d * time.Duration(rate) / time.Second)
send:
	for i := 0; i < n; i++ {
		select {
		case <-tick.C:
		case <-ctx.Done():
			break send
		}
		select {
		case keys <- fmt.Sprintf("rabbit:billing:orders:%06d", i):
		case <-ctx.Done():
			break send
		}
		if now := time.Now(); !now.Before(next) {
			most = max(most, rows())
			next = now.Add(5 * time.Second)
		}
	}
	close(keys)
	wg.Wait()
	if failed != nil {
		t.Fatal(failed)
	}
	return int(done.Load()), max(most, rows())
}
