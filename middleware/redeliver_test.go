package inboxmw_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
)

// fakeBroker is an inboxmw.Redeliverer that plays a broker's delay: it
// publishes the copy back to its topic once the delay has passed (or at
// once, when early is set, to play a copy that comes back before its
// backoff ends), and records every hand-off.
type fakeBroker struct {
	pub   message.Publisher
	early atomic.Bool
	fail  atomic.Int32 // the next N hand-offs fail

	mu      sync.Mutex
	handoff []handoff
}

type handoff struct {
	topic string
	delay time.Duration
	at    time.Time
	meta  message.Metadata
	uuid  string
}

var errHandOff = errors.New("broker refused the copy")

func (b *fakeBroker) Redeliver(ctx context.Context, topic string, msg *message.Message, delay time.Duration) error {
	if b.fail.Add(-1) >= 0 {
		return errHandOff
	}
	b.fail.Store(0)
	b.mu.Lock()
	b.handoff = append(b.handoff, handoff{topic: topic, delay: delay, at: time.Now(), meta: maps.Clone(msg.Metadata), uuid: msg.UUID})
	b.mu.Unlock()
	wait := delay
	if b.early.Load() {
		wait = 0
	}
	time.AfterFunc(wait, func() { _ = b.pub.Publish(topic, msg) })
	return nil
}

func (b *fakeBroker) handoffs() []handoff {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]handoff(nil), b.handoff...)
}

// runs records when the handler ran for each id.
type runs struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func (r *runs) add(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.at == nil {
		r.at = map[string][]time.Time{}
	}
	r.at[id] = append(r.at[id], time.Now())
	return len(r.at[id])
}

func (r *runs) get(id string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.at[id]...)
}

func fixedBackoff(d time.Duration) func(int) time.Duration {
	return func(int) time.Duration { return d }
}

// failsOnce is a handler whose first run of each id fails with errBoom and
// whose later runs apply it to led.
func failsOnce(rs *runs, led *ledger) message.HandlerFunc {
	return func(m *message.Message) ([]*message.Message, error) {
		id := m.Metadata.Get("IdempotencyKey")
		if rs.add(id) == 1 {
			return nil, errBoom
		}
		led.apply(id)
		return nil, nil
	}
}

// countingErrors is a middleware, outside the inbox's, that counts the
// errors returned to the router.
func countingErrors(n *atomic.Int32) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			out, err := h(m)
			if err != nil {
				n.Add(1)
			}
			return out, err
		}
	}
}

// A failed attempt is handed to the broker and the original acked: the
// consumer goes on with the next message at once (no in-process wait, no
// nack), and the copy, back after the backoff, runs the handler again.
func TestRedelivery_failed_attempt_waits_in_the_broker(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	store := newMemory(t)
	broker := &fakeBroker{pub: ps}
	rec := newRecorder()
	const backoff = 600 * time.Millisecond
	ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec, Redelivery: broker, Backoff: fixedBackoff(backoff)})
	led := newLedger()
	var rs runs
	var errs atomic.Int32
	startRouter(t, ps, nil, "", ib, func(m *message.Message) ([]*message.Message, error) {
		id := m.Metadata.Get("IdempotencyKey")
		if rs.add(id) == 1 && id == "flaky" {
			return nil, errBoom
		}
		led.apply(id)
		return nil, nil
	}, countingErrors(&errs))

	publish(t, ps, order("flaky"))
	testenv.Eventually(t, 5*time.Second, "the failed attempt handed off", func() bool { return len(broker.handoffs()) == 1 })
	publish(t, ps, order("next"))
	testenv.Eventually(t, 5*time.Second, "the next message processed", func() bool { return led.count("next") == 1 })
	if led.count("flaky") != 0 && time.Since(rs.get("flaky")[0]) < backoff {
		t.Fatal("the failed message ran again before its backoff")
	}
	testenv.Eventually(t, 10*time.Second, "the copy processed", func() bool { return led.count("flaky") == 1 })

	at := rs.get("flaky")
	if gap := at[1].Sub(at[0]); gap < backoff {
		t.Fatalf("the copy ran %s after the failure, before the backoff of %s", gap, backoff)
	}
	h := broker.handoffs()[0]
	if h.topic != "orders" || h.delay != backoff {
		t.Fatalf("handed off to %q with delay %s, want orders and %s", h.topic, h.delay, backoff)
	}
	if h.meta.Get(inboxmw.MetadataKey) != "test:g:orders-handler:flaky" || h.meta.Get(inboxmw.MetadataAttempts) != "1" || h.meta.Get("IdempotencyKey") != "flaky" {
		t.Fatalf("copy metadata %v", h.meta)
	}
	if n := errs.Load(); n != 0 {
		t.Fatalf("the middleware returned %d errors; a hand-off acks the original", n)
	}
	// The ledger records the effect inside the handler; the mark follows
	// the ack, so wait for it.
	testenv.Eventually(t, 5*time.Second, "flaky processed after 2 attempts", func() bool {
		r := getRecord(t, store, "flaky")
		return r.State == inbox.StateProcessed && r.Attempts == 2
	})
	if got := rec.get(inboxmw.OutcomeRedelivered); got != 1 {
		t.Fatalf("redelivered counted %d, want 1", got)
	}
	if got := rec.callCount(inboxmw.OpRedeliver); got != 1 {
		t.Fatalf("redeliver calls %d, want 1", got)
	}
}

// RedeliveryMinDelay splits the failed attempts: a backoff at or above it
// (the default: a millisecond) is handed to the broker and the original
// acked; a shorter one returns the handler's error, so the broker
// redelivers and the claim waits out the rest in-process.
func TestRedelivery_min_delay_splits_hand_off_from_in_process_wait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		backoff  time.Duration
		minDelay time.Duration
		handOff  bool
	}{
		{"default, 20ms backoff: handed off", 20 * time.Millisecond, 0, true},
		{"default, 1ms backoff: handed off", time.Millisecond, 0, true},
		{"default, 500µs backoff: in-process", 500 * time.Microsecond, 0, false},
		{"50ms min, 20ms backoff: in-process", 20 * time.Millisecond, 50 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ps := newPubSub(t)
			broker := &fakeBroker{pub: ps}
			rec := newRecorder()
			ib := newInbox(t, inboxmw.Config{Store: newMemory(t), Metrics: rec, Redelivery: broker,
				Backoff: fixedBackoff(tc.backoff), RedeliveryMinDelay: tc.minDelay})
			led := newLedger()
			var rs runs
			var errs atomic.Int32
			startRouter(t, ps, nil, "", ib, failsOnce(&rs, led), countingErrors(&errs))
			publish(t, ps, order("x"))
			testenv.Eventually(t, 10*time.Second, "the retried message processed", func() bool { return led.count("x") == 1 })
			at := rs.get("x")
			if gap := at[1].Sub(at[0]); gap < tc.backoff {
				t.Errorf("ran again %s after the failure, before its backoff of %s", gap, tc.backoff)
			}
			handoffs, nacks := 1, 0 // a hand-off acks the original
			if !tc.handOff {
				handoffs, nacks = 0, 1 // an in-process wait nacks it
			}
			if got := len(broker.handoffs()); got != handoffs || rec.get(inboxmw.OutcomeRedelivered) != handoffs {
				t.Errorf("%d hand-offs, %d redelivered outcomes; want %d", got, rec.get(inboxmw.OutcomeRedelivered), handoffs)
			}
			if got := int(errs.Load()); got != nacks {
				t.Errorf("the middleware returned %d errors, want %d", got, nacks)
			}
		})
	}
}

// A copy that comes back before its key's backoff has ended is handed off
// again for the remainder, and runs only once the backoff is over.
func TestRedelivery_early_copy_is_handed_off_again_for_the_rest(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	store := newMemory(t)
	broker := &fakeBroker{pub: ps}
	broker.early.Store(true)
	const backoff = time.Second
	ib := newInbox(t, inboxmw.Config{Store: store, Redelivery: broker, Backoff: fixedBackoff(backoff)})
	var rs runs
	led := newLedger()
	startRouter(t, ps, nil, "", ib, func(m *message.Message) ([]*message.Message, error) {
		id := m.Metadata.Get("IdempotencyKey")
		if rs.add(id) == 1 {
			return nil, errBoom
		}
		broker.early.Store(false)
		led.apply(id)
		return nil, nil
	})
	publish(t, ps, order("o-1"))
	testenv.Eventually(t, 5*time.Second, "the early copy handed off again", func() bool { return len(broker.handoffs()) >= 2 })
	broker.early.Store(false)
	testenv.Eventually(t, 10*time.Second, "processed", func() bool { return led.count("o-1") == 1 })
	hs := broker.handoffs()
	if hs[1].delay <= 0 || hs[1].delay >= hs[0].delay {
		t.Fatalf("second hand-off's delay %s, want the remainder of %s", hs[1].delay, hs[0].delay)
	}
	if at := rs.get("o-1"); len(at) != 2 || at[1].Sub(at[0]) < backoff {
		t.Fatalf("runs at %v: want 2, the second at least %s after the first", at, backoff)
	}
}

// When the hand-off fails, the failed attempt goes back to the broker as an
// error (the default flow), and the failure is counted.
func TestRedelivery_failed_hand_off_falls_back_to_the_broker_redelivery(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	store := newMemory(t)
	broker := &fakeBroker{pub: ps}
	broker.fail.Store(100)
	rec := newRecorder()
	logs := watermill.NewCaptureLogger()
	ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec, Logger: logs, Redelivery: broker, MaxAttempts: 5,
		Backoff: fixedBackoff(200 * time.Millisecond)})
	led := newLedger()
	var rs runs
	var returned sync.Map
	startRouter(t, ps, nil, "", ib, failsOnce(&rs, led), func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			out, err := h(m)
			if err != nil {
				returned.Store(err.Error(), err)
			}
			return out, err
		}
	})
	publish(t, ps, order("o-1"))
	testenv.Eventually(t, 10*time.Second, "processed after the broker's redelivery", func() bool { return led.count("o-1") == 1 })
	var attemptErr bool
	returned.Range(func(_, v any) bool {
		attemptErr = attemptErr || errors.Is(v.(error), inbox.ErrAttemptFailed)
		return true
	})
	if !attemptErr {
		t.Fatal("the failed attempt was not returned as an AttemptError")
	}
	if got := rec.get(inboxmw.OutcomeRedeliveryFailed); got < 1 {
		t.Fatalf("redelivery_failed counted %d", got)
	}
	if !logged(logs, watermill.ErrorLogLevel, "Inbox could not hand the message to the broker's redelivery; it goes back to the broker, and its redelivery waits in-process") {
		t.Fatalf("no log of the failed hand-off: %v", logs.Captured())
	}
}

// With MaxAttempts 3 and a handler that always fails, the key is dead after
// exactly 3 attempts, each at least a backoff after the previous one; the
// dead message reaches a filtered poison queue, and other messages flow
// meanwhile.
func TestRedelivery_poison_message_dead_after_max_attempts(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	store := newMemory(t)
	broker := &fakeBroker{pub: ps}
	const backoff = 300 * time.Millisecond
	ib := newInbox(t, inboxmw.Config{Store: store, Redelivery: broker, MaxAttempts: 3, Backoff: fixedBackoff(backoff)})
	poisoned, err := ps.Subscribe(context.Background(), "poison")
	if err != nil {
		t.Fatal(err)
	}
	poison, err := wmw.PoisonQueueWithFilter(ps, "poison", func(err error) bool { return !inboxmw.IsTransient(err) })
	if err != nil {
		t.Fatal(err)
	}
	var rs runs
	led := newLedger()
	startRouter(t, ps, nil, "", ib, func(m *message.Message) ([]*message.Message, error) {
		id := m.Metadata.Get("IdempotencyKey")
		rs.add(id)
		if id == "bad" {
			return nil, errBoom
		}
		led.apply(id)
		return nil, nil
	}, poison)
	publish(t, ps, order("bad"))
	for i := range 5 {
		publish(t, ps, order(fmt.Sprint("good-", i)))
	}
	testenv.Eventually(t, 5*time.Second, "the other messages processed", func() bool {
		for i := range 5 {
			if led.count(fmt.Sprint("good-", i)) != 1 {
				return false
			}
		}
		return true
	})
	select {
	case m := <-poisoned:
		m.Ack()
		if m.Metadata.Get("IdempotencyKey") != "bad" {
			t.Fatalf("poisoned %v", m.Metadata)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("nothing poisoned after %d runs", len(rs.get("bad")))
	}
	at := rs.get("bad")
	if len(at) != 3 {
		t.Fatalf("%d runs, want 3", len(at))
	}
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < backoff {
			t.Fatalf("run %d came %s after run %d, before the backoff of %s", i+1, gap, i, backoff)
		}
	}
	if n := len(broker.handoffs()); n != 2 {
		t.Fatalf("%d hand-offs, want 2 (the third failure is dead)", n)
	}
	if r := getRecord(t, store, "bad"); r.State != inbox.StateDead || r.Attempts != 3 {
		t.Fatalf("record %+v, want dead after 3 attempts", r)
	}
}

// A handler's error marked inbox.Permanent makes the key dead at its first
// failure, with or without MaxAttempts and Redelivery.
func TestInbox_permanent_error_is_dead_at_once(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		cfg  inboxmw.Config
	}{
		{"plain", inboxmw.Config{}},
		{"max attempts", inboxmw.Config{MaxAttempts: 5}},
		{"redelivery", inboxmw.Config{MaxAttempts: 5}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ps := newPubSub(t)
			store := newMemory(t)
			cfg := c.cfg
			cfg.Store = store
			broker := &fakeBroker{pub: ps}
			if c.name == "redelivery" {
				cfg.Redelivery = broker
			}
			ib := newInbox(t, cfg)
			poisoned, err := ps.Subscribe(context.Background(), "poison")
			if err != nil {
				t.Fatal(err)
			}
			poison, err := wmw.PoisonQueueWithFilter(ps, "poison", func(err error) bool { return !inboxmw.IsTransient(err) })
			if err != nil {
				t.Fatal(err)
			}
			var rs runs
			cause := errors.New("order has no customer")
			startRouter(t, ps, nil, "", ib, func(m *message.Message) ([]*message.Message, error) {
				rs.add(m.Metadata.Get("IdempotencyKey"))
				return nil, fmt.Errorf("charge: %w", inbox.Permanent(cause))
			}, poison)
			publish(t, ps, order("o-1"))
			select {
			case m := <-poisoned:
				m.Ack()
				if r := m.Metadata.Get(wmw.ReasonForPoisonedKey); r == "" {
					t.Fatalf("poisoned without a reason: %v", m.Metadata)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("not poisoned after %d runs", len(rs.get("o-1")))
			}
			if n := len(rs.get("o-1")); n != 1 {
				t.Fatalf("%d runs, want 1", n)
			}
			r := getRecord(t, store, "o-1")
			if r.State != inbox.StateDead || r.Attempts != 1 || r.Reason != "charge: order has no customer" {
				t.Fatalf("record %+v, want dead after 1 attempt with the error's text", r)
			}
			if n := len(broker.handoffs()); n != 0 {
				t.Fatalf("%d hand-offs of a permanent failure", n)
			}
		})
	}
}

// Under InstantAck (outside the inbox) a failed handler used to lose its
// message: the original was acked before the handler. The hand-off to the
// broker keeps it.
func TestRedelivery_rescues_a_failed_message_under_instant_ack(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	store := newMemory(t)
	broker := &fakeBroker{pub: ps}
	ib := newInbox(t, inboxmw.Config{Store: store, Redelivery: broker, Backoff: fixedBackoff(200 * time.Millisecond)})
	var rs runs
	led := newLedger()
	startRouter(t, ps, nil, "", ib, func(m *message.Message) ([]*message.Message, error) {
		id := m.Metadata.Get("IdempotencyKey")
		if rs.add(id) == 1 {
			return nil, errBoom
		}
		led.apply(id)
		return nil, nil
	}, wmw.InstantAck)
	publish(t, ps, order("o-1"))
	testenv.Eventually(t, 10*time.Second, "processed from the copy", func() bool { return led.count("o-1") == 1 })
	testenv.Eventually(t, 5*time.Second, "marked", func() bool { return getRecord(t, store, "o-1").State == inbox.StateProcessed })
}

// A copy is keyed by the key it carries, even when the id sources would
// give another id (here: a source that reads where the broker put the
// original, which a copy does not have).
func TestRedelivery_copy_keeps_its_key(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	store := newMemory(t)
	broker := &fakeBroker{pub: ps}
	var position atomic.Int64
	ib := newInbox(t, inboxmw.Config{Store: store, Redelivery: broker, Backoff: fixedBackoff(200 * time.Millisecond),
		IDSources: []keying.IDSource{keying.IDSourceFunc("position", func(*message.Message) (string, error) {
			return strconv.FormatInt(position.Add(1), 10), nil // a new id at every delivery, as an offset would be
		})}})
	var calls atomic.Int32
	led := newLedger()
	startRouter(t, ps, nil, "", ib, func(m *message.Message) ([]*message.Message, error) {
		if calls.Add(1) == 1 {
			return nil, errBoom
		}
		led.apply(inboxmw.KeyFromCtx(m.Context()))
		return nil, nil
	})
	publish(t, ps, order("o-1"))
	testenv.Eventually(t, 10*time.Second, "processed from the copy", func() bool { return led.count("test:g:orders-handler:1") == 1 })

	// A carried key of another scope is ignored.
	for _, carried := range []string{"other:g:orders-handler:x", "test:other:orders-handler:x", "test:g:other-handler:x", "not a key"} {
		m := order("o-2")
		m.Metadata.Set(inboxmw.MetadataKey, carried)
		before := calls.Load()
		publish(t, ps, m)
		testenv.Eventually(t, 5*time.Second, "handled", func() bool { return calls.Load() == before+1 })
		if led.count(carried) != 0 {
			t.Fatalf("a message carrying %q was keyed by it", carried)
		}
	}
}

// slowBroker is a Redeliverer that holds each hand-off until released.
type slowBroker struct {
	entered chan struct{}
	release chan struct{}
	done    atomic.Int32
}

func (b *slowBroker) Redeliver(ctx context.Context, _ string, _ *message.Message, _ time.Duration) error {
	b.entered <- struct{}{}
	select {
	case <-b.release:
		b.done.Add(1)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close waits for a hand-off in flight, as for a pending mark: the copy is
// with the broker before Close returns.
func TestRedelivery_close_waits_for_a_hand_off_in_flight(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	broker := &slowBroker{entered: make(chan struct{}, 1), release: make(chan struct{})}
	ib, err := inboxmw.New(inboxmw.Config{Store: newMemory(t), Bus: "test", Group: "g", Redelivery: broker,
		Backoff: fixedBackoff(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	startRouter(t, ps, nil, "", ib, func(*message.Message) ([]*message.Message, error) { return nil, errBoom })
	publish(t, ps, order("o-1"))
	select {
	case <-broker.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no hand-off")
	}
	closed := make(chan error, 1)
	go func() { closed <- ib.Close(context.Background()) }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a hand-off was in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(broker.release)
	select {
	case err := <-closed:
		if err != nil || broker.done.Load() != 1 {
			t.Fatalf("Close: %v, hand-offs done %d", err, broker.done.Load())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return after the hand-off")
	}
}

// retryHints is a store (a wrapper of the memory store) that records the
// BeginOptions.Retry of each claim, in order.
type retryHints struct {
	inbox.LeaseStore
	mu    sync.Mutex
	hints []bool
}

func (s *retryHints) TryBegin(ctx context.Context, key string, opts inbox.BeginOptions) (inbox.Claim, error) {
	s.mu.Lock()
	s.hints = append(s.hints, opts.Retry)
	s.mu.Unlock()
	return s.LeaseStore.TryBegin(ctx, key, opts)
}

func (s *retryHints) get() []bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]bool(nil), s.hints...)
}

// The claim of a copy tells the store that its key was claimed before
// (BeginOptions.Retry), so that the Redis store claims it in one round
// trip; the first delivery's claim does not.
func TestRedelivery_copy_claims_with_the_retry_hint(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	store := &retryHints{LeaseStore: newMemory(t)}
	broker := &fakeBroker{pub: ps}
	ib := newInbox(t, inboxmw.Config{Store: store, Redelivery: broker, Backoff: fixedBackoff(100 * time.Millisecond)})
	led := newLedger()
	var rs runs
	startRouter(t, ps, nil, "", ib, failsOnce(&rs, led))
	publish(t, ps, order("o-1"))
	testenv.Eventually(t, 10*time.Second, "processed from the copy", func() bool { return led.count("o-1") == 1 })
	if got := store.get(); len(got) != 2 || got[0] || !got[1] {
		t.Fatalf("claims' Retry hints %v, want [false true]: the first delivery's, then the copy's", got)
	}
}
