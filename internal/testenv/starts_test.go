package testenv_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox/internal/testenv"
)

// Starts sees each goroutine and each timer started, and no timer reset.
func TestStarts_counts_goroutines_and_timers(t *testing.T) {
	const n = 100
	g, tm := testenv.Starts(t, func() {
		var wg sync.WaitGroup
		reused := time.NewTimer(time.Hour)
		for range n {
			wg.Add(1)
			go wg.Done()
			time.NewTimer(time.Hour).Stop()
			_, cancel := context.WithTimeout(context.Background(), time.Hour)
			cancel()
			reused.Reset(time.Minute)
		}
		reused.Stop()
		wg.Wait()
	})
	if g < n || g > n+5 {
		t.Errorf("%d goroutines counted, want %d", g, n)
	}
	if tm < 2*n+1 || tm > 2*n+6 {
		t.Errorf("%d timers counted, want %d (NewTimer and WithTimeout each time, and one reused)", tm, 2*n+1)
	}
}
