//go:build linux

package faultproxy

import (
	"testing"
	"time"
)

// A waiter sleeps at least as long as asked, below a millisecond too.
func TestWaiter_waits(t *testing.T) {
	t.Parallel()
	w := newWaiter()
	if w == nil {
		t.Fatal("no timerfd")
	}
	defer w.close()
	for _, d := range []time.Duration{50 * time.Microsecond, 300 * time.Microsecond, 3 * time.Millisecond} {
		start := time.Now()
		if !w.wait(d) {
			t.Fatalf("wait(%s) failed", d)
		}
		if e := time.Since(start); e < d {
			t.Errorf("wait(%s) returned after %s", d, e)
		}
	}
	var none *waiter
	if none.wait(time.Millisecond) {
		t.Error("a nil waiter waited")
	}
	none.close()
}
