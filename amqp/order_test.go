package inboxamqp_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-inbox/inbox/amqp"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// On a single active consumer queue, RabbitMQ delivers to one consumer at
// a time, in order: with an order key, the events of one account are
// applied in their publish order while failed ones wait in the delay
// queues, with two consumers on the queue.
func TestOrderKey_single_active_consumer_queue_keeps_each_accounts_order(t *testing.T) {
	t.Parallel()
	r := newRabbit(t)
	queue := r.queue + "-sac"
	sac := amqp091.Table{"x-single-active-consumer": true}
	if _, err := r.ch.QueueDeclare(queue, false, false, false, false, sac); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = r.ch.QueueDelete(queue, false, false, false) })
	d := newDelaysOf(t, r, queue, 250*time.Millisecond, time.Second)
	store, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "rabbit", Group: queue, Redelivery: d,
		Backoff:  func(int) time.Duration { return 300 * time.Millisecond },
		OrderKey: func(m *message.Message) (string, error) { return m.Metadata.Get("account"), nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = ib.Close(ctx)
	})
	cfg := amqp.NewNonDurableQueueConfig(r.uri)
	cfg.Marshaler = inboxamqp.Marshaler{}
	cfg.Queue.Arguments = sac

	const accounts, events = 20, 5
	var mu sync.Mutex
	applied := map[string][]int{}
	ran := map[string]int{}
	handler := func(m *message.Message) error {
		id, acct := m.Metadata.Get("IdempotencyKey"), m.Metadata.Get("account")
		var n int
		if _, err := fmt.Sscanf(m.Metadata.Get("seq"), "%d", &n); err != nil {
			return fmt.Errorf("event %s without seq: %w", id, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if ran[id]++; ran[id] == 1 && failsFirst(id) {
			return errors.New("ledger busy")
		}
		applied[acct] = append(applied[acct], n)
		return nil
	}
	for range 2 { // two consumers; the queue delivers to one at a time
		sub, err := amqp.NewSubscriber(cfg, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		router.AddMiddleware(ib.Middleware)
		router.AddConsumerHandler("ledger", queue, sub, handler)
		go func() { _ = router.Run(context.Background()) }()
		<-router.Running()
		t.Cleanup(func() { _ = router.Close() })
	}

	pub, err := amqp.NewPublisher(cfg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	for e := range events {
		for a := range accounts {
			m := message.NewMessage(watermill.NewUUID(), nil)
			m.Metadata.Set("IdempotencyKey", fmt.Sprintf("acct%d-ev%d", a, e))
			m.Metadata.Set("account", fmt.Sprintf("acct%d", a))
			m.Metadata.Set("seq", fmt.Sprint(e))
			if err := pub.Publish(queue, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	testenv.Eventually(t, 60*time.Second, "every event applied", func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, seqs := range applied {
			n += len(seqs)
		}
		return n >= accounts*events
	})
	mu.Lock()
	defer mu.Unlock()
	failed := 0
	for id := range ran {
		if failsFirst(id) {
			failed++
		}
	}
	if failed == 0 {
		t.Fatal("no first attempt failed: the test checks nothing")
	}
	want := []int{0, 1, 2, 3, 4}
	for a := range accounts {
		acct := fmt.Sprintf("acct%d", a)
		if got := applied[acct]; !slices.Equal(got, want) {
			t.Errorf("%s's events applied in the order %v, want %v", acct, got, want)
		}
	}
	t.Logf("%d of %d events failed their first attempt", failed, accounts*events)
}

// failsFirst picks the events whose first attempt fails: about one in
// five, the same on every run.
func failsFirst(id string) bool {
	h := fnv.New32a()
	h.Write([]byte(id))
	return h.Sum32()%5 == 0
}
