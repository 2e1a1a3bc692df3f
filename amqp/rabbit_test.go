package inboxamqp_test

import (
	"context"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/amqp"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// rabbit is a raw AMQP channel for a test, with a queue of its own that is
// deleted when the test ends.
type rabbit struct {
	uri   string
	ch    *amqp091.Channel
	queue string
}

func newRabbit(t *testing.T) *rabbit {
	t.Helper()
	uri := testenv.RabbitMQ.URL(t)
	conn, err := amqp091.Dial(uri)
	if err != nil {
		t.Fatalf("dial RabbitMQ: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	r := &rabbit{uri: uri, ch: ch, queue: "inboxamqp-test-" + watermill.NewShortUUID()}
	// The parameters of watermill-amqp's NewNonDurableQueueConfig, so that its
	// own declaration of the queue agrees.
	if _, err := ch.QueueDeclare(r.queue, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := ch.QueueDelete(r.queue, false, false, false); err != nil {
			t.Errorf("delete queue %s: %v", r.queue, err)
		}
	})
	return r
}

func (r *rabbit) publish(t *testing.T, p amqp091.Publishing) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.ch.PublishWithContext(ctx, "", r.queue, false, false, p); err != nil {
		t.Fatal(err)
	}
}

// ready is the number of messages in the queue that no consumer holds.
func (r *rabbit) ready(t *testing.T) int {
	t.Helper()
	q, err := r.ch.QueueDeclarePassive(r.queue, false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// foreignPublishing is what a producer that is not Watermill sends: a
// message-id property and headers of many AMQP types, none a string.
func foreignPublishing(messageID string) amqp091.Publishing {
	return amqp091.Publishing{
		MessageId: messageID,
		Headers: amqp091.Table{
			"retries":   int32(3),
			"urgent":    true,
			"signature": []byte{0xde, 0xad},
			"trace":     amqp091.Table{"span": int64(7), "tags": []any{"a", int16(2)}},
		},
		Body: []byte(`{"order":"` + messageID + `"}`),
	}
}

// TestMarshaler_on_RabbitMQ_consumes_foreign_headers_once_keyed_by_message_id
// sends three deliveries with int, bool, byte-array and table headers, two of
// them with the same message-id, through a watermill-amqp router with the
// inbox middleware keyed by the message-id only. Every delivery reaches the
// router exactly once (none is requeued), the handler runs once per
// message-id, and the queue ends empty.
func TestMarshaler_on_RabbitMQ_consumes_foreign_headers_once_keyed_by_message_id(t *testing.T) {
	t.Parallel()
	r := newRabbit(t)
	for _, id := range []string{"order-42", "order-42", "order-43"} {
		r.publish(t, foreignPublishing(id))
	}

	store, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	counts := &counts{}
	ib, err := inboxmw.New(inboxmw.Config{
		Store:     store,
		Bus:       "rabbit",
		Group:     r.queue,
		IDSources: []keying.IDSource{inboxamqp.FromMessageID()},
		Metrics:   counts,
	})
	if err != nil {
		t.Fatal(err)
	}

	cfg := amqp.NewNonDurableQueueConfig(r.uri)
	cfg.Marshaler = inboxamqp.Marshaler{}
	sub, err := amqp.NewSubscriber(cfg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		received []string // message-id of every delivery the router got
		handled  []message.Metadata
	)
	receivedMW := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			mu.Lock()
			received = append(received, msg.Metadata.Get(inboxamqp.DefaultMessageIDKey))
			mu.Unlock()
			return h(msg)
		}
	}
	router.AddMiddleware(receivedMW, ib.Middleware)
	router.AddConsumerHandler("charge", r.queue, sub, func(msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, maps.Clone(msg.Metadata))
		return nil
	})
	done := make(chan error, 1)
	go func() { done <- router.Run(context.Background()) }()
	t.Cleanup(func() { _ = router.Close() })

	testenv.Eventually(t, 60*time.Second, "2 processed and 1 duplicate", func() bool {
		return counts.get(inboxmw.OutcomeProcessed) == 2 && counts.get(inboxmw.OutcomeDuplicate) == 1
	})
	if err := router.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ib.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// The subscriber is closed: anything unacked is back in the queue.
	if n := r.ready(t); n != 0 {
		t.Errorf("%d messages left in the queue, want 0: a delivery was not acked", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(received, ","); got != "order-42,order-42,order-43" {
		t.Errorf("router received %s, want each delivery once: order-42,order-42,order-43", got)
	}
	if len(handled) != 2 {
		t.Fatalf("handler ran %d times, want 2", len(handled))
	}
	for k, want := range map[string]string{"retries": "3", "urgent": "true", "signature": "3q0=", "trace": `{"span":7,"tags":["a",2]}`} {
		if got := handled[0][k]; got != want {
			t.Errorf("handler saw %s=%q, want %q", k, got, want)
		}
	}
	for _, id := range []string{"order-42", "order-43"} {
		key := "rabbit:" + r.queue + ":charge:" + id
		rec, err := store.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != inbox.StateProcessed || rec.Attempts != 1 {
			t.Errorf("Get(%s) = %v after %d attempts, want processed after 1", key, rec.State, rec.Attempts)
		}
	}
}

// TestDefaultMarshaler_requeues_non_string_headers_in_a_loop documents why
// package inboxamqp exists: with watermill-amqp's DefaultMarshaler, one
// delivery with an int header is nacked with requeue by the subscriber
// itself, again and again, and never reaches a handler. The test watches the
// subscriber fail on it five times, then stops it.
func TestDefaultMarshaler_requeues_non_string_headers_in_a_loop(t *testing.T) {
	t.Parallel()
	r := newRabbit(t)
	r.publish(t, amqp091.Publishing{MessageId: "order-1", Headers: amqp091.Table{"retries": int32(3)}, Body: []byte("x")})

	const loops = 5
	logger := &nackCounter{}
	sub, err := amqp.NewSubscriber(amqp.NewNonDurableQueueConfig(r.uri), logger)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := sub.Subscribe(ctx, r.queue)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.After(60 * time.Second)
	for logger.count() < loops {
		select {
		case msg := <-msgs:
			t.Fatalf("the delivery reached the consumer (metadata %v): DefaultMarshaler accepts non-string headers now", msg.Metadata)
		case <-deadline:
			t.Fatalf("saw %d failed unmarshals in 60 s, want %d", logger.count(), loops)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := logger.firstErr(); !strings.Contains(err, "metadata retries is not a string") {
		t.Errorf("subscriber failed with %q, want the not-a-string error", err)
	}
	// Still there, after at least five deliveries: it is never consumed. (The
	// subscriber is closed; RabbitMQ puts the unacked delivery back.)
	testenv.Eventually(t, 60*time.Second, "the looping message back in the queue", func() bool { return r.ready(t) == 1 })
	t.Logf("the subscriber nacked and RabbitMQ redelivered the message %d times before the test stopped it", logger.count())
}

// nackCounter is a watermill.LoggerAdapter that counts the subscriber's
// "Processing message failed, sending nack" errors.
type nackCounter struct {
	watermill.NopLogger
	mu    sync.Mutex
	n     int
	first string
}

func (l *nackCounter) Error(msg string, err error, _ watermill.LogFields) {
	if msg != "Processing message failed, sending nack" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == 0 && err != nil {
		l.first = err.Error()
	}
	l.n++
}

func (l *nackCounter) With(watermill.LogFields) watermill.LoggerAdapter { return l }

func (l *nackCounter) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

func (l *nackCounter) firstErr() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.first
}

// counts is a inboxmw.Metrics that counts outcomes.
type counts struct {
	mu sync.Mutex
	n  map[inboxmw.Outcome]int
}

func (c *counts) Outcome(_ string, o inboxmw.Outcome) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[inboxmw.Outcome]int{}
	}
	c.n[o]++
}

func (c *counts) StoreCall(string, time.Duration, error) {}

func (c *counts) Waited(string, string, time.Duration) {}

func (c *counts) get(o inboxmw.Outcome) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[o]
}
