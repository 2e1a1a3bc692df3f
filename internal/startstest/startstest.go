// Package startstest counts what the inbox middleware starts on its success
// path over a store: the test that no goroutine and no timer is started per
// message, run by the tests of each store (memory and remote in
// middleware, Redis, SQL, and MongoDB on FerretDB in its own module).
package startstest

import (
	"context"
	"runtime/metrics"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
)

// Bound is the most goroutines, and the most timers, that 10,000 messages
// may start on the success path over a store that starts nothing per
// call: the Inbox's keeper, the store's workers or batch runners, and a
// few wakes of timers that fire on a clock, not per message.
const Bound = 40

// Messages is how many messages a run passes.
const Messages = 10000

// Run makes an Inbox over store (bus "test", group group, alias "h"),
// passes n messages with distinct ids through its middleware one after
// the other as a router does (each with a context of its own, canceled
// after the ack), with handler h (nil: one that returns nothing), closes
// the Inbox, and checks that the first, middle and last keys were marked.
// It returns the goroutines and timers started meanwhile
// ([testenv.Starts]: call it from a test that is not parallel).
func Run(t testing.TB, store inbox.Store, group string, h message.HandlerFunc, n int) (goroutines, timers int64) {
	t.Helper()
	run(t, store, group, h, n, func(f func()) { goroutines, timers = testenv.Starts(t, f) })
	return goroutines, timers
}

// Goroutines is Run counting only the goroutines started, without the
// heap profiling that counting timers needs (which slows a store that
// allocates much per call, such as the remote one, tenfold).
func Goroutines(t testing.TB, store inbox.Store, group string, h message.HandlerFunc, n int) int64 {
	t.Helper()
	var g int64
	run(t, store, group, h, n, func(f func()) {
		startsMu.Lock()
		defer startsMu.Unlock()
		g0 := goroutinesCreated()
		f()
		g = goroutinesCreated() - g0
	})
	return g
}

var startsMu sync.Mutex

func goroutinesCreated() int64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

func run(t testing.TB, store inbox.Store, group string, h message.HandlerFunc, n int, count func(f func())) {
	t.Helper()
	if h == nil {
		h = func(*message.Message) ([]*message.Message, error) { return nil, nil }
	}
	ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "test", Group: group, Alias: keying.StaticAlias("h")})
	if err != nil {
		t.Fatal(err)
	}
	handler := ib.Middleware(h)
	count(func() {
		testenv.Deliver(t, handler, "starts-", n)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := ib.Close(ctx); err != nil {
			t.Fatal(err)
		}
	})
	for _, i := range []int{0, n / 2, n - 1} {
		key := "test:" + group + ":h:starts-" + strconv.Itoa(i)
		if ok, err := store.IsProcessed(context.Background(), key); err != nil || !ok {
			t.Fatalf("key %s after Close: processed %v, %v; want processed", key, ok, err)
		}
	}
}

// Constant runs n messages through store (Run) and fails the test when
// they started more than Bound goroutines or timers.
func Constant(t testing.TB, store inbox.Store, group string, h message.HandlerFunc, n int) {
	t.Helper()
	g, tm := Run(t, store, group, h, n)
	t.Logf("%d messages started %d goroutines and %d timers", n, g, tm)
	if g > Bound || tm > Bound {
		t.Fatalf("%d messages started %d goroutines and %d timers, want at most %d each", n, g, tm, Bound)
	}
}
