package inboxamqp_test

import (
	"context"
	"fmt"
	"slices"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-inbox/inbox/amqp"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// A delivery from a producer that is not Watermill: headers of other types
// than string, and the id in the message-id property.
func ExampleMarshaler_Unmarshal() {
	d := amqp091.Delivery{
		MessageId: "order-42",
		Headers: amqp091.Table{
			"retries": int32(3),
			"urgent":  true,
			"trace":   amqp091.Table{"span": int64(7)},
			"sig":     []byte{0xde, 0xad},
		},
		Body: []byte(`{"order":42}`),
	}

	if _, err := (amqp.DefaultMarshaler{}).Unmarshal(d); err != nil {
		fmt.Println("DefaultMarshaler fails: the subscriber would requeue it in a loop")
	}

	msg, err := inboxamqp.Marshaler{}.Unmarshal(d)
	if err != nil {
		panic(err)
	}
	keys := make([]string, 0, len(msg.Metadata))
	for k := range msg.Metadata {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Printf("%s=%s\n", k, msg.Metadata[k])
	}

	b := keying.Builder{
		Bus: "rabbit", Group: "orders", Alias: keying.StaticAlias("charge"),
		IDSources: []keying.IDSource{keying.FromMetadata(keying.DefaultIDMetadataKey), inboxamqp.FromMessageID(), keying.FromUUID()},
	}
	k, source, err := b.Key(msg)
	if err != nil {
		panic(err)
	}
	fmt.Printf("key %s (id from %s)\n", k, source)
	// Output:
	// DefaultMarshaler fails: the subscriber would requeue it in a loop
	// amqp_message_id=order-42
	// retries=3
	// sig=3q0=
	// trace={"span":7}
	// urgent=true
	// key rabbit:orders:charge:order-42 (id from amqp-message-id)
}

// On the publishing side the marshaler puts the IdempotencyKey (else the
// UUID) in the message-id property, for consumers that are not Watermill.
func ExampleMarshaler_Marshal() {
	cfg := amqp.NewDurableQueueConfig("amqp://guest:guest@localhost:5672/")
	cfg.Marshaler = inboxamqp.Marshaler{} // used by amqp.NewPublisher and amqp.NewSubscriber

	msg := message.NewMessage("0b6c3a8e-uuid", []byte(`{"order":42}`))
	msg.Metadata.Set("IdempotencyKey", "order-42")
	p, err := cfg.Marshaler.Marshal(msg)
	if err != nil {
		panic(err)
	}
	fmt.Println(p.MessageId, p.Headers["IdempotencyKey"], p.Headers["_watermill_message_uuid"])
	// Output:
	// order-42 order-42 0b6c3a8e-uuid
}

// A consumer whose failed attempts wait in RabbitMQ delay queues: the
// consumer goes on with the next message at once, and the failed one comes
// back when its backoff ends. (Needs a RabbitMQ: no output is checked.)
func ExampleNewDelays() {
	ctx := context.Background()
	uri := "amqp://guest:guest@127.0.0.1:5672/"

	amqpConfig := amqp.NewDurableQueueConfig(uri)
	amqpConfig.Marshaler = inboxamqp.Marshaler{} // dead-lettered copies carry an x-death table header
	sub, err := amqp.NewSubscriber(amqpConfig, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}

	// Declares orders.inbox-delay-250ms ... orders.inbox-delay-1m0s, or says
	// why it cannot.
	delays, err := inboxamqp.NewDelays(ctx, inboxamqp.DelaysConfig{URI: uri, Queues: []string{"orders"}})
	if err != nil {
		panic(err)
	}
	defer delays.Close()

	store, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	ib, err := inboxmw.New(inboxmw.Config{
		Store: store, Bus: "rabbit", Group: "orders",
		MaxAttempts: 5,      // then dead, for a poison queue
		Redelivery:  delays, // backoffs wait in RabbitMQ, not in the consumer
	})
	if err != nil {
		panic(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(ib.Middleware)
	router.AddConsumerHandler("charge", "orders", sub, func(msg *message.Message) error {
		return charge(msg)
	})
	_ = router.Run(ctx)
	_ = ib.Close(ctx)
}

func charge(*message.Message) error { return nil }
