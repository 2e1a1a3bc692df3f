package inboxmw

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// blockingStore hides the memory store's inbox.BoundedCalls, as a store
// reached over the network would: its marks go to ack waiters, not to
// inlineMarks.
type blockingStore struct{ inbox.LeaseStore }

func newWaitersInbox(t *testing.T) (*Inbox, *memory.Store) { return newMemoryInbox(t, true) }

// newMemoryInbox returns an Inbox over a new memory store: with inline marks
// or, blocking, behind blockingStore, with ack waiters.
func newMemoryInbox(t *testing.T, blocking bool) (*Inbox, *memory.Store) {
	t.Helper()
	s, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var store inbox.LeaseStore = s
	if blocking {
		store = blockingStore{s}
	}
	ib, err := New(Config{Store: store, Bus: "b", Group: "g", Alias: keying.StaticAlias("h")})
	if err != nil {
		t.Fatal(err)
	}
	if (ib.marks == nil) != blocking {
		t.Fatalf("inline marks %v for a store whose calls block: %v", ib.marks != nil, blocking)
	}
	return ib, s
}

func processed(t *testing.T, s *memory.Store, id string) bool {
	return record(t, s, id).State == inbox.StateProcessed
}

// TestAckWaiters_reused_then_stopped_by_Close checks that one message after
// another is marked by the same waiter goroutine, and that Close makes the
// idle waiter exit.
func TestAckWaiters_reused_then_stopped_by_Close(t *testing.T) {
	t.Parallel()
	ib, s := newWaitersInbox(t)
	h := ib.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	for i := range 20 {
		id := strconv.Itoa(i)
		m := message.NewMessage(id, nil)
		if _, err := h(m); err != nil {
			t.Fatal(err)
		}
		m.Ack()
		testenv.Eventually(t, 10*time.Second, "message "+id+" is marked and its waiter idle", func() bool {
			return processed(t, s, id) && ib.waiters.idle.Load() == 1
		})
	}
	if n := ib.waiters.spawned.Load(); n != 1 {
		t.Errorf("%d waiters started for 20 messages handled one after another, want 1", n)
	}
	if err := ib.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "no waiter is idle after Close", func() bool { return ib.waiters.idle.Load() == 0 })
}

// TestAckWaiters_back_to_back_messages_all_marked hands messages over one
// right after another, each acked at once, as a busy consumer does: the
// waiter that marked the previous message is often still on its way back to
// idle, and start yields to it or starts another. Every message must be
// marked, and Close must leave no waiter idle. (How many goroutines start
// is a matter of speed, measured by cmd/inboxbench's micro benchmark, not
// asserted here.)
func TestAckWaiters_back_to_back_messages_all_marked(t *testing.T) {
	t.Parallel()
	ib, s := newWaitersInbox(t)
	h := ib.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	const n = 5000
	for i := range n {
		m := message.NewMessage(strconv.Itoa(i), nil)
		if _, err := h(m); err != nil {
			t.Fatal(err)
		}
		m.Ack()
	}
	if err := ib.Close(context.Background()); err != nil { // drains the pending marks
		t.Fatal(err)
	}
	for i := range n {
		if !processed(t, s, strconv.Itoa(i)) {
			t.Fatalf("message %d not marked after Close drained the marks", i)
		}
	}
	testenv.Eventually(t, 10*time.Second, "no waiter is idle after Close", func() bool { return ib.waiters.idle.Load() == 0 })
	t.Logf("%d waiter goroutines started for %d messages", ib.waiters.spawned.Load(), n)
}

// TestAckWaiters_idle_bounded checks that a burst of concurrent marks starts
// a waiter each, and that at most maxIdleWaiters of them stay parked.
func TestAckWaiters_idle_bounded(t *testing.T) {
	t.Parallel()
	ib, s := newWaitersInbox(t)
	defer func() { _ = ib.Close(context.Background()) }()
	h := ib.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	const n = maxIdleWaiters + 36
	msgs := make([]*message.Message, n)
	for i := range msgs { // every handler returns before any ack: n pending marks
		msgs[i] = message.NewMessage(strconv.Itoa(i), nil)
		if _, err := h(msgs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if got := ib.waiters.spawned.Load(); got != n {
		t.Errorf("%d waiters started for %d pending marks, want %d", got, n, n)
	}
	var wg sync.WaitGroup
	for _, m := range msgs {
		wg.Add(1)
		go func() { defer wg.Done(); m.Ack() }()
	}
	wg.Wait()
	testenv.Eventually(t, 10*time.Second, "every message is marked", func() bool {
		for i := range n {
			if !processed(t, s, strconv.Itoa(i)) {
				return false
			}
		}
		return true
	})
	testenv.Eventually(t, 10*time.Second, "the extra waiters have exited", func() bool { return ib.waiters.idle.Load() == maxIdleWaiters })
}

// TestAckWaiters_close_races_parking closes waiter sets while their waiters
// are finishing leases, so that close meets waiters between counting
// themselves idle and parking: none may be left parked (run with -race).
func TestAckWaiters_close_races_parking(t *testing.T) {
	t.Parallel()
	for range 50 {
		ib, _ := newWaitersInbox(t)
		h := ib.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
		for i := range 8 {
			m := message.NewMessage(strconv.Itoa(i), nil)
			if _, err := h(m); err != nil {
				t.Fatal(err)
			}
			go m.Ack()
		}
		if err := ib.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, "no waiter is idle after Close", func() bool { return ib.waiters.idle.Load() == 0 })
	}
}
