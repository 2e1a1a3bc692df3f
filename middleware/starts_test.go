package inboxmw_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/middleware"
)

// startsBound is the most goroutines, and the most timers, that 10,000
// messages may start on the success path: the Inbox's keeper and a few
// wakes of timers that fire on a clock, not per message.
const startsBound = 20

// The success path starts no goroutine and no timer per message: the
// counts over 10,000 messages, with a handler that returns nothing and one
// that returns a message (each marked once the router acked it), stay under
// a constant. (Before the keeper, each message started a
// goroutine and a timer for its lease, and a timer for each store call.)
func TestInbox_success_path_starts_no_goroutine_or_timer_per_message(t *testing.T) {
	// Not parallel: the counts are the whole process's.
	for name, h := range map[string]message.HandlerFunc{"no output": ok, "an output": okWithOutput} {
		t.Run(name, func(t *testing.T) {
			store := newMemory(t)
			g, tm := testenv.Starts(t, func() { runMessages(t, store, h, 10000) })
			t.Logf("10,000 messages started %d goroutines and %d timers", g, tm)
			if g > startsBound || tm > startsBound {
				t.Fatalf("10,000 messages started %d goroutines and %d timers, want at most %d each", g, tm, startsBound)
			}
		})
	}
}

// runMessages makes an Inbox over store, passes n messages with distinct
// ids through its middleware as a router does (each with a context of its
// own, canceled after the ack, as subscribers give them), closes the Inbox
// and checks that every key was marked.
func runMessages(t *testing.T, store inbox.LeaseStore, h message.HandlerFunc, n int) {
	t.Helper()
	ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "test", Group: "starts", Alias: staticAlias()})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Deliver(t, ib.Middleware(h), "starts-", n)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ib.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, n / 2, n - 1} {
		key := "test:starts:h:starts-" + strconv.Itoa(i)
		if r, err := store.Get(context.Background(), key); err != nil || r.State != inbox.StateProcessed {
			t.Fatalf("record of %s after Close: %+v, %v; want Processed", key, r, err)
		}
	}
}
