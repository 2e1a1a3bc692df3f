package inboxmw_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// byAccount is a Config.OrderKey: the message's "account" metadata.
func byAccount(m *message.Message) (string, error) { return m.Metadata.Get("account"), nil }

// ofAccount returns order id of account acct.
func ofAccount(id, acct string) *message.Message {
	m := order(id)
	m.Metadata.Set("account", acct)
	return m
}

// effects records the order in which the handler's effects were applied.
type effects struct {
	mu  sync.Mutex
	ids []string
}

func (e *effects) apply(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ids = append(e.ids, id)
}

func (e *effects) get() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.ids)
}

// only keeps the ids of ids that are in keep, in their order.
func only(ids []string, keep ...string) []string {
	return slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return !slices.Contains(keep, id) })
}

// A store that does not keep order, and the transactional mode, are
// refused at New when Config.OrderKey is set.
func TestNew_order_key_needs_a_store_that_keeps_order(t *testing.T) {
	t.Parallel()
	_, err := inboxmw.New(inboxmw.Config{Store: plainStore{newMemory(t)}, Bus: "test", Group: "g", OrderKey: byAccount})
	if !errors.Is(err, inbox.ErrNotSupported) {
		t.Fatalf("New with OrderKey over a plain store: %v, want ErrNotSupported", err)
	}
	if _, err := inboxmw.New(inboxmw.Config{Store: newMemory(t), Bus: "test", Group: "g", OrderKey: byAccount}); err != nil {
		t.Fatalf("New with OrderKey over the memory store: %v", err)
	}
}

// With an order key, the messages of one account that arrive after a
// failed one wait behind it in the broker, and run after it in their
// order; another account's messages run at once.
func TestOrderKey_later_messages_wait_behind_a_failed_one(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	store := newMemory(t)
	broker := &fakeBroker{pub: ps}
	const backoff = 300 * time.Millisecond
	ib := newInbox(t, inboxmw.Config{Store: store, Redelivery: broker, Backoff: fixedBackoff(backoff), OrderKey: byAccount})
	var fx effects
	var rs runs
	var errs atomic.Int32
	startRouter(t, ps, nil, "", ib, func(m *message.Message) ([]*message.Message, error) {
		id := m.Metadata.Get("IdempotencyKey")
		if rs.add(id) == 1 && id == "a1" {
			return nil, errBoom
		}
		fx.apply(id)
		return nil, nil
	}, countingErrors(&errs))

	publish(t, ps, ofAccount("a1", "A"))
	testenv.Eventually(t, 5*time.Second, "a1's failed attempt handed off", func() bool { return len(broker.handoffs()) == 1 })
	// GoChannel delivers concurrent publishes in any order: each message
	// of A is published once the one before it was handed off, so that
	// they arrive a2 then a3.
	publish(t, ps, ofAccount("a2", "A"))
	testenv.Eventually(t, 5*time.Second, "a2 handed off", func() bool { return len(broker.handoffs()) == 2 })
	publish(t, ps, ofAccount("a3", "A"), ofAccount("b1", "B"))
	testenv.Eventually(t, 5*time.Second, "b1 processed", func() bool { return slices.Contains(fx.get(), "b1") })
	if got := only(fx.get(), "a1", "a2", "a3"); len(got) != 0 && time.Since(rs.get("a1")[0]) < backoff {
		t.Fatalf("account A's messages %v ran while a1 waited out its backoff", got)
	}
	testenv.Eventually(t, 10*time.Second, "account A's messages processed", func() bool { return len(only(fx.get(), "a1", "a2", "a3")) == 3 })

	if got, want := only(fx.get(), "a1", "a2", "a3"), []string{"a1", "a2", "a3"}; !slices.Equal(got, want) {
		t.Fatalf("account A's effects in the order %v, want %v", got, want)
	}
	for _, id := range []string{"a2", "a3"} {
		if n := len(rs.get(id)); n != 1 {
			t.Errorf("%s's handler ran %d times, want once: a message waiting its turn does not run", id, n)
		}
	}
	// The copies carry the order key as the store has it.
	for _, h := range broker.handoffs() {
		if got, want := h.meta.Get(inboxmw.MetadataOrderKey), "test:g:orders-handler:A"; got != want {
			t.Fatalf("a copy of %s carries the order key %q, want %q", h.meta.Get("IdempotencyKey"), got, want)
		}
	}
	if n := errs.Load(); n != 0 {
		t.Fatalf("the middleware returned %d errors; a message handed off is acked", n)
	}
	testenv.Eventually(t, 5*time.Second, "the order key released", func() bool {
		g, err := store.Order(t.Context(), "test:g:orders-handler:A")
		return err == nil && g.Head == "" && len(g.Waiting) == 0
	})
}

// A dead message keeps its order key's later messages waiting: each comes
// back at the broker's shortest delay at first, then less and less often
// (a quarter of the time it has waited), not in a hot loop; once an
// operator lets the dead one go (ReleaseOrder), they run.
func TestOrderKey_behind_a_dead_message_backs_off_until_released(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	store := newMemory(t)
	broker := &fakeBroker{pub: ps}
	rec := newRecorder()
	logs := watermill.NewCaptureLogger()
	ib := newInbox(t, inboxmw.Config{Store: store, Redelivery: broker, Backoff: fixedBackoff(time.Millisecond), OrderKey: byAccount,
		Metrics: rec, Logger: logs})
	fx := behindDeadA1(t, ps, store, ib)
	a2 := func() (hs []handoff) {
		for _, h := range broker.handoffs() {
			if h.meta.Get("IdempotencyKey") == "a2" {
				hs = append(hs, h)
			}
		}
		return hs
	}
	// Waiting 1 s takes about 30 hand-offs at a quarter of the time
	// waited from 1 ms; at 1 ms each it would take hundreds.
	const waited = time.Second
	testenv.Eventually(t, 10*time.Second, "a2 waiting 1s", func() bool {
		hs := a2()
		return len(hs) > 0 && time.Since(hs[0].at) >= waited
	})
	hs := a2()
	for i, h := range hs[1:] {
		if want := h.at.Sub(hs[0].at) / 4; h.delay < want-10*time.Millisecond {
			t.Fatalf("a2's hand-off %d, %v after its first, waited %v: want at least a quarter of that", i+1, h.at.Sub(hs[0].at), h.delay)
		}
	}
	if len(hs) > 60 {
		t.Fatalf("a2 was handed off %d times in %v: a hot loop", len(hs), time.Since(hs[0].at))
	}
	if got := fx.get(); len(got) != 0 {
		t.Fatalf("%v ran behind the dead a1", got)
	}
	// Counted: the order key blocked once, each hand-off of a2 as behind
	// (not as a failed attempt's redelivery); logged with the order key
	// and the command that releases it.
	if n := rec.get(inboxmw.OutcomeOrderBlocked); n != 1 {
		t.Errorf("order_blocked counted %d, want 1 (%v)", n, rec)
	}
	if n, h := rec.get(inboxmw.OutcomeBehind), len(a2()); n < 5 || n > h {
		t.Errorf("behind counted %d for %d hand-offs of a2, want one per hand-off (%v)", n, h, rec)
	}
	if n := rec.get(inboxmw.OutcomeRedelivered); n != 0 {
		t.Errorf("redelivered counted %d; a2's hand-offs are behind, and no attempt failed but a1's, which died (%v)", n, rec)
	}
	if n := rec.get(inboxmw.OutcomeOrderSkipped); n != 0 {
		t.Errorf("order_skipped counted %d under the default OrderOnDeadBlock", n)
	}
	if !loggedOrderKey(logs, watermill.ErrorLogLevel, "test:g:orders-handler:A", "inboxctl order-release") {
		t.Errorf("no error log names the blocked order key and inboxctl order-release; got %+v", logs.Captured()[watermill.ErrorLogLevel])
	}
	if err := store.ReleaseOrder(t.Context(), "test:g:orders-handler:A", "test:g:orders-handler:a1"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "a2 processed once a1 was let go", func() bool { return slices.Contains(fx.get(), "a2") })
}

// behindDeadA1 starts a router through ib whose handler fails a1 for good
// (inbox.Permanent) and applies the others, publishes a1 (account A) and,
// once a1 is dead, a2 of the same account.
func behindDeadA1(t *testing.T, ps *gochannel.GoChannel, store *memory.Store, ib *inboxmw.Inbox) *effects {
	t.Helper()
	var fx effects
	startRouter(t, ps, nil, "", ib, func(m *message.Message) ([]*message.Message, error) {
		id := m.Metadata.Get("IdempotencyKey")
		if id == "a1" {
			return nil, inbox.Permanent(errBoom)
		}
		fx.apply(id)
		return nil, nil
	}, poisoned())
	publish(t, ps, ofAccount("a1", "A"))
	testenv.Eventually(t, 5*time.Second, "a1 dead", func() bool { return getRecord(t, store, "a1").State == inbox.StateDead })
	publish(t, ps, ofAccount("a2", "A"))
	return &fx
}

// poisoned is a middleware, outside the inbox's, that acks a message whose
// key is dead, as a poison queue does, so that GoChannel does not deliver
// it again in a loop.
func poisoned() message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			out, err := h(m)
			if errors.Is(err, inbox.ErrDead) {
				return nil, nil
			}
			return out, err
		}
	}
}

// loggedOrderKey reports whether logs captured a line at level whose field
// inbox_order_key is orderKey and whose message says say.
func loggedOrderKey(logs *watermill.CaptureLoggerAdapter, level watermill.LogLevel, orderKey, say string) bool {
	for _, l := range logs.Captured()[level] {
		if l.Fields["inbox_order_key"] == orderKey && strings.Contains(l.Msg, say) {
			return true
		}
	}
	return false
}

// With OrderOnDeadSkip, a message that goes dead (a permanent error, or
// its last attempt allowed) lets its order key go on: the later messages
// run without an operator, in their order, and the skip is counted and
// logged.
func TestOrderOnDeadSkip_later_messages_run_past_a_dead_one(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	store := newMemory(t)
	broker := &fakeBroker{pub: ps}
	rec := newRecorder()
	logs := watermill.NewCaptureLogger()
	ib := newInbox(t, inboxmw.Config{Store: store, Redelivery: broker, Backoff: fixedBackoff(200 * time.Millisecond), OrderKey: byAccount,
		OrderOnDead: inboxmw.OrderOnDeadSkip, MaxAttempts: 2, Metrics: rec, Logger: logs})
	var fx effects
	var rs runs
	startRouter(t, ps, nil, "", ib, func(m *message.Message) ([]*message.Message, error) {
		switch id := m.Metadata.Get("IdempotencyKey"); id {
		case "a1":
			return nil, inbox.Permanent(errBoom) // dead at once
		case "b1":
			rs.add(id)
			return nil, errBoom // dead on its second attempt (MaxAttempts)
		default:
			fx.apply(id)
			return nil, nil
		}
	}, poisoned())

	publish(t, ps, ofAccount("a1", "A"), ofAccount("b1", "B"))
	// b2 arrives while b1 waits out its backoff: it waits behind b1, then
	// runs once b1 is dead.
	testenv.Eventually(t, 5*time.Second, "b1's first attempt failed", func() bool { return len(rs.get("b1")) == 1 })
	publish(t, ps, ofAccount("b2", "B"))
	testenv.Eventually(t, 5*time.Second, "a1 and b1 dead", func() bool {
		return getRecord(t, store, "a1").State == inbox.StateDead && getRecord(t, store, "b1").State == inbox.StateDead
	})
	publish(t, ps, ofAccount("a2", "A"), ofAccount("b3", "B"))
	testenv.Eventually(t, 10*time.Second, "a2, b2 and b3 processed past the dead a1 and b1", func() bool {
		return len(only(fx.get(), "a2", "b2", "b3")) == 3
	})
	if got := only(fx.get(), "b2", "b3"); !slices.Equal(got, []string{"b2", "b3"}) {
		t.Errorf("account B's effects in the order %v, want [b2 b3]", got)
	}
	for _, acct := range []string{"A", "B"} {
		if g, err := store.Order(t.Context(), "test:g:orders-handler:"+acct); err != nil || g.Head != "" && g.Head != "test:g:orders-handler:b3" {
			t.Errorf("order key %s after its dead message: %+v, %v; want no gate held by it", acct, g, err)
		}
	}
	if n := rec.get(inboxmw.OutcomeOrderSkipped); n != 2 {
		t.Errorf("order_skipped counted %d, want 2 (a1 and b1) (%v)", n, rec)
	}
	if n := rec.get(inboxmw.OutcomeOrderBlocked); n != 0 {
		t.Errorf("order_blocked counted %d under OrderOnDeadSkip (%v)", n, rec)
	}
	if !loggedOrderKey(logs, watermill.InfoLogLevel, "test:g:orders-handler:A", "OrderOnDeadSkip") {
		t.Errorf("no info log names the order key that went on; got %+v", logs.Captured()[watermill.InfoLogLevel])
	}
}

// A dead key found at claim time (a copy of the dead message delivered
// again) that still heads its order key's gate, because the consumer that
// killed it stopped before it let the order key go, or did so under
// OrderOnDeadBlock: under OrderOnDeadSkip, the claim lets the order key go
// on.
func TestOrderOnDeadSkip_a_dead_key_claimed_again_lets_its_order_key_go_on(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	store := newMemory(t)
	ctx := t.Context()
	const ok, a1, a2 = "test:g:orders-handler:A", "test:g:orders-handler:a1", "test:g:orders-handler:a2"
	c, err := store.TryBegin(ctx, a1, inbox.BeginOptions{OrderKey: ok})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin(a1) = %+v, %v", c, err)
	}
	if err := store.Fail(ctx, a1, c.LeaseID, inbox.FailOptions{Dead: true, OrderKey: ok, Reason: "boom"}); err != nil {
		t.Fatal(err)
	}
	if c, err := store.TryBegin(ctx, a2, inbox.BeginOptions{OrderKey: ok}); err != nil || c.Status != inbox.Behind {
		t.Fatalf("TryBegin(a2) = %+v, %v; want Behind", c, err)
	}
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: store, OrderKey: byAccount, OrderOnDead: inboxmw.OrderOnDeadSkip, Metrics: rec})
	var fx effects
	startRouter(t, ps, nil, "", ib, func(m *message.Message) ([]*message.Message, error) {
		fx.apply(m.Metadata.Get("IdempotencyKey"))
		return nil, nil
	}, poisoned())

	publish(t, ps, ofAccount("a1", "A"))
	testenv.Eventually(t, 5*time.Second, "the order key goes on past the dead a1", func() bool {
		g, err := store.Order(ctx, ok)
		return err == nil && g.Head == a2
	})
	publish(t, ps, ofAccount("a2", "A"))
	testenv.Eventually(t, 5*time.Second, "a2 processed", func() bool { return slices.Contains(fx.get(), "a2") })
	if got := fx.get(); !slices.Equal(got, []string{"a2"}) {
		t.Errorf("effects %v, want [a2]: the dead a1 does not run", got)
	}
	if n := rec.get(inboxmw.OutcomeOrderSkipped); n != 1 {
		t.Errorf("order_skipped counted %d, want 1 (%v)", n, rec)
	}
	if n := rec.get(inboxmw.OutcomeDead); n != 1 {
		t.Errorf("dead counted %d, want 1 (%v)", n, rec)
	}
}

// OrderOnDead takes its two values, and skip only with an OrderKey.
func TestConfig_OrderOnDead_is_validated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  inboxmw.Config
		want string
	}{
		{"unknown policy", inboxmw.Config{OrderKey: byAccount, OrderOnDead: 7}, "OrderOnDead 7 is not an OrderOnDeadPolicy"},
		{"skip without OrderKey", inboxmw.Config{OrderOnDead: inboxmw.OrderOnDeadSkip}, "OrderOnDead is OrderOnDeadSkip, and OrderKey is not set"},
	} {
		tc.cfg.Store, tc.cfg.Bus, tc.cfg.Group = newMemory(t), "test", "g"
		_, err := inboxmw.New(tc.cfg)
		if !errors.Is(err, inboxmw.ErrInvalidConfig) || !strings.Contains(fmt.Sprint(err), tc.want) {
			t.Errorf("%s: New = %v, want ErrInvalidConfig saying %q", tc.name, err, tc.want)
		}
	}
	for _, p := range []inboxmw.OrderOnDeadPolicy{inboxmw.OrderOnDeadBlock, inboxmw.OrderOnDeadSkip} {
		if _, err := inboxmw.New(inboxmw.Config{Store: newMemory(t), Bus: "test", Group: "g", OrderKey: byAccount, OrderOnDead: p}); err != nil {
			t.Errorf("New with OrderOnDead %v: %v", p, err)
		}
	}
}

// Without Redelivery, a message behind a dead one waits in-process, then
// is nacked: counted as behind, not as busy (no other consumer holds its
// key).
func TestOrderKey_waiting_in_process_behind_a_dead_message_counts_behind(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	store := newMemory(t)
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: store, OrderKey: byAccount, MaxBusyWait: 100 * time.Millisecond, Metrics: rec})
	fx := behindDeadA1(t, ps, store, ib)
	testenv.Eventually(t, 5*time.Second, "a2 nacked behind a1", func() bool { return rec.get(inboxmw.OutcomeBehind) >= 2 })
	if n := rec.get(inboxmw.OutcomeBusy); n != 0 {
		t.Errorf("busy counted %d: a2 waits behind a1, no lease holds it (%v)", n, rec)
	}
	if got := fx.get(); len(got) != 0 {
		t.Errorf("%v ran behind the dead a1", got)
	}
}
