// Rabbit: a Watermill router consuming orders from a durable RabbitMQ queue,
// with the inbox middleware so that each order is charged once, however often
// it is delivered. The publisher sends some orders twice (a producer retry,
// with the same IdempotencyKey), one charge fails once and one always fails.
// A failed charge waits out its backoff in a RabbitMQ delay queue
// ([inboxamqp.Delays]), not in the consumer, which goes on with the next
// orders; RabbitMQ delivers it again when the backoff ends. With MaxAttempts
// 3 the third failure of the poison order marks its key dead, and a poison
// queue outside the inbox takes the message off the queue.
//
//	go run ./examples/rabbit
//
// Environment:
//
//	AMQP_URL         the broker (default amqp://guest:guest@127.0.0.1:5672/)
//	INBOX_STORE_URL  the inbox store, any URL of package stores
//	                 (default sqlite://./inbox-example.db?migrate=true)
//
// Each run uses a new durable queue, inbox-example-orders-<run id>, its delay
// queues (inbox-example-orders-<run id>.inbox-delay-250ms and so on), and a
// poison queue, inbox-example-orders-<run id>-poison, which it deletes at the
// end, so runs never see each other's messages. The queue name is also the
// inbox group, so a store kept between runs (the SQLite file) keeps each
// run's keys apart.
//
// The consumer uses [inboxamqp.Marshaler]: it accepts headers that are not
// strings (other AMQP clients send ints, booleans, tables) instead of
// requeueing such deliveries in a loop, and it keys messages without an
// IdempotencyKey by their AMQP message-id.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/url"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/amqp"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores"
	_ "github.com/watermill-inbox/inbox/stores/all" // every store URL, as inboxd takes
)

// Defaults of the environment variables.
const (
	DefaultAMQPURL  = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultStoreURL = "sqlite://./inbox-example.db?migrate=true"
)

func main() {
	cfg := Config{
		AMQPURL:  envOr("AMQP_URL", DefaultAMQPURL),
		StoreURL: envOr("INBOX_STORE_URL", DefaultStoreURL),
		Timeout:  time.Minute,
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := Run(ctx, cfg, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Config is what the example needs.
type Config struct {
	AMQPURL  string
	StoreURL string
	// Timeout bounds the wait for every order to be accounted for.
	Timeout time.Duration
}

// Summary is what happened to the deliveries.
type Summary struct {
	Published  int // messages sent
	Orders     int // distinct orders among them
	Received   int // deliveries that reached the router, redeliveries included
	Processed  int // orders charged (handler succeeded, key marked)
	Duplicates int // deliveries skipped as duplicates
	Retried    int // handler failures before the last attempt, redelivered by RabbitMQ after the backoff
	Dead       int // messages sent to the poison queue, their key dead
}

func (s Summary) String() string {
	return fmt.Sprintf("received %d, processed %d, duplicates skipped %d, retried %d, dead %d",
		s.Received, s.Processed, s.Duplicates, s.Retried, s.Dead)
}

// deliveries are the orders the publisher sends, by IdempotencyKey: order-2
// is a producer retry, order-4 is sent three times.
var deliveries = []string{"order-1", "order-2", "order-2", "order-3", "order-4", "order-4", "order-5", "order-4", "order-6"}

// failOnce is the order whose first charge fails (a payment gateway timeout);
// poison is the order whose charge always fails (a bug in the handler).
const (
	failOnce = "order-3"
	poison   = "order-6"
)

// maxAttempts is the inbox's MaxAttempts: the third failure of an order
// makes its key dead.
const maxAttempts = 3

// Run publishes the orders, consumes them until each is accounted for, prints
// what happens to out and returns the summary.
func Run(ctx context.Context, cfg Config, out io.Writer) (Summary, error) {
	var sum Summary
	logger := watermill.NopLogger{}

	// 1. The inbox store, chosen by URL. The URL is printed without its
	//    password.
	store, err := stores.Open(ctx, cfg.StoreURL)
	if err != nil {
		return sum, err
	}
	defer store.Close()
	storeURL := "?"
	if su, err := url.Parse(cfg.StoreURL); err == nil {
		storeURL = stores.Redact(su)
	}
	fmt.Fprintf(out, "inbox store: %s\n", storeURL)

	// 2. A durable queue of this run's own, and watermill-amqp with the
	//    inboxamqp marshaler on both sides.
	queue := "inbox-example-orders-" + watermill.NewShortUUID()
	poisonQueue := queue + "-poison"
	fmt.Fprintf(out, "queue %s, poison queue %s\n", queue, poisonQueue)
	amqpCfg := amqp.NewDurableQueueConfig(cfg.AMQPURL)
	amqpCfg.Marshaler = inboxamqp.Marshaler{}
	defer deleteQueue(cfg.AMQPURL, queue, out)
	defer deleteQueue(cfg.AMQPURL, poisonQueue, out)

	// 3. The delay queues that hold failed charges until their backoff
	//    ends; they dead-letter back to the queue. A setup that cannot
	//    declare them fails here, saying why.
	delays, err := inboxamqp.NewDelays(ctx, inboxamqp.DelaysConfig{URI: cfg.AMQPURL, Queues: []string{queue}})
	if err != nil {
		return sum, err
	}
	defer delays.Close()
	for _, d := range inboxamqp.DefaultDelays {
		defer deleteQueue(cfg.AMQPURL, inboxamqp.DelayQueueName(queue, d), out)
	}

	// 4. The inbox middleware. The id is the IdempotencyKey header, else the
	//    AMQP message-id, else the Watermill UUID. A failed charge is held
	//    back by the store for a backoff (the default: up to 1 s × 2^attempt)
	//    and handed to the delay queues meanwhile; the third failure makes
	//    the key dead (MaxAttempts).
	counts := &counter{}
	ib, err := inboxmw.New(inboxmw.Config{
		Store: store,
		Bus:   "rabbit",
		Group: queue,
		IDSources: []keying.IDSource{
			keying.FromMetadata(keying.DefaultIDMetadataKey),
			inboxamqp.FromMessageID(),
			keying.FromUUID(),
		},
		MaxAttempts: maxAttempts,
		Redelivery:  delays,
		Metrics:     counts,
		Logger:      logger,
	})
	if err != nil {
		return sum, err
	}

	// 5. The consumer router: report (outside) sees every delivery, the
	//    poison queue takes the messages whose key is dead (and acks them),
	//    the inbox decides whether the handler runs.
	sub, err := amqp.NewSubscriber(amqpCfg, logger)
	if err != nil {
		return sum, fmt.Errorf("rabbitmq subscriber: %w", err)
	}
	if err := sub.SubscribeInitialize(poisonQueue); err != nil {
		return sum, fmt.Errorf("declare %s: %w", poisonQueue, err)
	}
	pub, err := amqp.NewPublisher(amqpCfg, logger)
	if err != nil {
		return sum, fmt.Errorf("rabbitmq publisher: %w", err)
	}
	defer pub.Close()
	// Only what is not transient: a dead key (inbox.DeadError) is poisoned.
	// A failure before the last attempt is handed to the delay queues (or,
	// if that fails, returned as a transient inbox.AttemptError, nacked and
	// retried after the store's backoff).
	poisonMW, err := middleware.PoisonQueueWithFilter(pub, poisonQueue, func(err error) bool {
		return !inboxmw.IsTransient(err)
	})
	if err != nil {
		return sum, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return sum, err
	}
	defer router.Close()
	b := &billing{out: out, failures: map[string]bool{failOnce: true}}
	router.AddMiddleware(b.report, poisonMW, ib.Middleware)
	router.AddConsumerHandler("charge-card", queue, sub, b.chargeCard)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(runCtx) }()
	select {
	case <-router.Running():
	case err := <-routerDone:
		return sum, fmt.Errorf("router: %w", err)
	}

	// 6. The publisher sends the orders, duplicates included.
	orders := map[string]bool{}
	for _, id := range deliveries {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order":"`+id+`","amount_cents":1999}`))
		msg.Metadata.Set(keying.DefaultIDMetadataKey, id)
		if err := pub.Publish(queue, msg); err != nil {
			return sum, fmt.Errorf("publish %s: %w", id, err)
		}
		orders[id] = true
	}
	sum.Published, sum.Orders = len(deliveries), len(orders)

	// 7. Wait until every order but the poison one is charged, every extra
	//    delivery skipped, and the poison one dead.
	waitErr := waitUntil(ctx, cfg.Timeout, routerDone, func() bool {
		return counts.get(inboxmw.OutcomeProcessed) == sum.Orders-1 &&
			counts.get(inboxmw.OutcomeDuplicate) == sum.Published-sum.Orders &&
			counts.get(inboxmw.OutcomeDead) == 1
	})

	// 8. Stop the router, then let the inbox finish its pending marks.
	closeErr := router.Close()
	closeCtx, cancelClose := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelClose()
	closeErr = errors.Join(closeErr, ib.Close(closeCtx))

	sum.Received, sum.Retried = b.received()
	sum.Retried = counts.get(inboxmw.OutcomeRedelivered) + sum.Retried
	sum.Processed = counts.get(inboxmw.OutcomeProcessed)
	sum.Duplicates = counts.get(inboxmw.OutcomeDuplicate)
	sum.Dead = counts.get(inboxmw.OutcomeDead)
	fmt.Fprintf(out, "\npublished %d messages for %d orders\n%s\n", sum.Published, sum.Orders, sum)
	if key := b.deadKey(); key != "" {
		fmt.Fprintf(out, "replay the dead order once its handler is fixed: inboxctl -store '%s' forget '%s', then republish it from %s\n",
			storeURL, key, poisonQueue)
	}
	return sum, errors.Join(waitErr, closeErr)
}

// waitUntil polls cond until it holds, the timeout passes, ctx ends or the
// router stops.
func waitUntil(ctx context.Context, timeout time.Duration, routerDone <-chan error, cond func() bool) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			return fmt.Errorf("not every order was accounted for within %s", timeout)
		case <-ctx.Done():
			return ctx.Err()
		case err := <-routerDone:
			return fmt.Errorf("router stopped early: %v", err)
		}
	}
	return nil
}

// deleteQueue removes a queue of the run, saying how many messages it
// held if any; a failure is reported, not fatal.
func deleteQueue(amqpURL, queue string, out io.Writer) {
	conn, err := amqp091.Dial(amqpURL)
	n := 0
	if err == nil {
		defer conn.Close()
		var ch *amqp091.Channel
		if ch, err = conn.Channel(); err == nil {
			n, err = ch.QueueDelete(queue, false, false, false)
		}
	}
	switch {
	case err != nil:
		fmt.Fprintf(out, "could not delete queue %s: %v\n", queue, err)
	case n > 0:
		fmt.Fprintf(out, "deleted queue %s, which held %d message(s)\n", queue, n)
	}
}

// billing is the consumer. chargeCard is the handler whose side effect must
// happen once per order; report is a middleware outside the inbox that sees
// every delivery.
type billing struct {
	out io.Writer

	mu         sync.Mutex
	deliveries int
	nacked     int
	poisonKey  string // the inbox key of the poison order
	charged    map[string]int
	failures   map[string]bool // orders whose next charge fails
}

// delivery is what report learns of one delivery from inside the inbox.
type delivery struct {
	ran     bool  // the charge succeeded
	failure error // the charge failed
}

type deliveryKey struct{}

func (d *delivery) failed(err error) error {
	if d != nil {
		d.failure = err
	}
	return err
}

func (b *billing) chargeCard(msg *message.Message) error {
	id := msg.Metadata.Get(keying.DefaultIDMetadataKey)
	b.mu.Lock()
	defer b.mu.Unlock()
	d, _ := msg.Context().Value(deliveryKey{}).(*delivery)
	if id == poison {
		b.poisonKey = inboxmw.KeyFromCtx(msg.Context())
		return d.failed(errors.New("card number missing from the order"))
	}
	if b.failures[id] {
		delete(b.failures, id) // the gateway recovers for the redelivery
		return d.failed(errors.New("payment gateway timeout"))
	}
	if d != nil {
		d.ran = true
	}
	if b.charged == nil {
		b.charged = map[string]int{}
	}
	b.charged[id]++
	fmt.Fprintf(b.out, "%s  charged (times charged: %d)\n", id, b.charged[id])
	return nil
}

func (b *billing) report(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		b.mu.Lock()
		b.deliveries++
		b.mu.Unlock()
		d := &delivery{}
		msg.SetContext(context.WithValue(msg.Context(), deliveryKey{}, d))
		res, err := h(msg)
		id := msg.Metadata.Get(keying.DefaultIDMetadataKey)
		b.mu.Lock()
		defer b.mu.Unlock()
		switch {
		case err != nil:
			b.nacked++
			var ae *inbox.AttemptError
			if errors.As(err, &ae) {
				fmt.Fprintf(b.out, "%s  failed: %v (attempt %d of %d); the store holds it back for %s, RabbitMQ redelivers it\n",
					id, ae.Err, ae.Attempt, ae.MaxAttempts, ae.RetryAfter.Round(time.Millisecond))
			} else {
				fmt.Fprintf(b.out, "%s  failed: %v; RabbitMQ redelivers it\n", id, err)
			}
		case msg.Metadata.Get(middleware.ReasonForPoisonedKey) != "":
			fmt.Fprintf(b.out, "%s  dead: moved to the poison queue and acked (%s)\n", id, msg.Metadata.Get(middleware.ReasonForPoisonedKey))
		case d.failure != nil:
			fmt.Fprintf(b.out, "%s  failed: %v; handed to a RabbitMQ delay queue, delivered again after its backoff\n", id, d.failure)
		case !d.ran:
			fmt.Fprintf(b.out, "%s  duplicate: skipped, the handler was not called\n", id)
		}
		return res, err
	}
}

func (b *billing) deadKey() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.poisonKey
}

// received returns the deliveries and how many of them were nacked.
func (b *billing) received() (deliveries, nacked int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.deliveries, b.nacked
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
