// Quickstart: a Watermill router on an in-process GoChannel whose handler
// charges each order once, however often the order is delivered. It needs no
// external service: the inbox is the in-memory store.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx := context.Background()

	// 1. An inbox store. Swap it for Redis, SQL, MongoDB or a remote inbox
	//    service in production: every store passes the same conformance suite.
	store, err := memory.New(memory.Options{})
	if err != nil {
		return err
	}
	defer store.Close()

	// 2. The inbox middleware. Bus and Group scope the keys:
	//    {bus}:{group}:{handler name}:{IdempotencyKey header or message UUID}.
	counts := &counter{}
	inbox, err := inboxmw.New(inboxmw.Config{
		Store:   store,
		Bus:     "gochannel",
		Group:   "billing",
		Metrics: counts,
	})
	if err != nil {
		return err
	}

	// 3. A router with the middleware. BlockPublishUntilSubscriberAck makes
	//    this demo deterministic; a nacked message is redelivered at once.
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	router.AddMiddleware(report, inbox.Middleware)
	b := &billing{charged: map[string]int{}, gatewayDown: map[string]bool{"order-3": true}}
	router.AddConsumerHandler("charge-card", "orders", pubSub, b.chargeCard)
	go func() {
		if err := router.Run(ctx); err != nil {
			log.Fatal(err)
		}
	}()
	<-router.Running()

	// 4. Orders, with a producer retry (order-2), a redelivered message
	//    (order-4, three times) and a flaky payment gateway (order-3 fails once).
	deliveries := []string{"order-1", "order-2", "order-2", "order-3", "order-4", "order-4", "order-5", "order-4"}
	for _, id := range deliveries {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order":"`+id+`"}`))
		msg.Metadata.Set("IdempotencyKey", id)
		if err := pubSub.Publish("orders", msg); err != nil {
			return err
		}
	}

	// 5. Stop the router, then let the inbox finish its pending marks.
	if err := router.Close(); err != nil {
		return err
	}
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := inbox.Close(closeCtx); err != nil {
		return err
	}
	fmt.Printf("\npublished %d messages for %d orders\n", len(deliveries), b.orders())
	fmt.Printf("processed %d, duplicates skipped %d, handler failures retried %d\n",
		counts.get(inboxmw.OutcomeProcessed), counts.get(inboxmw.OutcomeDuplicate), counts.get(inboxmw.OutcomeReleased))
	return nil
}

// billing charges cards: the side effect that must happen once per order.
type billing struct {
	mu          sync.Mutex
	charged     map[string]int  // times each order was charged
	gatewayDown map[string]bool // orders whose next charge fails
}

// chargeCard is the handler.
func (b *billing) chargeCard(msg *message.Message) error {
	id := msg.Metadata.Get("IdempotencyKey")
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gatewayDown[id] {
		delete(b.gatewayDown, id) // recovers for the redelivery
		return errors.New("payment gateway timeout")
	}
	if ran, ok := msg.Context().Value(ranKey{}).(*bool); ok {
		*ran = true
	}
	b.charged[id]++
	fmt.Printf("%s  charged (times charged: %d)\n", id, b.charged[id])
	return nil
}

// orders returns how many orders were charged.
func (b *billing) orders() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.charged)
}

type ranKey struct{}

// report prints what happened to each delivery that did not charge. It sits
// outside the inbox middleware, so it sees what the router sees.
func report(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ran := new(bool)
		msg.SetContext(context.WithValue(msg.Context(), ranKey{}, ran))
		out, err := h(msg)
		id := msg.Metadata.Get("IdempotencyKey")
		switch {
		case err != nil:
			fmt.Printf("%s  failed: %v; attempt ended, the redelivery waits out its backoff\n", id, err)
		case !*ran:
			fmt.Printf("%s  duplicate: skipped, the handler was not called\n", id)
		}
		return out, err
	}
}

// counter is a inboxmw.Metrics that counts outcomes.
type counter struct {
	mu sync.Mutex
	n  map[inboxmw.Outcome]int
}

func (c *counter) Outcome(_ string, o inboxmw.Outcome) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[inboxmw.Outcome]int{}
	}
	c.n[o]++
}

func (c *counter) StoreCall(string, time.Duration, error) {}

func (c *counter) Waited(string, string, time.Duration) {}

func (c *counter) get(o inboxmw.Outcome) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[o]
}
