package inboxmw_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox/internal/testenv"
)

// TestInbox_close_on_timeout_stops_its_workers: a store without a Go
// method has its marks made by the Inbox's own workers; when Close gives
// up waiting for a mark, those goroutines still end, as after a Close
// that drained. The Inbox is made under a pprof label, which the
// goroutines it starts inherit (its workers are started by its keeper's),
// so that other tests' workers do not count.
func TestInbox_close_on_timeout_stops_its_workers(t *testing.T) {
	t.Parallel()
	label := t.Name()
	pprof.Do(context.Background(), pprof.Labels("test", label), func(context.Context) {
		// The faulty store's LeaseStore field hides the memory store's Go;
		// w-1's mark starts the workers, w-2 is never acked.
		ib := ackOneOfTwo(t, newFaulty(t), "w-1", "w-2")
		testenv.Eventually(t, 5*time.Second, "the Inbox's workers started by the acked message's mark", func() bool { return runners(t, label) > 0 })
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if err := ib.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Close: %v, want a deadline error for the never-acked message", err)
		}
		testenv.Eventually(t, 5*time.Second, "the Inbox's workers ended after Close gave up", func() bool { return runners(t, label) == 0 })
	})
}

// runners counts the goroutines labeled test=label in a batcher's runner
// loop.
func runners(t *testing.T, label string) int {
	t.Helper()
	var b bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&b, 1); err != nil {
		t.Fatal(err)
	}
	_, groups, _ := strings.Cut(b.String(), "\n") // after "goroutine profile: total N"
	n := 0
	for _, group := range strings.Split(groups, "\n\n") {
		if strings.Contains(group, `"test":"`+label+`"`) && strings.Contains(group, "/internal/batch.(*Batcher[") && strings.Contains(group, "]).runner+") {
			var count int
			if _, err := fmt.Sscan(group, &count); err == nil {
				n += count
			}
		}
	}
	return n
}
