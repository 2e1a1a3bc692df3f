package inboxmw_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/middleware"
)

// Tests on Watermill's GoChannel and the memory store, asserting on a ledger
// of effects. GoChannel redelivers a nacked message at once and cancels a
// message's context when it is acked, like the real subscribers do.

func TestInbox_message_delivered_twice_runs_once(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: newMemory(t), Metrics: rec})
	led := newLedger()
	startRouter(t, ps, nil, "", ib, func(m *message.Message) ([]*message.Message, error) {
		led.apply(m.Metadata.Get("IdempotencyKey"))
		return nil, nil
	})

	const n = 30
	for i := range n {
		id := fmt.Sprintf("order-%d", i)
		// The second is a producer retry: same IdempotencyKey, new UUID.
		publish(t, ps, order(id), order(id))
	}
	testenv.Eventually(t, 10*time.Second, "every message processed or skipped", func() bool {
		return rec.get(inboxmw.OutcomeProcessed)+rec.get(inboxmw.OutcomeDuplicate) == 2*n
	})
	for i := range n {
		if c := led.count(fmt.Sprintf("order-%d", i)); c != 1 {
			t.Errorf("order-%d applied %d times, want 1", i, c)
		}
	}
	if d := rec.get(inboxmw.OutcomeDuplicate); d != n {
		t.Errorf("duplicates counted %d, want %d", d, n)
	}
}

func TestInbox_same_uuid_redelivered_runs_once(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: newMemory(t), Metrics: rec})
	led := newLedger()
	startRouter(t, ps, nil, "", ib, func(m *message.Message) ([]*message.Message, error) {
		led.apply(m.UUID)
		return nil, nil
	})
	m := message.NewMessage("uuid-1", []byte("x")) // no IdempotencyKey: keyed by UUID
	publish(t, ps, m, m.Copy(), m.Copy())
	testenv.Eventually(t, 10*time.Second, "three deliveries handled", func() bool {
		return rec.get(inboxmw.OutcomeProcessed)+rec.get(inboxmw.OutcomeDuplicate) == 3
	})
	if c := led.count("uuid-1"); c != 1 {
		t.Fatalf("applied %d times, want 1", c)
	}
}

// failTwice returns a handler that fails the first two deliveries of each
// order and applies the effect on the third.
func failTwice(led *ledger, deliveries *sync.Map) message.HandlerFunc {
	return func(m *message.Message) ([]*message.Message, error) {
		id := m.Metadata.Get("IdempotencyKey")
		n, _ := deliveries.LoadOrStore(id, new(atomic.Int32))
		if n.(*atomic.Int32).Add(1) <= 2 {
			return nil, errBoom
		}
		led.apply(id)
		return nil, nil
	}
}

func TestInbox_handler_failing_twice_is_redelivered_and_applied_once(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	store := newFaulty(t)
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec})
	led := newLedger()
	var deliveries sync.Map
	startRouter(t, ps, nil, "", ib, failTwice(led, &deliveries))

	publish(t, ps, order("o-1"))
	testenv.Eventually(t, 10*time.Second, "o-1 applied", func() bool { return led.count("o-1") == 1 })
	testenv.Eventually(t, 5*time.Second, "o-1 marked", func() bool { return getRecord(t, store, "o-1").State == inbox.StateProcessed })
	publish(t, ps, order("o-1")) // a later duplicate is skipped
	testenv.Eventually(t, 5*time.Second, "duplicate skipped", func() bool { return rec.get(inboxmw.OutcomeDuplicate) == 1 })

	if c := led.count("o-1"); c != 1 {
		t.Fatalf("applied %d times, want 1", c)
	}
	if r := getRecord(t, store, "o-1"); r.Attempts != 3 {
		t.Fatalf("attempts %d, want 3 (two failures released, the third completed)", r.Attempts)
	}
	if got := rec.get(inboxmw.OutcomeReleased); got != 2 {
		t.Fatalf("released %d times, want 2", got)
	}
}

// The same scenario with Watermill's own Deduplicator: it records the key
// before the handler and never removes it, so the redelivery after the first
// failure is dropped as a duplicate and acked: the message is lost.
func TestWatermillDeduplicator_loses_message_whose_handler_failed(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	led := newLedger()
	var deliveries sync.Map
	var results sync.Map // delivery outcomes seen outside the deduplicator
	observe := func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			out, err := h(m)
			n, _ := results.LoadOrStore(fmt.Sprint(err == nil), new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
			return out, err
		}
	}
	dedup := &wmw.Deduplicator{KeyFactory: wmw.NewMessageHasherFromMetadataField("IdempotencyKey")}
	startRouter(t, ps, nil, "", nil, failTwice(led, &deliveries), observe, dedup.Middleware)

	publish(t, ps, order("o-1"))
	count := func(ok bool) int32 {
		n, found := results.Load(fmt.Sprint(ok))
		if !found {
			return 0
		}
		return n.(*atomic.Int32).Load()
	}
	// First delivery fails; the redelivery is acked as a "duplicate".
	testenv.Eventually(t, 10*time.Second, "the redelivery acked", func() bool { return count(true) >= 1 })
	if f := count(false); f != 1 {
		t.Fatalf("failed deliveries %d, want 1", f)
	}
	if c := led.count("o-1"); c != 0 {
		t.Fatalf("Deduplicator applied the effect %d times; this test expects it to lose the message", c)
	}
	if n, _ := deliveries.Load("o-1"); n.(*atomic.Int32).Load() != 1 {
		t.Fatalf("handler ran %d times, want 1: the redelivery should have been dropped", n.(*atomic.Int32).Load())
	}
}

func TestInbox_two_routers_on_the_same_stream_apply_each_effect_once(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t) // GoChannel fans every message out to both routers
	store := newMemory(t)
	rec := newRecorder()
	led := newLedger()
	var concurrent, maxConcurrent atomic.Int32
	var running sync.Map
	h := func(m *message.Message) ([]*message.Message, error) {
		id := m.Metadata.Get("IdempotencyKey")
		if _, dup := running.LoadOrStore(id, true); dup {
			t.Errorf("%s: handler running twice at once", id)
		}
		c := concurrent.Add(1)
		for {
			mx := maxConcurrent.Load()
			if c <= mx || maxConcurrent.CompareAndSwap(mx, c) {
				break
			}
		}
		time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond) // simulated work, so deliveries overlap
		led.apply(id)
		concurrent.Add(-1)
		running.Delete(id)
		return nil, nil
	}
	for range 2 {
		ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec})
		startRouter(t, ps, nil, "", ib, h)
	}
	const n = 100
	for i := range n {
		publish(t, ps, order(fmt.Sprintf("o-%d", i)))
	}
	testenv.Eventually(t, 20*time.Second, "both routers handled every message", func() bool {
		return rec.get(inboxmw.OutcomeProcessed)+rec.get(inboxmw.OutcomeDuplicate) == 2*n
	})
	snap := led.snapshot()
	if len(snap) != n {
		t.Fatalf("%d distinct effects, want %d", len(snap), n)
	}
	for id, c := range snap {
		if c != 1 {
			t.Errorf("%s applied %d times, want 1", id, c)
		}
	}
	t.Logf("max concurrent handlers across the two routers: %d; busy waits: %d", maxConcurrent.Load(), rec.get(inboxmw.OutcomeBusy))
}

func TestInbox_store_error_nacks_then_processes_after_recovery(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	store := newFaulty(t)
	rec := newRecorder()
	// A short in-process back-off, so that the message is nacked and
	// redelivered several times during the outage.
	ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec, MaxBusyWait: 100 * time.Millisecond})
	led := newLedger()
	var runs atomic.Int32
	startRouter(t, ps, nil, "", ib, func(m *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		led.apply(m.Metadata.Get("IdempotencyKey"))
		return nil, nil
	}, wmw.Retry{MaxRetries: 1000, InitialInterval: 10 * time.Millisecond, MaxInterval: 50 * time.Millisecond, Multiplier: 2}.Middleware)

	store.down.Store(true)
	publish(t, ps, order("o-1"))
	testenv.Eventually(t, 10*time.Second, "several failed claims", func() bool { return rec.get(inboxmw.OutcomeStoreError) >= 3 })
	if r := runs.Load(); r != 0 {
		t.Fatalf("handler ran %d times while the store was down; fail closed must not run it", r)
	}
	store.down.Store(false)
	testenv.Eventually(t, 10*time.Second, "o-1 processed after recovery", func() bool {
		return rec.get(inboxmw.OutcomeProcessed) == 1
	})
	if c := led.count("o-1"); c != 1 {
		t.Fatalf("applied %d times, want 1", c)
	}
}

func TestInbox_handler_longer_than_lease_keeps_it_through_heartbeats(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	store := newFaulty(t)
	rec := newRecorder()
	const lease = time.Second
	led := newLedger()
	release := make(chan struct{})
	var started atomic.Int32
	h := func(m *message.Message) ([]*message.Message, error) {
		started.Add(1)
		select {
		case <-release:
		case <-m.Context().Done():
			return nil, context.Cause(m.Context())
		}
		led.apply(m.Metadata.Get("IdempotencyKey"))
		return nil, nil
	}
	for range 2 { // the second router gets the same message while the first works
		ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec, Lease: lease, HeartbeatInterval: lease / 4})
		startRouter(t, ps, nil, "", ib, h)
	}
	begin := time.Now()
	publish(t, ps, order("long"))
	// Hold the handler for many lease lengths while the other router keeps
	// trying the key.
	testenv.Eventually(t, 20*time.Second, "the lease renewed many times and the other router turned away", func() bool {
		return time.Since(begin) > 3*lease && rec.callCount(inboxmw.OpExtend) >= 6 && store.busyAnswers.Load() >= 2
	})
	close(release)
	testenv.Eventually(t, 10*time.Second, "both copies handled", func() bool {
		return rec.get(inboxmw.OutcomeProcessed)+rec.get(inboxmw.OutcomeDuplicate) == 2
	})
	t.Logf("outcomes %v, extends %d, busy answers %d", rec, rec.callCount(inboxmw.OpExtend), store.busyAnswers.Load())
	if s := started.Load(); s != 1 {
		t.Fatalf("handler started %d times, want 1", s)
	}
	if c := led.count("long"); c != 1 {
		t.Fatalf("applied %d times, want 1", c)
	}
	if l := rec.get(inboxmw.OutcomeLeaseLost); l != 0 {
		t.Fatalf("lease lost %d times", l)
	}
}

func TestInbox_panic_releases_the_lease(t *testing.T) {
	t.Parallel()
	for _, withRecoverer := range []bool{false, true} {
		t.Run(fmt.Sprintf("recoverer=%v", withRecoverer), func(t *testing.T) {
			t.Parallel()
			ps := newPubSub(t)
			store := newFaulty(t)
			rec := newRecorder()
			// A long lease: if the panic left the key claimed, the redelivery
			// would wait for it and then fail with ErrBusy, not succeed at once
			// (no backoff after the failed attempt, so nothing else delays it).
			ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec, Lease: time.Minute, MaxBusyWait: -1,
				Backoff: inboxmw.ExponentialBackoff(time.Second, 0)})
			led := newLedger()
			var calls atomic.Int32
			h := func(m *message.Message) ([]*message.Message, error) {
				if calls.Add(1) == 1 {
					panic("handler bug")
				}
				led.apply(m.Metadata.Get("IdempotencyKey"))
				return nil, nil
			}
			r, err := message.NewRouter(message.RouterConfig{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			r.AddMiddleware(ib.Middleware)
			if withRecoverer {
				r.AddMiddleware(wmw.Recoverer) // inside the inbox: the panic becomes an error
			}
			r.AddConsumerHandler("orders-handler", "orders", ps, func(m *message.Message) error { _, err := h(m); return err })
			go func() { _ = r.Run(context.Background()) }()
			<-r.Running()
			t.Cleanup(func() { _ = r.Close() })

			publish(t, ps, order("p-1"))
			testenv.Eventually(t, 10*time.Second, "applied after the panic", func() bool { return led.count("p-1") == 1 })
			testenv.Eventually(t, 5*time.Second, "marked", func() bool { return getRecord(t, store, "p-1").State == inbox.StateProcessed })
			if got := store.releases.Load(); got != 1 {
				t.Fatalf("Release called %d times, want 1", got)
			}
			if rec.get(inboxmw.OutcomeBusy) != 0 {
				t.Fatal("the redelivery found the key busy: the panic did not release the lease")
			}
			if a := getRecord(t, store, "p-1").Attempts; a != 2 {
				t.Fatalf("attempts %d, want 2", a)
			}
		})
	}
}

// failingPublisher fails its first n publishes.
type failingPublisher struct {
	message.Publisher
	fail atomic.Int32
}

func (p *failingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.fail.Add(-1) >= 0 {
		return errors.New("injected publish failure")
	}
	return p.Publisher.Publish(topic, msgs...)
}

func TestInbox_router_publish_failure_does_not_lose_produced_messages(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	out, err := ps.Subscribe(context.Background(), "shipments")
	if err != nil {
		t.Fatal(err)
	}
	store := newFaulty(t)
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec})
	pub := &failingPublisher{Publisher: ps}
	pub.fail.Store(2)
	var runs atomic.Int32
	startRouter(t, ps, pub, "shipments", ib, func(m *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		return []*message.Message{message.NewMessage("ship-"+m.Metadata.Get("IdempotencyKey"), []byte("ship"))}, nil
	})
	publish(t, ps, order("o-1"))
	select {
	case got := <-out:
		got.Ack()
		// The UUID the handler chose is replaced by the derived one.
		if want := inboxmw.OutputID("test:g:orders-handler:o-1", 0); got.UUID != want || string(got.Payload) != "ship" {
			t.Fatalf("produced message %q (%q), want %s (ship)", got.UUID, got.Payload, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the produced message never arrived: lost after the publish failures")
	}
	testenv.Eventually(t, 5*time.Second, "the key marked once the publish succeeded", func() bool {
		return getRecord(t, store, "o-1").State == inbox.StateProcessed
	})
	if r := runs.Load(); r != 3 {
		t.Fatalf("handler ran %d times, want 3 (two nacked publishes, one success)", r)
	}
	// The released outcome is counted after Release returns, on the ack
	// waiter's goroutine: the next delivery can claim, run and be marked
	// before that count lands. Wait for it, then check it is exact.
	testenv.Eventually(t, 5*time.Second, "both nacks released", func() bool {
		return rec.get(inboxmw.OutcomeReleased) >= 2
	})
	if rel := rec.get(inboxmw.OutcomeReleased); rel != 2 {
		t.Fatalf("released %d times on nack, want 2", rel)
	}
}

func TestInbox_complete_failing_once_does_not_run_handler_again(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	store := newFaulty(t)
	store.failCompletes.Store(1)
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec, Lease: 2 * time.Second})
	led := newLedger()
	startRouter(t, ps, nil, "", ib, func(m *message.Message) ([]*message.Message, error) {
		led.apply(m.Metadata.Get("IdempotencyKey"))
		return nil, nil
	})
	publish(t, ps, order("c-1"))
	testenv.Eventually(t, 10*time.Second, "the mark landed on retry", func() bool {
		return getRecord(t, store, "c-1").State == inbox.StateProcessed
	})
	if r := rec.get(inboxmw.OutcomeCompleteRetry); r != 1 {
		t.Fatalf("complete retries %d, want 1", r)
	}
	publish(t, ps, order("c-1"))
	testenv.Eventually(t, 5*time.Second, "the duplicate skipped", func() bool { return rec.get(inboxmw.OutcomeDuplicate) == 1 })
	if c := led.count("c-1"); c != 1 {
		t.Fatalf("applied %d times, want 1", c)
	}
	if rel := rec.get(inboxmw.OutcomeReleased); rel != 0 {
		t.Fatalf("the failed Complete led to %d releases (a nack?)", rel)
	}
}

func TestInbox_instant_ack_completes_right_away(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	store := newFaulty(t)
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec})
	led := newLedger()
	startRouter(t, ps, nil, "", ib, func(m *message.Message) ([]*message.Message, error) {
		led.apply(m.Metadata.Get("IdempotencyKey"))
		return nil, nil
	}, wmw.InstantAck)
	publish(t, ps, order("i-1"), order("i-1"))
	testenv.Eventually(t, 10*time.Second, "both handled", func() bool {
		return rec.get(inboxmw.OutcomeProcessed)+rec.get(inboxmw.OutcomeDuplicate) == 2
	})
	if c := led.count("i-1"); c != 1 {
		t.Fatalf("applied %d times, want 1", c)
	}
}

func TestInbox_poison_queue_with_IsTransient_filter_keeps_busy_messages(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	poisoned, err := ps.Subscribe(context.Background(), "poison")
	if err != nil {
		t.Fatal(err)
	}
	store := newFaulty(t)
	store.down.Store(true)
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec, MaxBusyWait: 100 * time.Millisecond})
	pq, err := wmw.PoisonQueueWithFilter(ps, "poison", func(err error) bool { return !inboxmw.IsTransient(err) })
	if err != nil {
		t.Fatal(err)
	}
	led := newLedger()
	startRouter(t, ps, nil, "", ib, func(m *message.Message) ([]*message.Message, error) {
		if m.Metadata.Get("IdempotencyKey") == "bad" {
			return nil, errors.New("malformed order")
		}
		led.apply(m.Metadata.Get("IdempotencyKey"))
		return nil, nil
	}, pq)
	publish(t, ps, order("good"))
	testenv.Eventually(t, 10*time.Second, "store errors while the store is down", func() bool { return rec.get(inboxmw.OutcomeStoreError) >= 3 })
	store.down.Store(false)
	publish(t, ps, order("bad"))
	select {
	case m := <-poisoned:
		m.Ack()
		if id := m.Metadata.Get("IdempotencyKey"); id != "bad" {
			t.Fatalf("poisoned %q, want only the malformed message", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the malformed message never reached the poison queue")
	}
	testenv.Eventually(t, 10*time.Second, "the message delayed by the outage processed", func() bool { return led.count("good") == 1 })
}

// The lease-lost case through a real router: the first delivery's lease is
// taken away mid-handler, its context is canceled with ErrLeaseLost, it
// returns the error, the router nacks, and the redelivery applies the effect
// once.
func TestInbox_router_lease_lost_mid_handler_cancels_context(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	store := newFaulty(t)
	store.setExtendErr(inbox.ErrLeaseLost, true) // only the first lease is "stolen"
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec, Lease: time.Second, HeartbeatInterval: 100 * time.Millisecond})
	led := newLedger()
	causes := make(chan error, 4)
	var calls atomic.Int32
	startRouter(t, ps, nil, "", ib, func(m *message.Message) ([]*message.Message, error) {
		if calls.Add(1) == 1 {
			<-m.Context().Done() // a long handler that honours its context
			causes <- context.Cause(m.Context())
			return nil, m.Context().Err()
		}
		led.apply(m.Metadata.Get("IdempotencyKey"))
		return nil, nil
	})
	publish(t, ps, order("lost-1"))
	select {
	case cause := <-causes:
		if !errors.Is(cause, inbox.ErrLeaseLost) {
			t.Fatalf("handler context canceled with %v, want ErrLeaseLost", cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's context was never canceled")
	}
	testenv.Eventually(t, 10*time.Second, "the redelivery applied once", func() bool { return led.count("lost-1") == 1 })
	testenv.Eventually(t, 5*time.Second, "marked", func() bool { return getRecord(t, store, "lost-1").State == inbox.StateProcessed })
	if rec.get(inboxmw.OutcomeLeaseLost) != 1 {
		t.Fatalf("lease_lost counted %d times, want 1", rec.get(inboxmw.OutcomeLeaseLost))
	}
}
