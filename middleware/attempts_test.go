package inboxmw_test

import (
	"context"
	"errors"
	"fmt"
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

var noBackoff = inboxmw.ExponentialBackoff(time.Second, 0)

// flowRecord is the record of id's key in the direct-call tests (alias h).
func flowRecord(t *testing.T, s inbox.LeaseStore, id string) inbox.Record {
	t.Helper()
	r, err := s.Get(context.Background(), testKeyPrefix+id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The attempt that reaches MaxAttempts marks the key dead with the
// handler's error; later deliveries get the same error without running the
// handler. Neither is transient.
func TestInbox_max_attempts_marks_the_key_dead(t *testing.T) {
	t.Parallel()
	store := newMemory(t)
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec, Alias: staticAlias(), MaxAttempts: 3, Backoff: noBackoff})
	var runs atomic.Int32
	h := func(*message.Message) ([]*message.Message, error) {
		runs.Add(1)
		return nil, fmt.Errorf("order 7: %w", errBoom)
	}
	for i := 1; i <= 2; i++ {
		_, err := call(ib, h, msgFor("d-1"))
		var ae *inbox.AttemptError
		if !errors.As(err, &ae) || !errors.Is(err, errBoom) || !errors.Is(err, inbox.ErrAttemptFailed) || errors.Is(err, inbox.ErrDead) ||
			!inboxmw.IsTransient(err) || ae.Attempt != i || ae.MaxAttempts != 3 {
			t.Fatalf("attempt %d: %v (%+v), want a transient AttemptError %d of 3 wrapping the handler's error", i, err, ae, i)
		}
	}
	_, err := call(ib, h, msgFor("d-1"))
	var de *inbox.DeadError
	if !errors.As(err, &de) || !errors.Is(err, inbox.ErrDead) || !errors.Is(err, errBoom) || inboxmw.IsTransient(err) {
		t.Fatalf("third attempt: %v, want a DeadError wrapping ErrDead and the handler's error, not transient", err)
	}
	if de.Attempts != 3 || de.Key != testKeyPrefix+"d-1" || de.Reason != "order 7: "+errBoom.Error() {
		t.Fatalf("DeadError %+v", de)
	}
	r := flowRecord(t, store, "d-1")
	if r.State != inbox.StateDead || r.Attempts != 3 || r.Reason != de.Reason {
		t.Fatalf("record %+v, want Dead after 3 attempts with the reason", r)
	}
	_, err = call(ib, h, msgFor("d-1"))
	if !errors.As(err, &de) || de.Err == nil || de.Err.Error() != r.Reason || de.Reason != r.Reason || inboxmw.IsTransient(err) {
		t.Fatalf("delivery of a dead key: %v (%+v), want the DeadError wrapping the reason the store kept", err, de)
	}
	if runs.Load() != 3 {
		t.Fatalf("handler ran %d times, want 3", runs.Load())
	}
	if rec.get(inboxmw.OutcomeDead) != 2 {
		t.Fatalf("dead counted %d times, want 2", rec.get(inboxmw.OutcomeDead))
	}
	// A transient handler error that made the key dead is still not transient.
	if inboxmw.IsTransient(&inbox.DeadError{Err: context.Canceled}) {
		t.Fatal("a DeadError wrapping context.Canceled is transient")
	}
}

// A failed attempt's backoff is held by the store: the redelivery waits for
// it in-process (polling Busy), then runs; with MaxBusyWait shorter than the
// backoff it is nacked with ErrBusy instead.
func TestInbox_backoff_waits_in_process(t *testing.T) {
	t.Parallel()
	store := newFaulty(t)
	const backoff = 300 * time.Millisecond
	ib := newInbox(t, inboxmw.Config{Store: store, Alias: staticAlias(), Backoff: func(attempt int) time.Duration {
		if attempt != 1 {
			t.Errorf("Backoff(%d), want attempt 1", attempt)
		}
		return backoff
	}})
	fail := true
	h := func(*message.Message) ([]*message.Message, error) {
		if fail {
			return nil, errBoom
		}
		return nil, nil
	}
	if _, err := call(ib, h, msgFor("bo-1")); !errors.Is(err, errBoom) {
		t.Fatal(err)
	}
	failed := time.Now()
	if r := flowRecord(t, store.LeaseStore, "bo-1"); r.RetryAt.IsZero() || r.Reason != errBoom.Error() {
		t.Fatalf("record after the failure %+v, want a RetryAt and the reason", r)
	}
	fail = false
	again := msgFor("bo-1")
	if _, err := call(ib, h, again); err != nil {
		t.Fatalf("redelivery: %v", err)
	}
	again.Ack()
	if waited := time.Since(failed); waited < backoff-20*time.Millisecond {
		t.Fatalf("the redelivery ran %s after the failure, before the backoff of %s", waited, backoff)
	}
	if store.busyAnswers.Load() == 0 {
		t.Fatal("the redelivery never saw Busy")
	}

	short := newInbox(t, inboxmw.Config{Store: store, Alias: staticAlias(), MaxBusyWait: 50 * time.Millisecond,
		Backoff: func(int) time.Duration { return time.Minute }})
	if _, err := call(short, func(*message.Message) ([]*message.Message, error) { return nil, errBoom }, msgFor("bo-2")); !errors.Is(err, errBoom) {
		t.Fatal(err)
	}
	if _, err := call(short, ok, msgFor("bo-2")); !errors.Is(err, inbox.ErrBusy) {
		t.Fatalf("redelivery within a long backoff: %v, want ErrBusy", err)
	}
}

// A handler failing twice then succeeding, with the default backoff, runs
// three times, each failure costing one nack and no more, with gaps that
// grow: the second backoff is drawn from [0, 4 s), the first from [0, 2 s).
// Full jitter makes one pair of gaps random, so the check is on the means
// over many messages (a failure here would need the means of 24 uniform
// draws each to be more than 3.8 standard deviations off).
func TestInbox_default_backoff_gaps_grow_without_a_nack_loop(t *testing.T) {
	t.Parallel()
	const n = 24
	ps := newPubSub(t)
	store := newMemory(t)
	ib := newInbox(t, inboxmw.Config{Store: store})
	var mu sync.Mutex
	runs := map[string][]time.Time{}
	var nacks atomic.Int32
	r, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Outside the inbox: every error the inbox returns is one nack.
	r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			out, err := h(m)
			if err != nil {
				nacks.Add(1)
			}
			return out, err
		}
	}, ib.Middleware)
	r.AddConsumerHandler("orders-handler", "orders", ps, func(m *message.Message) error {
		id := m.Metadata.Get("IdempotencyKey")
		mu.Lock()
		defer mu.Unlock()
		runs[id] = append(runs[id], time.Now())
		if len(runs[id]) <= 2 {
			return errBoom
		}
		return nil
	})
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	t.Cleanup(func() { _ = r.Close() })
	for i := range n {
		publish(t, ps, order(fmt.Sprint("g-", i)))
	}
	testenv.Eventually(t, 60*time.Second, "every message processed", func() bool {
		for i := range n {
			if getRecord(t, store, fmt.Sprint("g-", i)).State != inbox.StateProcessed {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	var sum1, sum2 time.Duration
	for id, ts := range runs {
		if len(ts) != 3 {
			t.Fatalf("%s ran %d times, want 3", id, len(ts))
		}
		g1, g2 := ts[1].Sub(ts[0]), ts[2].Sub(ts[1])
		if g1 > 2*time.Second+time.Second || g2 > 4*time.Second+time.Second {
			t.Errorf("%s: gaps %s and %s, over the backoff bounds (2 s, 4 s) plus slack", id, g1, g2)
		}
		sum1 += g1
		sum2 += g2
	}
	if got := nacks.Load(); got != 2*n {
		t.Fatalf("%d nacks for %d messages failing twice each, want %d: a nack loop", got, n, 2*n)
	}
	if sum2 <= sum1 {
		t.Fatalf("mean gaps %s then %s: want growing", sum1/n, sum2/n)
	}
	t.Logf("mean gaps: %s, then %s", sum1/n, sum2/n)
}

func TestKeyFromCtx_in_the_handler(t *testing.T) {
	t.Parallel()
	ib := newInbox(t, inboxmw.Config{Store: newMemory(t), Alias: staticAlias()})
	var got string
	m := msgFor("k-1")
	if _, err := call(ib, func(m *message.Message) ([]*message.Message, error) {
		got = inboxmw.KeyFromCtx(m.Context())
		return nil, nil
	}, m); err != nil {
		t.Fatal(err)
	}
	m.Ack()
	if got != testKeyPrefix+"k-1" {
		t.Fatalf("KeyFromCtx = %q, want %q", got, testKeyPrefix+"k-1")
	}
	if k := inboxmw.KeyFromCtx(context.Background()); k != "" {
		t.Fatalf("outside the middleware: %q", k)
	}
}

// A handler whose lease was lost fails without a Fail: the key is someone
// else's now, so its last attempt cannot make it dead.
func TestInbox_lost_lease_never_marks_dead(t *testing.T) {
	t.Parallel()
	store := newFaulty(t)
	store.setExtendErr(inbox.ErrLeaseLost, false)
	ib := newInbox(t, inboxmw.Config{Store: store, Alias: staticAlias(), MaxAttempts: 1,
		Lease: 300 * time.Millisecond, HeartbeatInterval: 50 * time.Millisecond})
	_, err := call(ib, func(m *message.Message) ([]*message.Message, error) {
		<-m.Context().Done()
		return nil, m.Context().Err()
	}, msgFor("lost-1"))
	if !errors.Is(err, context.Canceled) || errors.Is(err, inbox.ErrDead) {
		t.Fatalf("handler returned %v, want context.Canceled and not a dead key", err)
	}
	if store.releases.Load() != 0 {
		t.Fatal("the middleware gave back a lease it had lost")
	}
	if r := flowRecord(t, store.LeaseStore, "lost-1"); r.State == inbox.StateDead {
		t.Fatalf("record %+v is dead", r)
	}
}

// Without MaxAttempts a failed attempt returns the handler's error as it is:
// not transient, as before MaxAttempts existed.
func TestInbox_without_max_attempts_the_handler_error_is_returned_as_is(t *testing.T) {
	t.Parallel()
	ib := newInbox(t, inboxmw.Config{Store: newMemory(t), Alias: staticAlias(), Backoff: noBackoff})
	_, err := call(ib, func(*message.Message) ([]*message.Message, error) { return nil, errBoom }, msgFor("plain-err"))
	if err != errBoom || inboxmw.IsTransient(err) {
		t.Fatalf("error %v, want the handler's own error, not transient", err)
	}
}

// A router with a poison queue filtered by IsTransient outside the inbox and
// MaxAttempts 3: a message whose handler always fails runs 3 times (2
// nacks, the broker redelivers), then goes to the poison topic and is acked;
// the next message is processed.
func TestInbox_max_attempts_with_a_filtered_poison_queue(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	store := newMemory(t)
	ib := newInbox(t, inboxmw.Config{Store: store, MaxAttempts: 3, Backoff: noBackoff})
	poisoned, err := ps.Subscribe(context.Background(), "poison")
	if err != nil {
		t.Fatal(err)
	}
	poison, err := wmw.PoisonQueueWithFilter(ps, "poison", func(err error) bool { return !inboxmw.IsTransient(err) })
	if err != nil {
		t.Fatal(err)
	}
	var runs, nacks atomic.Int32
	led := newLedger()
	r, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			out, err := h(m)
			if err != nil {
				nacks.Add(1)
			}
			return out, err
		}
	}, poison, ib.Middleware)
	r.AddConsumerHandler("orders-handler", "orders", ps, func(m *message.Message) error {
		id := m.Metadata.Get("IdempotencyKey")
		if id == "bad" {
			runs.Add(1)
			return errBoom
		}
		led.apply(id)
		return nil
	})
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	t.Cleanup(func() { _ = r.Close() })
	publish(t, ps, order("bad"))
	select {
	case m := <-poisoned:
		m.Ack()
		if m.Metadata.Get("IdempotencyKey") != "bad" {
			t.Fatalf("poisoned %v", m.Metadata)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("nothing poisoned after %d runs", runs.Load())
	}
	if runs.Load() != 3 || nacks.Load() != 2 {
		t.Fatalf("%d runs and %d nacks before the poison queue, want 3 and 2", runs.Load(), nacks.Load())
	}
	if r := getRecord(t, store, "bad"); r.State != inbox.StateDead || r.Attempts != 3 {
		t.Fatalf("record %+v, want dead after 3 attempts", r)
	}
	publish(t, ps, order("good"))
	testenv.Eventually(t, 10*time.Second, "the next message processed", func() bool { return led.count("good") == 1 })
}

// MaxAttempts counts the key's lease acquisitions, not the handler's
// failures (Config.MaxAttempts): a consumer that crashed, a handler that
// succeeded but whose message was nacked (its output failed to publish) and
// a delivery refused under PayloadHashReject each acquired the key once, so
// with MaxAttempts 4 the first handler failure, on the fourth acquisition,
// makes the key dead.
func TestInbox_max_attempts_counts_lease_acquisitions(t *testing.T) {
	t.Parallel()
	store := newMemory(t)
	ib := newInbox(t, inboxmw.Config{Store: store, Alias: staticAlias(), MaxAttempts: 4, Backoff: noBackoff,
		PayloadHash: inboxmw.PayloadHashReject})
	key := testKeyPrefix + "count-1"
	available := func(what string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for r := flowRecord(t, store, "count-1"); r.State != inbox.StateAvailable; r = flowRecord(t, store, "count-1") {
			if time.Now().After(deadline) {
				t.Fatalf("after %s: record %+v, want Available", what, r)
			}
			time.Sleep(5 * time.Millisecond) // polling: the lease ends, or the release lands
		}
	}
	// 1. A consumer acquired the key and crashed: its lease expires.
	if _, err := store.TryBegin(context.Background(), key, inbox.BeginOptions{Lease: 50 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	available("a crashed consumer's lease")
	// 2. The handler succeeds, but the router nacks (its output failed to
	// publish).
	nacked := msgFor("count-1")
	if _, err := call(ib, okWithOutput, nacked); err != nil {
		t.Fatalf("successful handler: %v", err)
	}
	nacked.Nack()
	available("a nack after the handler succeeded")
	// 3. The same key with other content, refused under PayloadHashReject.
	other := msgFor("count-1")
	other.Payload = []byte("other content")
	if _, err := call(ib, ok, other); !errors.Is(err, inbox.ErrPayloadMismatch) {
		t.Fatalf("other payload under PayloadHashReject: %v, want ErrPayloadMismatch", err)
	}
	available("a payload mismatch")
	// 4. The handler's first failure is the fourth attempt: the key is dead.
	var failures atomic.Int32
	_, err := call(ib, func(*message.Message) ([]*message.Message, error) {
		failures.Add(1)
		return nil, errBoom
	}, msgFor("count-1"))
	var de *inbox.DeadError
	if !errors.As(err, &de) || de.Attempts != 4 || failures.Load() != 1 {
		t.Fatalf("first handler failure, on the fourth acquisition: %v (%+v) after %d failures, want a DeadError of attempt 4", err, de, failures.Load())
	}
	if r := flowRecord(t, store, "count-1"); r.State != inbox.StateDead || r.Attempts != 4 {
		t.Fatalf("record %+v, want Dead with 4 attempts", r)
	}
}

// A later delivery of a dead key returns a DeadError that wraps the reason
// the store kept (the handler's error text), as the delivery that made it
// dead wraps the handler's error: a poison queue or a log sees why.
func TestInbox_later_delivery_of_a_dead_key_wraps_the_reason(t *testing.T) {
	t.Parallel()
	store := newMemory(t)
	ib := newInbox(t, inboxmw.Config{Store: store, Alias: staticAlias(), MaxAttempts: 3, Backoff: noBackoff})
	h := func(*message.Message) ([]*message.Message, error) { return nil, fmt.Errorf("order 8: %w", errBoom) }
	for range 3 {
		_, _ = call(ib, h, msgFor("d-later"))
	}
	_, err := call(ib, h, msgFor("d-later"))
	var de *inbox.DeadError
	if !errors.As(err, &de) || !errors.Is(err, inbox.ErrDead) {
		t.Fatalf("fourth delivery: %v, want a DeadError", err)
	}
	want := "order 8: " + errBoom.Error()
	if inner := errors.Unwrap(err); inner == nil || inner.Error() != want {
		t.Fatalf("fourth delivery's DeadError wraps %v, want an error whose text is the kept reason %q", inner, want)
	}
}
