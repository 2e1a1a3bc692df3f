package inboxmw_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// A router whose handler runs once per IdempotencyKey, however often the
// message is delivered.
func Example() {
	store, _ := memory.New(memory.Options{})
	ib, err := inboxmw.New(inboxmw.Config{
		Store: store,
		Bus:   "gochannel",
		Group: "billing",
	})
	if err != nil {
		panic(err)
	}

	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	router.AddMiddleware(ib.Middleware)

	charged := make(chan string, 10)
	router.AddConsumerHandler("charge-card", "orders", pubSub, func(msg *message.Message) error {
		charged <- msg.Metadata.Get("IdempotencyKey")
		return nil
	})
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()

	for range 3 { // the producer retried twice
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order":42}`))
		msg.Metadata.Set("IdempotencyKey", "order-42")
		_ = pubSub.Publish("orders", msg)
	}

	fmt.Println("charged:", <-charged)
	select {
	case again := <-charged:
		fmt.Println("charged again:", again)
	case <-time.After(500 * time.Millisecond):
		fmt.Println("no second charge")
	}

	_ = router.Close()
	_ = ib.Close(context.Background())
	// Output:
	// charged: order-42
	// no second charge
}

// Messages of one account run in their order. When one of them goes dead
// (its fifth attempt fails, or its handler returns inbox.Permanent), the
// account's later messages run without it, instead of waiting for an
// operator's inboxctl order-release.
func ExampleOrderOnDeadPolicy() {
	store, _ := memory.New(memory.Options{})
	ib, err := inboxmw.New(inboxmw.Config{
		Store:       store,
		Bus:         "kafka",
		Group:       "billing",
		OrderKey:    func(msg *message.Message) (string, error) { return msg.Metadata.Get("account"), nil },
		MaxAttempts: 5,
		OrderOnDead: inboxmw.OrderOnDeadSkip,
	})
	if err != nil {
		panic(err)
	}
	defer ib.Close(context.Background())
	fmt.Println(inboxmw.OrderOnDeadSkip)
	// Output: OrderOnDeadSkip
}
