package inboxmw_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
)

// Direct calls of the middleware, playing the router's part: call the
// handler, then Ack or Nack.

const testKeyPrefix = "test:g:h:"

// call runs the middleware-wrapped h on msg as the router would and returns
// its result; it does not ack.
func call(ib *inboxmw.Inbox, h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	return ib.Middleware(h)(msg)
}

func msgFor(id string) *message.Message {
	m := order(id)
	m.SetContext(context.Background())
	return m
}

func ok(m *message.Message) ([]*message.Message, error) { return nil, nil }

// okWithOutput succeeds and returns a message, so that its key is marked
// only once the router acked the input (a nack releases it).
func okWithOutput(m *message.Message) ([]*message.Message, error) {
	return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("out"))}, nil
}

func staticAlias() keying.AliasFunc { return keying.StaticAlias("h") }

func TestInbox_busy_key_waits_then_returns_ErrBusy(t *testing.T) {
	t.Parallel()
	store := newMemory(t)
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec, Alias: staticAlias(), MaxBusyWait: 150 * time.Millisecond})
	// Another consumer holds the key for a long time.
	if _, err := store.TryBegin(context.Background(), testKeyPrefix+"b-1", inbox.BeginOptions{Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	var ran atomic.Bool
	start := time.Now()
	_, err := call(ib, func(m *message.Message) ([]*message.Message, error) { ran.Store(true); return nil, nil }, msgFor("b-1"))
	waited := time.Since(start)
	var be *inbox.BusyError
	if !errors.Is(err, inbox.ErrBusy) || !errors.As(err, &be) || be.RetryAfter <= 0 {
		t.Fatalf("error %v, want a BusyError wrapping ErrBusy with RetryAfter", err)
	}
	if ran.Load() {
		t.Fatal("the handler ran on a busy key")
	}
	if waited < 140*time.Millisecond || waited > 5*time.Second {
		t.Fatalf("waited %s, want about MaxBusyWait (150ms)", waited)
	}
	if rec.callCount(inboxmw.OpTryBegin) < 2 {
		t.Fatalf("TryBegin called %d times, want the first call and at least one poll", rec.callCount(inboxmw.OpTryBegin))
	}
	if rec.get(inboxmw.OutcomeBusy) != 1 {
		t.Fatal("busy outcome not counted")
	}
}

// inBackoff leaves key waiting out a failed attempt's backoff of d, as
// another consumer's failed attempt would.
func inBackoff(t *testing.T, store inbox.LeaseStore, key string, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	c, err := store.TryBegin(ctx, key, inbox.BeginOptions{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Fail(ctx, key, c.LeaseID, inbox.FailOptions{Reason: "test", RetryAfter: d}); err != nil {
		t.Fatal(err)
	}
}

// A store that takes longer to answer than busySlack (FerretDB under -race
// load took more than 250 ms) reckons the backoff left when it reads the
// record, late in the call: the wait runs from the answer's arrival, so the
// message is claimed when the backoff ends, not nacked as busy before it.
func TestInbox_busy_wait_reckons_from_a_slow_answer(t *testing.T) {
	t.Parallel()
	store := newFaulty(t)
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec, Alias: staticAlias()})
	const backoff, late = 1500 * time.Millisecond, 600 * time.Millisecond
	inBackoff(t, store, testKeyPrefix+"b-slow", backoff)
	store.slowTryBegin.Store(int64(late))
	var ran atomic.Bool
	m := msgFor("b-slow")
	if _, err := call(ib, func(m *message.Message) ([]*message.Message, error) { ran.Store(true); return nil, nil }, m); err != nil {
		t.Fatalf("a key in a backoff shorter than MaxBusyWait, answered %s late: %v (%s); want it claimed when the backoff ends", late, err, rec)
	}
	m.Ack()
	if !ran.Load() || rec.get(inboxmw.OutcomeBusy) != 0 {
		t.Fatalf("handler ran %v, busy outcomes %d; want it run, none busy", ran.Load(), rec.get(inboxmw.OutcomeBusy))
	}
}

// A key waiting out a failed attempt's backoff longer than MaxBusyWait is
// busy for the backoff, and the error says so.
func TestInbox_busy_in_backoff_says_so(t *testing.T) {
	t.Parallel()
	store := newMemory(t)
	ib := newInbox(t, inboxmw.Config{Store: store, Alias: staticAlias(), MaxBusyWait: 50 * time.Millisecond})
	inBackoff(t, store, testKeyPrefix+"b-backoff", time.Minute)
	_, err := call(ib, ok, msgFor("b-backoff"))
	var be *inbox.BusyError
	if !errors.As(err, &be) || !be.BackingOff || be.RetryAfter <= 0 || !strings.Contains(err.Error(), "backoff") {
		t.Fatalf("error %v, want a BusyError of a key backing off, with its time left", err)
	}
}

func TestInbox_busy_key_completed_during_wait_is_a_duplicate(t *testing.T) {
	t.Parallel()
	store := newMemory(t)
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec, Alias: staticAlias()})
	ctx := context.Background()
	c, err := store.TryBegin(ctx, testKeyPrefix+"b-2", inbox.BeginOptions{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		// Complete once the middleware has polled at least once.
		for rec.callCount(inboxmw.OpTryBegin) < 2 {
			time.Sleep(time.Millisecond)
		}
		_ = store.Complete(ctx, testKeyPrefix+"b-2", c.LeaseID)
	}()
	var ran atomic.Bool
	out, err := call(ib, func(m *message.Message) ([]*message.Message, error) { ran.Store(true); return nil, nil }, msgFor("b-2"))
	if err != nil || out != nil || ran.Load() {
		t.Fatalf("got %v, %v, ran=%v; want a skipped duplicate", out, err, ran.Load())
	}
	if rec.get(inboxmw.OutcomeDuplicate) != 1 {
		t.Fatal("duplicate not counted")
	}
}

func TestInbox_busy_key_released_during_wait_is_acquired(t *testing.T) {
	t.Parallel()
	store := newMemory(t)
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec, Alias: staticAlias()})
	ctx := context.Background()
	c, err := store.TryBegin(ctx, testKeyPrefix+"b-3", inbox.BeginOptions{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for rec.callCount(inboxmw.OpTryBegin) < 2 {
			time.Sleep(time.Millisecond)
		}
		_ = store.Release(ctx, testKeyPrefix+"b-3", c.LeaseID)
	}()
	var ran atomic.Bool
	m := msgFor("b-3")
	if _, err := call(ib, func(m *message.Message) ([]*message.Message, error) { ran.Store(true); return nil, nil }, m); err != nil {
		t.Fatal(err)
	}
	m.Ack()
	if !ran.Load() {
		t.Fatal("the handler did not run after the holder released")
	}
	testenv.Eventually(t, 5*time.Second, "marked", func() bool {
		r, _ := store.Get(ctx, testKeyPrefix+"b-3")
		return r.State == inbox.StateProcessed
	})
}

func TestInbox_busy_wait_honours_message_context(t *testing.T) {
	t.Parallel()
	store := newMemory(t)
	ib := newInbox(t, inboxmw.Config{Store: store, Alias: staticAlias(), MaxBusyWait: time.Minute})
	if _, err := store.TryBegin(context.Background(), testKeyPrefix+"b-4", inbox.BeginOptions{Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	m := msgFor("b-4")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	m.SetContext(ctx)
	start := time.Now()
	_, err := call(ib, ok, m)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("error %v after %s, want the message context's deadline soon", err, time.Since(start))
	}
}

func TestInbox_lease_lost_cancels_handler_context(t *testing.T) {
	t.Parallel()
	store := newFaulty(t)
	store.setExtendErr(inbox.ErrLeaseLost, false)
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec, Alias: staticAlias(), Lease: 300 * time.Millisecond, HeartbeatInterval: 50 * time.Millisecond})
	var cause error
	_, err := call(ib, func(m *message.Message) ([]*message.Message, error) {
		select {
		case <-m.Context().Done():
			cause = context.Cause(m.Context())
			return nil, m.Context().Err()
		case <-time.After(10 * time.Second):
			return nil, errors.New("handler context never canceled")
		}
	}, msgFor("l-1"))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("handler returned %v, want context.Canceled", err)
	}
	if !errors.Is(cause, inbox.ErrLeaseLost) {
		t.Fatalf("cancellation cause %v, want one wrapping ErrLeaseLost", cause)
	}
	if rec.get(inboxmw.OutcomeLeaseLost) != 1 {
		t.Fatal("lease_lost not counted")
	}
	if store.releases.Load() != 0 {
		t.Fatal("the middleware released a lease it had lost")
	}
}

func TestInbox_lease_not_renewable_before_deadline_cancels_handler(t *testing.T) {
	t.Parallel()
	store := newFaulty(t)
	store.setExtendErr(errDown, false) // renewals fail, though nobody took the key
	rec := newRecorder()
	const lease = 300 * time.Millisecond
	ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec, Alias: staticAlias(), Lease: lease, HeartbeatInterval: lease / 4})
	start := time.Now()
	var cause error
	_, _ = call(ib, func(m *message.Message) ([]*message.Message, error) {
		<-m.Context().Done()
		cause = context.Cause(m.Context())
		return nil, m.Context().Err()
	}, msgFor("l-2"))
	took := time.Since(start)
	if !errors.Is(cause, inbox.ErrLeaseLost) || !strings.Contains(cause.Error(), "deadline") {
		t.Fatalf("cause %v, want ErrLeaseLost saying the deadline passed", cause)
	}
	if took < lease-20*time.Millisecond || took > lease+2*time.Second {
		t.Fatalf("handler canceled after %s, want at the lease's end (%s)", took, lease)
	}
	if n := rec.callCount(inboxmw.OpExtend); n < 2 {
		t.Fatalf("%d renewal attempts, want several before giving up", n)
	}
}

func TestInbox_store_without_extend_turns_heartbeats_off(t *testing.T) {
	t.Parallel()
	store := newFaulty(t)
	store.setExtendErr(inbox.ErrNotSupported, false)
	logs := watermill.NewCaptureLogger()
	const lease = time.Second
	ib := newInbox(t, inboxmw.Config{Store: store, Logger: logs, Alias: staticAlias(), Lease: lease, HeartbeatInterval: lease / 4})
	var cause error
	_, _ = call(ib, func(m *message.Message) ([]*message.Message, error) {
		<-m.Context().Done()
		cause = context.Cause(m.Context())
		return nil, m.Context().Err()
	}, msgFor("n-1"))
	if !errors.Is(cause, inbox.ErrLeaseLost) {
		t.Fatalf("cause %v, want ErrLeaseLost at the end of the unrenewable lease", cause)
	}
	if !logged(logs, watermill.InfoLogLevel, "Inbox store cannot extend leases: heartbeats off; a handler still running when its lease ends is canceled") {
		t.Fatalf("no log line about heartbeats off; got %+v", logs.Captured())
	}
	// A short handler under the same store is unaffected.
	m := msgFor("n-2")
	if _, err := call(ib, ok, m); err != nil {
		t.Fatal(err)
	}
	m.Ack()
}

func TestInbox_complete_lands_when_subscriber_cancels_context_at_ack(t *testing.T) {
	t.Parallel()
	store := newFaulty(t)
	ib := newInbox(t, inboxmw.Config{Store: store, Alias: staticAlias()})
	m := msgFor("a-1")
	ctx, cancel := context.WithCancel(context.Background())
	m.SetContext(ctx)
	if _, err := call(ib, ok, m); err != nil {
		t.Fatal(err)
	}
	// What subscribers do: ack, then cancel the message context.
	m.Ack()
	cancel()
	testenv.Eventually(t, 5*time.Second, "Complete landed", func() bool {
		r, _ := store.Get(context.Background(), testKeyPrefix+"a-1")
		return r.State == inbox.StateProcessed
	})
	if p := store.completeCtxErr.Load(); p == nil || *p != nil {
		t.Fatalf("Complete ran with a dead context: %v", p)
	}
}

// TestInbox_nack_after_success_releases: a handler that succeeded is
// marked only once the router acked its message; nacked (the messages it
// returned failed to publish, or a middleware outside the inbox turned the
// success into an error), its key is given back, whether it returned
// messages or none.
func TestInbox_nack_after_success_releases(t *testing.T) {
	t.Parallel()
	for name, h := range map[string]message.HandlerFunc{"an output": okWithOutput, "no output": ok} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store := newFaulty(t)
			rec := newRecorder()
			ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec, Alias: staticAlias()})
			m := msgFor("k-1")
			if _, err := call(ib, h, m); err != nil {
				t.Fatal(err)
			}
			m.Nack()
			testenv.Eventually(t, 5*time.Second, "released", func() bool {
				r, _ := store.Get(context.Background(), testKeyPrefix+"k-1")
				return r.State == inbox.StateAvailable
			})
			// Counted after Release returns, on the keeper's goroutine: the
			// record can show the key free a moment before the count lands.
			testenv.Eventually(t, 5*time.Second, "release counted", func() bool {
				return rec.get(inboxmw.OutcomeReleased) >= 1
			})
			if n, p := rec.get(inboxmw.OutcomeReleased), rec.get(inboxmw.OutcomeProcessed); n != 1 || p != 0 {
				t.Fatalf("release counted %d times and processed %d, want 1 and 0", n, p)
			}
		})
	}
}

func TestInbox_handler_error_releases_before_returning(t *testing.T) {
	t.Parallel()
	store := newFaulty(t)
	ib := newInbox(t, inboxmw.Config{Store: store, Alias: staticAlias(), Lease: time.Minute})
	_, err := call(ib, func(*message.Message) ([]*message.Message, error) { return nil, errBoom }, msgFor("e-1"))
	if !errors.Is(err, errBoom) {
		t.Fatalf("error %v, want the handler's", err)
	}
	// No polling: the release must have landed before the middleware returned.
	r, _ := store.Get(context.Background(), testKeyPrefix+"e-1")
	if r.State != inbox.StateAvailable {
		t.Fatalf("state right after the failed handler returned: %v, want Available", r.State)
	}
}

// ackOneOfTwo returns an Inbox over store that has handled a message of
// id acked and one of id waiting: the first acked, its mark sent; the
// second never acked, its mark pending.
func ackOneOfTwo(t *testing.T, store inbox.Store, acked, waiting string) *inboxmw.Inbox {
	t.Helper()
	ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "test", Group: "g", Alias: staticAlias()})
	if err != nil {
		t.Fatal(err)
	}
	a, w := msgFor(acked), msgFor(waiting)
	for _, m := range []*message.Message{a, w} {
		if _, err := call(ib, okWithOutput, m); err != nil {
			t.Fatal(err)
		}
	}
	a.Ack()
	return ib
}

func TestInbox_close_drains_pending_marks(t *testing.T) {
	t.Parallel()
	store := newMemory(t)
	ib := ackOneOfTwo(t, store, "d-1", "d-2")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := ib.Close(ctx) // d-2 is never acked: Close gives up on it
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close: %v, want a deadline error for the never-acked message", err)
	}
	get := func(id string) inbox.State {
		r, _ := store.Get(context.Background(), testKeyPrefix+id)
		return r.State
	}
	if s := get("d-1"); s != inbox.StateProcessed {
		t.Fatalf("acked message state %v after Close, want Processed", s)
	}
	testenv.Eventually(t, 5*time.Second, "the abandoned lease released", func() bool { return get("d-2") == inbox.StateAvailable })
	if _, err := call(ib, ok, msgFor("d-3")); !errors.Is(err, inbox.ErrClosed) {
		t.Fatalf("message after Close: %v, want ErrClosed", err)
	}
}

func TestInbox_close_waits_for_in_flight_marks(t *testing.T) {
	t.Parallel()
	store := newFaulty(t)
	store.failCompletes.Store(3) // the mark needs a few retries
	ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "test", Group: "g", Alias: staticAlias()})
	if err != nil {
		t.Fatal(err)
	}
	m := msgFor("w-1")
	if _, err := call(ib, ok, m); err != nil {
		t.Fatal(err)
	}
	m.Ack()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := ib.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if r, _ := store.Get(context.Background(), testKeyPrefix+"w-1"); r.State != inbox.StateProcessed {
		t.Fatalf("state after Close returned: %v, want Processed", r.State)
	}
}

func TestInbox_missing_key_policy(t *testing.T) {
	t.Parallel()
	noID := func() *message.Message {
		m := message.NewMessage("", []byte("x")) // no UUID, no IdempotencyKey
		m.SetContext(context.Background())
		return m
	}
	t.Run("process", func(t *testing.T) {
		t.Parallel()
		rec := newRecorder()
		logs := watermill.NewCaptureLogger()
		ib := newInbox(t, inboxmw.Config{Store: newMemory(t), Metrics: rec, Logger: logs, Alias: staticAlias()})
		var runs atomic.Int32
		for range 2 {
			if _, err := call(ib, func(*message.Message) ([]*message.Message, error) { runs.Add(1); return nil, nil }, noID()); err != nil {
				t.Fatal(err)
			}
		}
		if runs.Load() != 2 || rec.get(inboxmw.OutcomeNoKey) != 2 {
			t.Fatalf("runs %d, no_key %d; want 2 and 2", runs.Load(), rec.get(inboxmw.OutcomeNoKey))
		}
		if !logged(logs, watermill.InfoLogLevel, "Message has no idempotency key; processing it without deduplication") {
			t.Fatal("no log line for the message without id")
		}
	})
	t.Run("reject", func(t *testing.T) {
		t.Parallel()
		ib := newInbox(t, inboxmw.Config{Store: newMemory(t), Alias: staticAlias(), MissingKey: inboxmw.MissingKeyReject})
		var ran atomic.Bool
		_, err := call(ib, func(*message.Message) ([]*message.Message, error) { ran.Store(true); return nil, nil }, noID())
		if !errors.Is(err, inbox.ErrNoKey) || ran.Load() {
			t.Fatalf("error %v, ran %v; want ErrNoKey without running", err, ran.Load())
		}
	})
}

func TestInbox_payload_hash_policies(t *testing.T) {
	t.Parallel()
	withPayload := func(id, payload string) *message.Message {
		m := msgFor(id)
		m.Payload = []byte(payload)
		return m
	}
	for _, policy := range []inboxmw.PayloadHashPolicy{inboxmw.PayloadHashWarn, inboxmw.PayloadHashReject} {
		t.Run(map[inboxmw.PayloadHashPolicy]string{inboxmw.PayloadHashWarn: "warn", inboxmw.PayloadHashReject: "reject"}[policy], func(t *testing.T) {
			t.Parallel()
			rec := newRecorder()
			ib := newInbox(t, inboxmw.Config{Store: newMemory(t), Metrics: rec, Alias: staticAlias(), PayloadHash: policy})
			first := withPayload("h-1", "amount=10")
			if _, err := call(ib, ok, first); err != nil {
				t.Fatal(err)
			}
			first.Ack()
			testenv.Eventually(t, 5*time.Second, "marked", func() bool { return rec.get(inboxmw.OutcomeProcessed) == 1 })
			var ran atomic.Bool
			_, err := call(ib, func(*message.Message) ([]*message.Message, error) { ran.Store(true); return nil, nil }, withPayload("h-1", "amount=99"))
			if ran.Load() {
				t.Fatal("the handler ran for a processed key")
			}
			if rec.get(inboxmw.OutcomePayloadMismatch) != 1 {
				t.Fatal("mismatch not counted")
			}
			if policy == inboxmw.PayloadHashReject && !errors.Is(err, inbox.ErrPayloadMismatch) {
				t.Fatalf("reject: error %v, want ErrPayloadMismatch", err)
			}
			if policy == inboxmw.PayloadHashWarn && err != nil {
				t.Fatalf("warn: error %v, want the duplicate skipped", err)
			}
			// Same content again: a plain duplicate.
			if _, err := call(ib, ok, withPayload("h-1", "amount=10")); err != nil {
				t.Fatal(err)
			}
			if rec.get(inboxmw.OutcomePayloadMismatch) != 1 {
				t.Fatal("same content counted as a mismatch")
			}
		})
	}
}

func TestInbox_fail_open_processes_without_dedup(t *testing.T) {
	t.Parallel()
	store := newFaulty(t)
	store.down.Store(true)
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec, Alias: staticAlias(), FailOpen: true})
	start := time.Now()
	var runs atomic.Int32
	for range 2 {
		if _, err := call(ib, func(*message.Message) ([]*message.Message, error) { runs.Add(1); return nil, nil }, msgFor("f-1")); err != nil {
			t.Fatal(err)
		}
	}
	if runs.Load() != 2 || rec.get(inboxmw.OutcomeFailOpen) != 2 {
		t.Fatalf("runs %d, fail_open %d; want 2, 2", runs.Load(), rec.get(inboxmw.OutcomeFailOpen))
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("fail-open took %s for two messages: it must not back off first", took)
	}
}

// TestInbox_fail_closed_backs_off_then_returns_ErrStoreUnavailable: a
// failing claim is retried in-process with growing pauses for MaxBusyWait,
// then the message is given back with ErrStoreUnavailable, without running.
func TestInbox_fail_closed_backs_off_then_returns_ErrStoreUnavailable(t *testing.T) {
	t.Parallel()
	store := newFaulty(t)
	store.down.Store(true)
	rec := newRecorder()
	const wait = 1500 * time.Millisecond
	ib := newInbox(t, inboxmw.Config{Store: store, Alias: staticAlias(), Metrics: rec, MaxBusyWait: wait})
	var ran atomic.Bool
	start := time.Now()
	_, err := call(ib, func(*message.Message) ([]*message.Message, error) { ran.Store(true); return nil, nil }, msgFor("f-2"))
	took := time.Since(start)
	if !errors.Is(err, inbox.ErrStoreUnavailable) || ran.Load() {
		t.Fatalf("error %v, ran %v; want ErrStoreUnavailable without running", err, ran.Load())
	}
	// Pauses of 50 ms doubling to 2 s, jittered down to half: 4 to 9 claims.
	if n := store.tryBegins.Load(); n < 4 || n > 10 {
		t.Errorf("%d claims in %s of back-off, want a few (4 to 10), not a hot loop", n, took.Round(time.Millisecond))
	}
	if took < wait-100*time.Millisecond {
		t.Errorf("gave the message back after %s, want about MaxBusyWait %s", took, wait)
	}
	rec.mu.Lock()
	waited := rec.waited[inboxmw.WaitStoreBackoff]
	rec.mu.Unlock()
	if waited < wait/2 || waited > wait {
		t.Errorf("store_backoff wait reported %s, want about %s", waited, wait)
	}
	if n := rec.get(inboxmw.OutcomeStoreError); n != 1 {
		t.Errorf("store_error counted %d times for one message, want 1", n)
	}
}

// TestInbox_store_outage_logs_stay_readable: the first failure of an
// outage is logged with its cause, the next ones are counted without a line
// until storeLogEvery has passed, and the recovery is logged once.
func TestInbox_store_outage_logs_stay_readable(t *testing.T) {
	t.Parallel()
	store := newFaulty(t)
	store.down.Store(true)
	logs := watermill.NewCaptureLogger()
	ib := newInbox(t, inboxmw.Config{Store: store, Alias: staticAlias(), Logger: logs, MaxBusyWait: 20 * time.Millisecond})
	for i := range 30 {
		if _, err := call(ib, ok, msgFor(fmt.Sprint("o-", i))); !errors.Is(err, inbox.ErrStoreUnavailable) {
			t.Fatalf("message %d: %v, want ErrStoreUnavailable", i, err)
		}
	}
	errs := logs.Captured()[watermill.ErrorLogLevel]
	if len(errs) != 1 || !errors.Is(errs[0].Err, inbox.ErrStoreUnavailable) {
		t.Fatalf("%d error lines for 30 failed messages in one outage, want 1 with its cause: %v", len(errs), errs)
	}
	store.down.Store(false)
	// The first claims after the recovery wait for the pacer's next slot
	// (at most 2 s), longer than this MaxBusyWait: redeliver until through.
	for i := range 2 {
		testenv.Eventually(t, 10*time.Second, "a message through after the recovery", func() bool {
			m := msgFor(fmt.Sprint("after-", i))
			_, err := call(ib, ok, m)
			m.Ack()
			return err == nil
		})
	}
	var recovered int
	for _, l := range logs.Captured()[watermill.InfoLogLevel] {
		if l.Msg == "Inbox store recovered" {
			recovered++
		}
	}
	if recovered != 1 {
		t.Errorf("recovery logged %d times, want once", recovered)
	}
}

// TestInbox_failed_release_is_retried: a Release that fails after a failed
// handler is retried before the middleware returns, so the redelivery can
// claim the key at once instead of waiting for the lease to end.
func TestInbox_failed_release_is_retried(t *testing.T) {
	t.Parallel()
	store := newFaulty(t)
	store.failReleases.Store(2)
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: store, Alias: staticAlias(), Metrics: rec})
	m := msgFor("rel")
	if _, err := call(ib, func(*message.Message) ([]*message.Message, error) { return nil, errBoom }, m); !errors.Is(err, errBoom) {
		t.Fatalf("error %v, want the handler's", err)
	}
	r, err := store.Get(context.Background(), testKeyPrefix+"rel")
	if err != nil {
		t.Fatal(err)
	}
	if r.State != inbox.StateAvailable || store.releases.Load() != 3 || rec.get(inboxmw.OutcomeReleased) != 1 {
		t.Fatalf("after two failed releases: state %v, %d release calls, released counted %d; want Available, 3, 1",
			r.State, store.releases.Load(), rec.get(inboxmw.OutcomeReleased))
	}
}

func TestInbox_plain_store_flow(t *testing.T) {
	t.Parallel()
	mem := newMemory(t)
	ib := newInbox(t, inboxmw.Config{Store: plainStore{mem}, Alias: staticAlias()})
	var runs atomic.Int32
	// A handler that returns a message is marked once the router acked it.
	h := func(m *message.Message) ([]*message.Message, error) { runs.Add(1); return okWithOutput(m) }
	processed := func(id string) bool {
		ok, _ := mem.IsProcessed(context.Background(), testKeyPrefix+id)
		return ok
	}

	// Failure: not marked.
	if _, err := call(ib, func(*message.Message) ([]*message.Message, error) { return nil, errBoom }, msgFor("p-1")); !errors.Is(err, errBoom) {
		t.Fatal(err)
	}
	// Success but nacked (its message failed to publish): not marked.
	m := msgFor("p-1")
	if _, err := call(ib, h, m); err != nil {
		t.Fatal(err)
	}
	m.Nack()
	// Success and acked: marked; the next delivery is skipped.
	m = msgFor("p-1")
	if _, err := call(ib, h, m); err != nil {
		t.Fatal(err)
	}
	if processed("p-1") {
		t.Fatal("marked before the ack")
	}
	m.Ack()
	testenv.Eventually(t, 5*time.Second, "marked after ack", func() bool { return processed("p-1") })
	if _, err := call(ib, h, msgFor("p-1")); err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2 (nacked, then acked; the third skipped)", runs.Load())
	}
	// A handler that returns nothing is marked once the router acked it too.
	m = msgFor("p-2")
	if _, err := call(ib, ok, m); err != nil {
		t.Fatal(err)
	}
	if processed("p-2") {
		t.Fatal("handler that returned nothing marked before the ack")
	}
	m.Ack()
	testenv.Eventually(t, 5*time.Second, "marked after the ack of a handler that returned nothing", func() bool { return processed("p-2") })
}

func TestConfig_validate(t *testing.T) {
	t.Parallel()
	_, err := inboxmw.New(inboxmw.Config{Lease: time.Second, HeartbeatInterval: 2 * time.Second, MissingKey: 7})
	if !errors.Is(err, inboxmw.ErrInvalidConfig) || !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Fatalf("error %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{"Store is required", "bus", "group", "HeartbeatInterval", "MissingKey"} {
		if !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(want)) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}

// TestInbox_complete_reply_lost_is_not_a_lost_lease: a Complete that ran on
// the store but whose reply was lost is retried, and the retry succeeds (a
// repeated Complete under the completing lease does). Heartbeats due
// meanwhile must not report the consumer's own completed key as a lost
// lease (a fault found by a chaos run).
func TestInbox_complete_reply_lost_is_not_a_lost_lease(t *testing.T) {
	t.Parallel()
	store := newFaulty(t)
	store.loseReplies.Store(3) // retries span several heartbeat intervals
	rec := newRecorder()
	logs := watermill.NewCaptureLogger()
	ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec, Logger: logs, Alias: staticAlias(),
		Lease: 2 * time.Second, HeartbeatInterval: 20 * time.Millisecond})
	m := msgFor("reply-lost")
	if _, err := call(ib, ok, m); err != nil {
		t.Fatal(err)
	}
	m.Ack()
	testenv.Eventually(t, 10*time.Second, "the mark counted", func() bool { return rec.get(inboxmw.OutcomeProcessed) == 1 })
	if n := rec.get(inboxmw.OutcomeCompleteRetry); n != 3 {
		t.Errorf("complete retries %d, want 3", n)
	}
	if n := rec.get(inboxmw.OutcomeLeaseLost); n != 0 {
		t.Errorf("lease_lost counted %d times for a key completed under its own lease", n)
	}
	for _, e := range logs.Captured()[watermill.ErrorLogLevel] {
		if errors.Is(e.Err, inbox.ErrLeaseLost) || strings.Contains(e.Msg, "lease") {
			t.Errorf("lease reported lost for a message that was fine: %s: %v", e.Msg, e.Err)
		}
	}
}

// TestConfig_validate_reports_what_the_user_wrote: a negative Lease is one
// error; the HeartbeatInterval derived from it is not reported.
func TestConfig_validate_reports_what_the_user_wrote(t *testing.T) {
	t.Parallel()
	_, err := inboxmw.New(inboxmw.Config{Store: newMemory(t), Bus: "b", Group: "g", Lease: -time.Second})
	if err == nil || !strings.Contains(err.Error(), "Lease -1s is negative") {
		t.Fatalf("error %v, want Lease -1s is negative", err)
	}
	if strings.Contains(err.Error(), "HeartbeatInterval") {
		t.Errorf("error reports a HeartbeatInterval the user never set: %v", err)
	}
}

// TestInbox_store_outage_paced_across_messages: during an outage the
// claims of all messages in flight share one pace, so the store sees about
// one call per pause, not one per pause per message.
func TestInbox_store_outage_paced_across_messages(t *testing.T) {
	t.Parallel()
	store := newFaulty(t)
	store.down.Store(true)
	ib := newInbox(t, inboxmw.Config{Store: store, Alias: staticAlias(), MaxBusyWait: 2 * time.Second})
	const inFlight = 20
	var wg sync.WaitGroup
	for i := range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := call(ib, ok, msgFor(fmt.Sprint("p-", i))); !errors.Is(err, inbox.ErrStoreUnavailable) {
				t.Errorf("message %d: %v, want ErrStoreUnavailable", i, err)
			}
		}()
	}
	wg.Wait()
	// The first claims go out together; after them, pauses of 50 ms
	// doubling to 2 s leave room for about ten more in 2 s. Unpaced, each
	// message would make about seven.
	if n := store.tryBegins.Load(); n > inFlight+12 {
		t.Errorf("%d claims for %d messages in flight over 2 s of outage, want at most %d", n, inFlight, inFlight+12)
	}
}

// txOnly is a TxStore that is never called: for Config validation.
type txOnly struct{ plainStore }

func (txOnly) BeginTx(context.Context, string) (inboxmw.TxClaim, error) {
	return inboxmw.TxClaim{}, errors.New("not called")
}

func TestConfig_validate_TxStore_refuses_FailOpen_and_PayloadHash(t *testing.T) {
	t.Parallel()
	_, err := inboxmw.New(inboxmw.Config{Store: txOnly{plainStore{newMemory(t)}}, Bus: "b", Group: "g",
		FailOpen: true, PayloadHash: inboxmw.PayloadHashWarn})
	for _, want := range []string{"FailOpen cannot be used with a TxStore", "PayloadHash is not supported with a TxStore"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want it to say %q", err, want)
		}
	}
}

// TestInbox_no_busy_wait_still_recovers: with MaxBusyWait negative (no
// in-process wait) a failing store is still probed once a pause has passed,
// so messages go through again after the store recovers.
func TestInbox_no_busy_wait_still_recovers(t *testing.T) {
	t.Parallel()
	store := newFaulty(t)
	store.down.Store(true)
	ib := newInbox(t, inboxmw.Config{Store: store, Alias: staticAlias(), MaxBusyWait: -1})
	if _, err := call(ib, ok, msgFor("nw-0")); !errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Fatalf("while down: %v, want ErrStoreUnavailable", err)
	}
	store.down.Store(false)
	testenv.Eventually(t, 10*time.Second, "a message through after the recovery", func() bool {
		m := msgFor("nw-1")
		_, err := call(ib, ok, m)
		m.Ack()
		return err == nil
	})
}

// scriptedTx is a TxStore whose BeginTx fails while down is set, and
// otherwise takes slow (honouring the context it is given) and acquires;
// Finish commits nothing and succeeds.
type scriptedTx struct {
	plainStore
	down   atomic.Bool
	slow   time.Duration
	begins atomic.Int32
}

func (s *scriptedTx) BeginTx(ctx context.Context, key string) (inboxmw.TxClaim, error) {
	s.begins.Add(1)
	if s.down.Load() {
		return inboxmw.TxClaim{}, errDown
	}
	select {
	case <-time.After(s.slow):
	case <-ctx.Done():
		return inboxmw.TxClaim{}, ctx.Err()
	}
	return inboxmw.TxClaim{Status: inbox.Acquired, Context: ctx, Finish: func(_ []*message.Message, err error) error { return err }}, nil
}

// With a TxStore, MaxBusyWait bounds the paced retries of a BeginTx that
// fails (none with MaxBusyWait negative), and StoreTimeout does not apply:
// BeginTx runs under the message's context, as the transaction lives on in
// the handler (TxStore's doc, package txinbox's).
func TestInbox_TxStore_MaxBusyWait_paces_a_failing_BeginTx_StoreTimeout_does_not_apply(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		wait      time.Duration
		minBegins int32
	}{{-1, 1}, {600 * time.Millisecond, 2}} {
		s := &scriptedTx{plainStore: plainStore{newMemory(t)}}
		s.down.Store(true)
		ib := newInbox(t, inboxmw.Config{Store: s, Alias: staticAlias(), MaxBusyWait: c.wait})
		start := time.Now()
		_, err := call(ib, ok, msgFor("tx-down"))
		took := time.Since(start)
		if !errors.Is(err, inbox.ErrStoreUnavailable) {
			t.Fatalf("MaxBusyWait %s, BeginTx failing: %v, want ErrStoreUnavailable", c.wait, err)
		}
		if n := s.begins.Load(); n < c.minBegins || (c.wait < 0 && n != 1) {
			t.Errorf("MaxBusyWait %s: %d BeginTx calls, want at least %d (exactly 1 without a wait)", c.wait, n, c.minBegins)
		}
		if c.wait > 0 && (took < c.wait-50*time.Millisecond || took > c.wait+5*time.Second) {
			t.Errorf("MaxBusyWait %s: nacked after %s, want about MaxBusyWait", c.wait, took)
		}
	}
	s := &scriptedTx{plainStore: plainStore{newMemory(t)}, slow: 300 * time.Millisecond}
	ib := newInbox(t, inboxmw.Config{Store: s, Alias: staticAlias(), StoreTimeout: 10 * time.Millisecond})
	var ran atomic.Bool
	if _, err := call(ib, func(*message.Message) ([]*message.Message, error) { ran.Store(true); return nil, nil }, msgFor("tx-slow")); err != nil || !ran.Load() {
		t.Fatalf("a BeginTx slower than StoreTimeout: %v (handler ran: %v), want it to run", err, ran.Load())
	}
}

// A LeaseStore without the stores' Go method (here a wrapper that embeds
// inbox.LeaseStore around the memory store, which hides it) is said once at
// New: its marks each run in a goroutine of their own. The memory store
// itself is not.
func TestNew_logs_a_store_without_Go(t *testing.T) {
	t.Parallel()
	const msg = "Inbox store has no Go method (a store of your own, or a wrapper that hides it): its marks and heartbeats run on the inbox's own workers"
	for _, tc := range []struct {
		name  string
		store inbox.Store
		want  bool
	}{
		{"memory store", newMemory(t), false},
		{"wrapper hiding Go", newFaulty(t), true},
	} {
		logs := watermill.NewCaptureLogger()
		newInbox(t, inboxmw.Config{Store: tc.store, Logger: logs})
		if got := logged(logs, watermill.InfoLogLevel, msg); got != tc.want {
			t.Errorf("%s: logged %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A plain Store holds no lease, so none is lost: a handler that runs past
// Config.Lease is not canceled; and as it keeps no attempts, a permanent
// error is returned as it is, the key neither dead nor marked.
func TestInbox_plain_store_has_no_lease_to_lose_and_no_dead_key(t *testing.T) {
	t.Parallel()
	mem := newMemory(t)
	const lease = 150 * time.Millisecond
	ib := newInbox(t, inboxmw.Config{Store: plainStore{mem}, Alias: staticAlias(), Lease: lease})
	long := func(m *message.Message) ([]*message.Message, error) {
		select {
		case <-m.Context().Done():
			return nil, fmt.Errorf("handler canceled: %w", context.Cause(m.Context()))
		case <-time.After(4 * lease):
			return nil, nil
		}
	}
	m := msgFor("plain-long")
	if _, err := call(ib, long, m); err != nil {
		t.Fatalf("a handler running past the lease on a plain store: %v", err)
	}
	m.Ack()
	permanent := errors.New("bad order")
	_, err := call(ib, func(*message.Message) ([]*message.Message, error) { return nil, inbox.Permanent(permanent) }, msgFor("plain-perm"))
	if !errors.Is(err, permanent) || errors.Is(err, inbox.ErrDead) {
		t.Fatalf("a permanent error on a plain store: %v, want it as it is, not a dead key", err)
	}
	if ok, err := mem.IsProcessed(context.Background(), testKeyPrefix+"plain-perm"); ok || err != nil {
		t.Fatalf("key of a failed handler processed: %v, %v", ok, err)
	}
}

// slowBusy answers Busy late, as a loaded store does: the message waits on
// the busy key through those answers as much as through its pauses.
type slowBusy struct {
	inbox.LeaseStore
	late      time.Duration
	firstBusy atomic.Pointer[time.Time]
}

func (s *slowBusy) TryBegin(ctx context.Context, key string, o inbox.BeginOptions) (inbox.Claim, error) {
	c, err := s.LeaseStore.TryBegin(ctx, key, o)
	if err == nil && c.Status == inbox.Busy {
		if t := time.Now(); s.firstBusy.CompareAndSwap(nil, &t) {
			return c, nil // the first answer on time: the wait starts here
		}
		time.Sleep(s.late)
	}
	return c, err
}

// The busy wait reported is the time the message waited on the key, polls
// included, not only the pauses between them (which under load fell short
// of the wait, and under the InboxBusyWaits alert's threshold).
func TestInbox_busy_wait_reports_the_time_waited(t *testing.T) {
	t.Parallel()
	store := &slowBusy{LeaseStore: newMemory(t), late: 100 * time.Millisecond}
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: store, Metrics: rec, Alias: staticAlias(), MaxBusyWait: 600 * time.Millisecond})
	if _, err := store.LeaseStore.TryBegin(context.Background(), testKeyPrefix+"b-slow-polls", inbox.BeginOptions{Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	_, err := call(ib, func(m *message.Message) ([]*message.Message, error) { return nil, nil }, msgFor("b-slow-polls"))
	end := time.Now()
	if !errors.Is(err, inbox.ErrBusy) {
		t.Fatalf("error %v, want ErrBusy", err)
	}
	first := store.firstBusy.Load()
	if first == nil {
		t.Fatal("the store never answered Busy")
	}
	rec.mu.Lock()
	waited := rec.waited[inboxmw.WaitBusy]
	rec.mu.Unlock()
	// The polls took 100 ms each, the pauses 20 ms growing: counting the
	// pauses alone reports about half of the wait.
	if span := end.Sub(*first); waited < span*9/10 || waited > span {
		t.Fatalf("busy wait reported %s, want the %s from the first Busy answer to the end (at least 90 %%)", waited, span)
	}
}
