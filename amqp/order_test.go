package inboxamqp_test

import (
	"context"
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

	ledger := &testenv.Ledger{Accounts: 20, Events: 5, FailOneIn: 5}
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
		router.AddConsumerHandler("ledger", queue, sub, ledger.Handle)
		go func() { _ = router.Run(context.Background()) }()
		<-router.Running()
		t.Cleanup(func() { _ = router.Close() })
	}

	pub, err := amqp.NewPublisher(cfg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	for _, m := range ledger.Messages() {
		if err := pub.Publish(queue, m); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 60*time.Second, "every event applied", ledger.Done)
	ledger.Check(t)
}
