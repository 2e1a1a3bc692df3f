package inboxmw_test

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/middleware"
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
	ib := newInbox(t, inboxmw.Config{Store: store, Redelivery: broker, Backoff: fixedBackoff(time.Millisecond), OrderKey: byAccount})
	var fx effects
	startRouter(t, ps, nil, "", ib, func(m *message.Message) ([]*message.Message, error) {
		id := m.Metadata.Get("IdempotencyKey")
		if id == "a1" {
			return nil, inbox.Permanent(errBoom)
		}
		fx.apply(id)
		return nil, nil
	})

	publish(t, ps, ofAccount("a1", "A"))
	testenv.Eventually(t, 5*time.Second, "a1 dead", func() bool { return getRecord(t, store, "a1").State == inbox.StateDead })
	publish(t, ps, ofAccount("a2", "A"))
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
	if err := store.ReleaseOrder(t.Context(), "test:g:orders-handler:A", "test:g:orders-handler:a1"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "a2 processed once a1 was let go", func() bool { return slices.Contains(fx.get(), "a2") })
}
