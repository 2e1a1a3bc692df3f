package inboxmw

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores/memory"
)

func newInlineInbox(t *testing.T) (*Inbox, *memory.Store) { return newMemoryInbox(t, false) }

func record(t *testing.T, s *memory.Store, id string) inbox.Record {
	t.Helper()
	r, err := s.Get(context.Background(), "b:g:h:"+id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// mustHandle runs a new message of id through h and returns it, failing t
// on an error.
func mustHandle(t *testing.T, h message.HandlerFunc, id string) *message.Message {
	t.Helper()
	m := message.NewMessage(id, nil)
	if _, err := h(m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestInlineMarks_next_message_settles_the_previous checks that the message
// after an acked one marks it before its own claim, on its own goroutine.
func TestInlineMarks_next_message_settles_the_previous(t *testing.T) {
	t.Parallel()
	ib, s := newInlineInbox(t)
	defer func() { _ = ib.Close(context.Background()) }()
	ib.marks.delay = time.Hour // only the next message may settle it
	var seen []inbox.State
	h := ib.Middleware(func(*message.Message) ([]*message.Message, error) {
		seen = append(seen, record(t, s, "1").State)
		return nil, nil
	})
	m1 := mustHandle(t, h, "1")
	m1.Ack()
	if got := record(t, s, "1").State; got != inbox.StateInProgress {
		t.Fatalf("acked message before the next one: %v, want in progress (not settled yet)", got)
	}
	m2 := mustHandle(t, h, "2")
	m2.Ack()
	if seen[1] != inbox.StateProcessed {
		t.Errorf("message 1 seen %v from message 2's handler, want processed", seen[1])
	}
	if n := ib.waiters.spawned.Load(); n != 0 {
		t.Errorf("%d ack waiters started, want 0", n)
	}
}

// TestInlineMarks_lone_message_marked_by_timer checks that a message with no
// successor is marked anyway.
func TestInlineMarks_lone_message_marked_by_timer(t *testing.T) {
	t.Parallel()
	ib, s := newInlineInbox(t)
	defer func() { _ = ib.Close(context.Background()) }()
	h := ib.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	m := mustHandle(t, h, "1")
	m.Ack()
	testenv.Eventually(t, 10*time.Second, "the lone message is marked", func() bool {
		return record(t, s, "1").State == inbox.StateProcessed
	})
}

// TestInlineMarks_nack_releases_before_the_redelivery checks that a nacked
// message's lease is released by its redelivery's own call, which then
// acquires the key at once instead of waiting on it as busy.
func TestInlineMarks_nack_releases_before_the_redelivery(t *testing.T) {
	t.Parallel()
	ib, s := newInlineInbox(t)
	defer func() { _ = ib.Close(context.Background()) }()
	ib.marks.delay = time.Hour
	runs := 0
	h := ib.Middleware(func(*message.Message) ([]*message.Message, error) { runs++; return nil, nil })
	m := mustHandle(t, h, "1")
	m.Nack() // e.g. the router failed to publish what the handler returned
	again := message.NewMessage("1", nil)
	start := time.Now()
	if _, err := h(again); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("redelivery took %s: it waited on its own released lease", d)
	}
	again.Ack()
	if runs != 2 {
		t.Errorf("handler ran %d times, want 2 (the nacked run, then the redelivery)", runs)
	}
	if err := ib.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := record(t, s, "1"); r.State != inbox.StateProcessed || r.Attempts != 2 {
		t.Errorf("after the redelivery: %v with %d attempts, want processed with 2", r.State, r.Attempts)
	}
}

// TestInlineMarks_undecided_lease_goes_to_a_waiter checks that a message the
// router has not acked when the timer fires (a slow publish) is handed to an
// ack waiter, which marks it when the ack comes.
func TestInlineMarks_undecided_lease_goes_to_a_waiter(t *testing.T) {
	t.Parallel()
	ib, s := newInlineInbox(t)
	defer func() { _ = ib.Close(context.Background()) }()
	h := ib.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	m := mustHandle(t, h, "1")
	testenv.Eventually(t, 10*time.Second, "the undecided lease is handed to an ack waiter", func() bool {
		return ib.waiters.spawned.Load() == 1 && !ib.marks.pending()
	})
	if got := record(t, s, "1").State; got != inbox.StateInProgress {
		t.Fatalf("before the ack: %v, want in progress", got)
	}
	m.Ack()
	testenv.Eventually(t, 10*time.Second, "the waiter marks it at the ack", func() bool {
		return record(t, s, "1").State == inbox.StateProcessed
	})
}

// TestInlineMarks_Close_drains checks that Close returns only once every
// acked message is marked, and releases what it abandons.
func TestInlineMarks_Close_drains(t *testing.T) {
	t.Parallel()
	ib, s := newInlineInbox(t)
	ib.marks.delay = time.Hour
	h := ib.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	const n = 100
	for i := range n {
		m := mustHandle(t, h, strconv.Itoa(i))
		m.Ack()
	}
	mustHandle(t, h, "stuck") // never acked nor nacked
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := ib.Close(ctx); err == nil {
		t.Fatal("Close returned nil with a mark still pending at its deadline")
	}
	for i := range n {
		if r := record(t, s, strconv.Itoa(i)); r.State != inbox.StateProcessed {
			t.Fatalf("message %d: %v after Close, want processed", i, r.State)
		}
	}
	testenv.Eventually(t, 10*time.Second, "the abandoned lease is released", func() bool {
		return record(t, s, "stuck").State == inbox.StateAvailable
	})
	if _, err := h(message.NewMessage("late", nil)); err == nil {
		t.Error("a message after Close was handled")
	}
}

// TestInlineMarks_concurrent_handlers runs handlers on several goroutines,
// so that leases queue in the slot and in the list at once, acked or
// nacked at random, while the timer sweeps: after Close every acked message
// is processed and every nacked one free (run with -race).
func TestInlineMarks_concurrent_handlers(t *testing.T) {
	t.Parallel()
	ib, s := newInlineInbox(t)
	ib.marks.delay = 50 * time.Microsecond // sweeps race the handlers
	h := ib.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	const workers, per = 8, 300
	done := make(chan struct{})
	for w := range workers {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range per {
				m := message.NewMessage(strconv.Itoa(w*per+i), nil)
				if _, err := h(m); err != nil {
					t.Error(err)
					return
				}
				if i%5 == 0 {
					m.Nack()
				} else {
					m.Ack()
				}
			}
		}()
	}
	for range workers {
		<-done
	}
	if err := ib.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for w := range workers {
		for i := range per {
			want := inbox.StateProcessed
			if i%5 == 0 {
				want = inbox.StateAvailable
			}
			if got := record(t, s, strconv.Itoa(w*per+i)).State; got != want {
				t.Fatalf("message %d after Close: %v, want %v", w*per+i, got, want)
			}
		}
	}
}
