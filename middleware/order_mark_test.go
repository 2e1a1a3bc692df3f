package inboxmw_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// waitFor polls cond every 10 ms until it holds (true) or timeout passed.
func waitFor(timeout time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// orderedFaulty is a faultyStore over a memory store that keeps order.
type orderedFaulty struct {
	*faultyStore
	mem *memory.Store
}

func (o orderedFaulty) KeepsOrder() bool { return true }
func (o orderedFaulty) Order(ctx context.Context, orderKey string) (inbox.OrderGate, error) {
	return o.mem.Order(ctx, orderKey)
}
func (o orderedFaulty) ReleaseOrder(ctx context.Context, orderKey, head string) error {
	return o.mem.ReleaseOrder(ctx, orderKey, head)
}

// A store outage longer than the lease, while the mark of a message at the
// head of its order key is pending (the message failed once, its copy
// succeeded and was acked): the mark lands once the store is back, so the
// order key's later messages run. Given up at the lease's end, it would
// leave the key in progress at the head for good, the broker holding no
// copy of it, and every later message of the order key waiting behind it.
func TestOrderKey_mark_of_the_head_outlives_an_outage_longer_than_the_lease(t *testing.T) {
	t.Parallel()
	ps := newPubSub(t)
	mem := newMemory(t)
	store := orderedFaulty{&faultyStore{LeaseStore: mem}, mem}
	broker := &fakeBroker{pub: ps}
	const lease = 300 * time.Millisecond
	rec := newRecorder()
	ib := newInbox(t, inboxmw.Config{Store: store, Redelivery: broker, Backoff: fixedBackoff(100 * time.Millisecond),
		Lease: lease, StoreTimeout: 100 * time.Millisecond, OrderKey: byAccount, Metrics: rec})
	var fx effects
	var rs runs
	startRouter(t, ps, nil, "", ib, func(m *message.Message) ([]*message.Message, error) {
		id := m.Metadata.Get("IdempotencyKey")
		switch n := rs.add(id); {
		case id == "a1" && n == 1:
			return nil, errBoom
		case id == "a1":
			store.down.Store(true) // the outage starts as a1's copy succeeds: its mark fails
		}
		fx.apply(id)
		return nil, nil
	})

	publish(t, ps, ofAccount("a1", "A"))
	testenv.Eventually(t, 5*time.Second, "a1's failed attempt handed off", func() bool { return len(broker.handoffs()) == 1 })
	publish(t, ps, ofAccount("a2", "A"))
	testenv.Eventually(t, 5*time.Second, "a1's copy applied", func() bool { return slices.Contains(fx.get(), "a1") })
	testenv.Eventually(t, 5*time.Second, "a1's mark failing", func() bool { return rec.get(inboxmw.OutcomeCompleteRetry) >= 1 })
	time.Sleep(3 * lease) // the outage: three leases long
	store.down.Store(false)

	if !waitFor(10*time.Second, func() bool { return slices.Contains(fx.get(), "a2") }) {
		g, err := store.Order(t.Context(), "test:g:orders-handler:A")
		t.Fatalf("a2 not applied within 10 s after the outage: a1 is %+v; the order key's gate %+v (%v); %d hand-offs; %s",
			getRecord(t, store, "a1"), g, err, len(broker.handoffs()), rec)
	}
	if got, want := fx.get(), []string{"a1", "a2"}; !slices.Equal(got, want) {
		t.Fatalf("effects %v, want %v", got, want)
	}
	if r := getRecord(t, store, "a1"); r.State != inbox.StateProcessed {
		t.Fatalf("a1 is %v after the outage, want processed", r.State)
	}
}

// A message with an order key whose handler returned no messages is
// marked before the router acks it: a consumer killed between the ack and
// a later mark would leave it unmarked, with no copy left to mark it, and
// its order key's later messages behind it. Without an order key, the
// mark waits for the ack (the record is still in progress when the inbox
// returns).
func TestOrderKey_marked_before_the_ack(t *testing.T) {
	t.Parallel()
	for _, ordered := range []bool{true, false} {
		store := newMemory(t)
		cfg := inboxmw.Config{Store: store}
		want := inbox.StateInProgress
		if ordered {
			cfg.OrderKey, want = byAccount, inbox.StateProcessed
		}
		ib := newInbox(t, cfg)
		ps := newPubSub(t)
		seen := make(chan inbox.State, 1)
		startRouter(t, ps, nil, "", ib, func(*message.Message) ([]*message.Message, error) { return nil, nil },
			func(h message.HandlerFunc) message.HandlerFunc { // outside the inbox: runs before the router's ack
				return func(m *message.Message) ([]*message.Message, error) {
					out, err := h(m)
					seen <- getRecord(t, store, m.Metadata.Get("IdempotencyKey")).State
					return out, err
				}
			})
		publish(t, ps, ofAccount("a1", "A"))
		select {
		case got := <-seen:
			if got != want {
				t.Errorf("ordered %v: a1 is %v when the inbox returns, want %v", ordered, got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("ordered %v: a1 not handled within 10 s", ordered)
		}
	}
}
