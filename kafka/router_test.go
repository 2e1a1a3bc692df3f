package inboxkafka_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/middleware"
)

// The whole path on Kafka: one partition, a handler whose first attempt at
// one message fails. The partition moves on with the next messages while
// the failed one waits in a retry topic, which delivers it once its backoff
// is over; it is handled once, with the store counting both attempts. With
// a handler whose error is permanent, the key is dead after one attempt and
// goes to the poison queue.
func TestRetry_router_partition_moves_on_while_the_failed_message_waits(t *testing.T) {
	t.Parallel()
	eachBroker(t, func(t *testing.T, env kafkaEnv) {
		topic, group := names(t)
		env.createTopic(t, topic, 1)
		retry := newRetry(t, env, topic, group, []time.Duration{500 * time.Millisecond, time.Second}, nil)
		store := newMemoryStore(t)
		const backoff = 800 * time.Millisecond
		ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "kafka", Group: group, Redelivery: retry, MaxAttempts: 3,
			Backoff: func(int) time.Duration { return backoff }})
		if err != nil {
			t.Fatal(err)
		}
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var order []string
		var errs []error
		ran := map[string][]time.Time{}
		router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
			return func(m *message.Message) ([]*message.Message, error) {
				// A poison queue filtered with IsTransient: what is not
				// transient leaves the partition (here: it is recorded).
				out, err := h(m)
				if err != nil && !inboxmw.IsTransient(err) {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return nil, nil
				}
				return out, err
			}
		}, ib.Middleware)
		router.AddConsumerHandler("charge", topic, retry.Subscriber(mainSubscriber(t, env, group)), func(m *message.Message) error {
			id := m.Metadata.Get("IdempotencyKey")
			mu.Lock()
			defer mu.Unlock()
			ran[id] = append(ran[id], time.Now())
			switch {
			case id == "flaky" && len(ran[id]) == 1:
				return errors.New("payment gateway timeout")
			case id == "bad":
				return inbox.Permanent(errors.New("order has no customer"))
			}
			order = append(order, id)
			return nil
		})
		runUntilCleanup(t, router, ib)
		var msgs []*message.Message
		for _, id := range []string{"flaky", "bad", "a", "b", "c"} {
			m := message.NewMessage(watermill.NewUUID(), []byte(id))
			m.Metadata.Set("IdempotencyKey", id)
			msgs = append(msgs, m)
		}
		publish(t, env, topic, msgs...)
		testenv.Eventually(t, 30*time.Second, "every message but the poison one processed", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(order) == 4
		})
		mu.Lock()
		defer mu.Unlock()
		if order[3] != "flaky" || len(ran["flaky"]) != 2 {
			t.Fatalf("processed in order %v, flaky ran %d times: want flaky last, after one failure", order, len(ran["flaky"]))
		}
		if gap := ran["flaky"][1].Sub(ran["flaky"][0]); gap < backoff {
			t.Fatalf("the copy ran %s after the failure, before the backoff of %s", gap, backoff)
		}
		if len(ran["bad"]) != 1 || len(errs) != 1 || !errors.Is(errs[0], inbox.ErrDead) {
			t.Fatalf("the permanent failure ran %d times and returned %v; want once, an inbox.DeadError", len(ran["bad"]), errs)
		}
		// The handler has returned, but the middleware marks the key after
		// that: wait for the mark rather than read the store at once.
		for id, want := range map[string]inbox.State{"flaky": inbox.StateProcessed, "bad": inbox.StateDead} {
			testenv.Eventually(t, 10*time.Second, id+" "+want.String(), func() bool {
				r, err := store.Get(context.Background(), "kafka:"+group+":charge:"+id)
				return err == nil && r.State == want
			})
		}
	})
}
