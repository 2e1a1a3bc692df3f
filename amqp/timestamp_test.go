package inboxamqp_test

import (
	"context"
	"errors"
	"sync/atomic"
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

func TestMarshaler_timestamp_property_round_trips_through_the_metadata(t *testing.T) {
	t.Parallel()
	var m inboxamqp.Marshaler
	sent := time.Date(2024, 5, 1, 12, 0, 0, 0, time.FixedZone("CEST", 2*3600))

	// Unmarshal copies the property; a header of the field's name is not
	// taken for it.
	msg, err := m.Unmarshal(amqp091.Delivery{Timestamp: sent, Body: []byte("x"), Headers: amqp091.Table{inboxamqp.TimestampKey: "2000-01-01T00:00:00Z"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := msg.Metadata.Get(inboxamqp.TimestampKey); got != "2024-05-01T10:00:00Z" {
		t.Fatalf("metadata %s = %q, want 2024-05-01T10:00:00Z", inboxamqp.TimestampKey, got)
	}
	if ts, ok := inboxamqp.Timestamp(msg); !ok || !ts.Equal(sent) {
		t.Fatalf("Timestamp = %s, %v; want %s", ts, ok, sent)
	}

	// Marshal sets it back (a republished copy keeps it), without a header.
	p, err := m.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Timestamp.Equal(sent) {
		t.Fatalf("republished timestamp %s, want %s", p.Timestamp, sent)
	}
	if _, ok := p.Headers[inboxamqp.TimestampKey]; ok {
		t.Fatalf("the field went out as a header: %v", p.Headers)
	}

	// A delivery without the property has no field, whatever its headers.
	bare, err := m.Unmarshal(amqp091.Delivery{Body: []byte("x"), Headers: amqp091.Table{inboxamqp.TimestampKey: "2000-01-01T00:00:00Z"}})
	if err != nil {
		t.Fatal(err)
	}
	if ts, ok := inboxamqp.Timestamp(bare); ok {
		t.Fatalf("Timestamp of a delivery without the property = %s, true", ts)
	}

	// A new message is stamped with the time of publishing.
	before := time.Now().Truncate(time.Second)
	p, err = m.Marshal(message.NewMessage(watermill.NewUUID(), []byte("new")))
	if err != nil {
		t.Fatal(err)
	}
	if p.Timestamp.Before(before) || p.Timestamp.After(time.Now()) {
		t.Fatalf("a new message's timestamp %s, want the time of publishing (after %s)", p.Timestamp, before)
	}

	// A timestamp PostprocessPublishing set is kept.
	pp := inboxamqp.Marshaler{DefaultMarshaler: amqp.DefaultMarshaler{PostprocessPublishing: func(p amqp091.Publishing) amqp091.Publishing {
		p.Timestamp = time.Unix(1e9, 0)
		return p
	}}}
	if p, err = pp.Marshal(msg); err != nil || !p.Timestamp.Equal(time.Unix(1e9, 0)) {
		t.Fatalf("PostprocessPublishing's timestamp replaced by %s (%v)", p.Timestamp, err)
	}
}

// A RabbitMQ delivery whose timestamp property is older than the store's
// retention (1 h here) is stale: refused under StaleReject without running
// the handler; a delivery of now is handled.
func TestTimestamp_old_delivery_on_RabbitMQ_is_stale(t *testing.T) {
	t.Parallel()
	r := newRabbit(t)
	r.publish(t, amqp091.Publishing{MessageId: "old", Timestamp: time.Now().Add(-2 * time.Hour), Body: []byte("old")})
	r.publish(t, amqp091.Publishing{MessageId: "fresh", Timestamp: time.Now(), Body: []byte("fresh")})

	store, err := memory.New(memory.Options{Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	c := &counts{}
	ib, err := inboxmw.New(inboxmw.Config{
		Store: store, Bus: "rabbit", Group: r.queue, Metrics: c,
		IDSources: []keying.IDSource{inboxamqp.FromMessageID()},
		Timestamp: inboxamqp.Timestamp, Stale: inboxmw.StaleReject,
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
	var refused atomic.Int32
	// Acks what the inbox refused as stale, as a poison queue would.
	ackStale := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if errors.Is(err, inbox.ErrStale) && !inboxmw.IsTransient(err) {
				refused.Add(1)
				return nil, nil
			}
			return out, err
		}
	}
	var ran []string
	router.AddMiddleware(ackStale, ib.Middleware)
	router.AddConsumerHandler("charge", r.queue, sub, func(msg *message.Message) error {
		ran = append(ran, string(msg.Payload)) // one consumer, one message at a time
		return nil
	})
	done := make(chan error, 1)
	go func() { done <- router.Run(context.Background()) }()
	t.Cleanup(func() { _ = router.Close() })
	testenv.Eventually(t, 60*time.Second, "the fresh delivery processed, the old one refused", func() bool {
		return c.get(inboxmw.OutcomeProcessed) == 1 && refused.Load() == 1
	})
	if err := router.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if c.get(inboxmw.OutcomeStale) != 1 || len(ran) != 1 || ran[0] != "fresh" {
		t.Fatalf("stale counted %d, handler ran for %q; want 1 and the fresh delivery only", c.get(inboxmw.OutcomeStale), ran)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ib.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
