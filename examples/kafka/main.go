// Kafka: a Watermill router consuming orders from a Kafka topic in a consumer
// group, with the inbox middleware so that each order is charged once, however
// often it is delivered. The publisher sends some orders twice (a producer
// retry, with the same IdempotencyKey), one charge fails once and one always
// fails. A failed charge waits out its backoff in a retry topic
// ([inboxkafka.Retry]), not in its partition, which moves on with the next
// orders; the retry topic delivers it again when the backoff ends. With
// MaxAttempts 3 the third failure of the poison order marks its key dead,
// and a poison queue outside the inbox moves the message to a poison topic.
//
//	cd examples/kafka && go run .
//
// The example is a module of its own: the kfake it runs without brokers
// needs a newer Go than the library's module asks for.
//
// Environment:
//
//	KAFKA_BROKERS    comma-separated brokers (host:9092,...); when unset, the
//	                 example starts an in-process kfake cluster, so it needs no
//	                 setup
//	INBOX_STORE_URL  the inbox store, any URL of package stores
//	                 (default sqlite://./inbox-example.db?migrate=true)
//
// Each run uses a new topic (inbox-example-orders-<run id>, 3 partitions,
// replication factor 1), its retry topics (<topic>.<group>.retry-250ms and so
// on), a poison topic (the same name with -poison) and consumer groups
// (inbox-example-billing-<run id>, and the retry topics' with .retry), and
// on a real cluster deletes them at the end, so runs never see each other's
// messages. The consumer group is also the inbox group, so a store kept
// between runs (the SQLite file) keeps each run's keys apart.
//
// Messages are partitioned by their IdempotencyKey, so the copies of one order
// land in one partition and reach the consumer one after the other. The ids
// are the IdempotencyKey header, else the Watermill UUID, else (for records
// from producers that set neither) the record's topic/partition/offset
// ([inboxkafka.FromOffset]), which deduplicates redeliveries but not producer
// retries.
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
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/kafka"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores"
	_ "github.com/watermill-inbox/inbox/stores/all" // every store URL, as inboxd takes
)

// DefaultStoreURL is the store used when INBOX_STORE_URL is unset.
const DefaultStoreURL = "sqlite://./inbox-example.db?migrate=true"

func main() {
	cfg := Config{
		StoreURL: DefaultStoreURL,
		Timeout:  time.Minute,
	}
	if v := os.Getenv("INBOX_STORE_URL"); v != "" {
		cfg.StoreURL = v
	}
	if v := os.Getenv("KAFKA_BROKERS"); v != "" {
		cfg.Brokers = strings.Split(v, ",")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := Run(ctx, cfg, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// Config is what the example needs.
type Config struct {
	// Brokers of a real cluster; empty starts an in-process kfake cluster.
	Brokers  []string
	StoreURL string
	// Timeout bounds the wait for every order to be accounted for.
	Timeout time.Duration
}

// Summary is what happened to the deliveries.
type Summary struct {
	Published  int // messages sent
	Orders     int // distinct orders among them
	Received   int // deliveries that reached the router, resends included
	Processed  int // orders charged (handler succeeded, key marked)
	Duplicates int // deliveries skipped as duplicates
	Retried    int // handler failures, resent by watermill-kafka
	Dead       int // messages sent to the poison topic, their key dead
}

func (s Summary) String() string {
	return fmt.Sprintf("received %d, processed %d, duplicates skipped %d, retried %d, dead %d",
		s.Received, s.Processed, s.Duplicates, s.Retried, s.Dead)
}

// kafkaVersion is the protocol version the clients speak. watermill-kafka's
// default (1.0) is older than Kafka 4 accepts (KIP-896 removed the request
// versions before 2.1); 2.1, sarama's own default, works with Kafka 2.1 and
// newer, and with kfake.
var kafkaVersion = sarama.V2_1_0_0

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

	// 2. The brokers: a real cluster, or an in-process one.
	brokers := cfg.Brokers
	if len(brokers) == 0 {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return sum, fmt.Errorf("start kfake: %w", err)
		}
		defer cluster.Close()
		brokers = cluster.ListenAddrs()
		fmt.Fprintf(out, "KAFKA_BROKERS is not set: started an in-process kfake cluster at %s\n", strings.Join(brokers, ","))
	} else {
		fmt.Fprintf(out, "Kafka brokers: %s\n", strings.Join(brokers, ","))
	}
	run := watermill.NewShortUUID()
	topic := "inbox-example-orders-" + run
	poisonTopic := topic + "-poison"
	group := "inbox-example-billing-" + run
	fmt.Fprintf(out, "topic %s, consumer group %s\n", topic, group)

	// 3. A consumer-group subscriber reading from the oldest offset, so that
	//    nothing published before the group has joined is skipped.
	saramaCfg := kafka.DefaultSaramaSubscriberConfig()
	saramaCfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	saramaCfg.Version = kafkaVersion
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:                brokers,
		Unmarshaler:            kafka.DefaultMarshaler{},
		ConsumerGroup:          group,
		OverwriteSaramaConfig:  saramaCfg,
		InitializeTopicDetails: &sarama.TopicDetail{NumPartitions: 3, ReplicationFactor: 1},
	}, logger)
	if err != nil {
		return sum, fmt.Errorf("kafka subscriber: %w", err)
	}
	for _, t := range []string{topic, poisonTopic} {
		if err := sub.SubscribeInitialize(t); err != nil {
			return sum, fmt.Errorf("create topic %s: %w", t, err)
		}
	}

	// 4. The retry topics of the group, created here (one partition each),
	//    that hold failed charges until their backoff ends; the subscriber
	//    is wrapped to read them too.
	retry, err := inboxkafka.NewRetry(ctx, inboxkafka.RetryConfig{
		Brokers: brokers, ConsumerGroup: group, Topics: []string{topic}, SaramaConfig: saramaCfg,
	})
	if err != nil {
		return sum, err
	}
	defer retry.Close()
	if len(cfg.Brokers) > 0 {
		defer cleanUp(brokers, append([]string{topic, poisonTopic}, retry.RetryTopics(topic)...),
			[]string{group, group + inboxkafka.RetryConsumerGroupSuffix}, out)
	}

	// 5. The inbox middleware. The id is the IdempotencyKey header, else the
	//    Watermill UUID, else the record's position. A failed charge is held
	//    back by the store for a backoff (the default: up to 1 s ×
	//    2^attempt) and handed to the retry topics meanwhile; the third
	//    failure makes the key dead (MaxAttempts).
	counts := &counter{}
	ib, err := inboxmw.New(inboxmw.Config{
		Store:       store,
		Bus:         "kafka",
		Group:       group,
		IDSources:   append(keying.DefaultIDSources(), inboxkafka.FromOffset()),
		MaxAttempts: maxAttempts,
		Redelivery:  retry,
		Metrics:     counts,
		Logger:      logger,
	})
	if err != nil {
		return sum, err
	}

	// 6. The publisher, keyed by order so that the copies of one order share
	//    a partition.
	pubCfg := kafka.DefaultSaramaSyncPublisherConfig()
	pubCfg.Version = kafkaVersion
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               brokers,
		OverwriteSaramaConfig: pubCfg,
		Marshaler: kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
			return msg.Metadata.Get(keying.DefaultIDMetadataKey), nil
		}),
	}, logger)
	if err != nil {
		return sum, fmt.Errorf("kafka publisher: %w", err)
	}
	defer pub.Close()

	// 7. The consumer router: report (outside) sees every delivery, the
	//    poison queue moves the messages whose key is dead to the poison
	//    topic (and acks them), the inbox decides whether the handler runs.
	//    Only what is not transient: a dead key (inbox.DeadError) is
	//    poisoned. A failure before the last attempt is handed to the retry
	//    topics (or, if that fails, returned as a transient
	//    inbox.AttemptError, nacked and resent after the store's backoff).
	poisonMW, err := middleware.PoisonQueueWithFilter(pub, poisonTopic, func(err error) bool {
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
	router.AddConsumerHandler("charge-card", topic, retry.Subscriber(sub), b.chargeCard)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(runCtx) }()
	select {
	case <-router.Running():
	case err := <-routerDone:
		return sum, fmt.Errorf("router: %w", err)
	}

	// 8. The publisher sends the orders, duplicates included.
	orders := map[string]bool{}
	for _, id := range deliveries {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order":"`+id+`","amount_cents":1999}`))
		msg.Metadata.Set(keying.DefaultIDMetadataKey, id)
		if err := pub.Publish(topic, msg); err != nil {
			return sum, fmt.Errorf("publish %s: %w", id, err)
		}
		orders[id] = true
	}
	sum.Published, sum.Orders = len(deliveries), len(orders)

	// 9. Wait until every order but the poison one is charged, every extra
	//    delivery skipped, and the poison one dead.
	waitErr := waitUntil(ctx, cfg.Timeout, routerDone, func() bool {
		return counts.get(inboxmw.OutcomeProcessed) == sum.Orders-1 &&
			counts.get(inboxmw.OutcomeDuplicate) == sum.Published-sum.Orders &&
			counts.get(inboxmw.OutcomeDead) == 1
	})

	// 10. Stop the router, then let the inbox finish its pending marks.
	closeErr := router.Close()
	closeCtx, cancelClose := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelClose()
	closeErr = errors.Join(closeErr, ib.Close(closeCtx))

	sum.Received, sum.Retried = b.received()
	sum.Retried += counts.get(inboxmw.OutcomeRedelivered)
	sum.Processed = counts.get(inboxmw.OutcomeProcessed)
	sum.Duplicates = counts.get(inboxmw.OutcomeDuplicate)
	sum.Dead = counts.get(inboxmw.OutcomeDead)
	fmt.Fprintf(out, "\npublished %d messages for %d orders\n%s\n", sum.Published, sum.Orders, sum)
	n, err := countMessages(brokers, poisonTopic)
	if err != nil {
		closeErr = errors.Join(closeErr, fmt.Errorf("counting the messages of %s: %w", poisonTopic, err))
	}
	fmt.Fprintf(out, "poison topic %s holds %d message(s)\n", poisonTopic, n)
	if key := b.deadKey(); key != "" {
		fmt.Fprintf(out, "replay the dead order once its handler is fixed: inboxctl -store '%s' forget '%s', then republish it from %s\n",
			storeURL, key, poisonTopic)
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

// countMessages returns the number of messages of topic: the sum of its
// partitions' next offsets (nothing is deleted from it during a run).
func countMessages(brokers []string, topic string) (int64, error) {
	cfg := sarama.NewConfig()
	cfg.Version = kafkaVersion
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return 0, err
	}
	defer client.Close()
	partitions, err := client.Partitions(topic)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, p := range partitions {
		next, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return 0, err
		}
		n += next
	}
	return n, nil
}

// cleanUp deletes the run's topics and consumer groups from a real cluster;
// a failure is reported, not fatal.
func cleanUp(brokers []string, topics, groups []string, out io.Writer) {
	cfg := sarama.NewConfig()
	cfg.Version = kafkaVersion
	admin, err := sarama.NewClusterAdmin(brokers, cfg)
	if err == nil {
		defer admin.Close()
		for _, group := range groups {
			gerr := admin.DeleteConsumerGroup(group)
			if errors.Is(gerr, sarama.ErrGroupIDNotFound) {
				gerr = nil // the broker dropped the empty group already
			}
			err = errors.Join(err, gerr)
		}
		// The topics go once the broker has forgotten the groups: deleting
		// them while it still removes a group races in kfake.
		for deadline := time.Now().Add(5 * time.Second); err == nil && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			listed, lerr := admin.ListConsumerGroups()
			still := false
			for _, g := range groups {
				_, in := listed[g]
				still = still || in
			}
			if lerr != nil || !still {
				break
			}
		}
		for _, t := range topics {
			err = errors.Join(err, admin.DeleteTopic(t))
		}
	}
	if err != nil {
		fmt.Fprintf(out, "could not delete topics %s or groups %s: %v\n", strings.Join(topics, ", "), strings.Join(groups, ", "), err)
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
		delete(b.failures, id) // the gateway recovers for the retry
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
				fmt.Fprintf(b.out, "%s  failed: %v (attempt %d of %d); the store holds it back for %s, watermill-kafka resends it\n",
					id, ae.Err, ae.Attempt, ae.MaxAttempts, ae.RetryAfter.Round(time.Millisecond))
			} else {
				fmt.Fprintf(b.out, "%s  failed: %v; watermill-kafka resends it\n", id, err)
			}
		case msg.Metadata.Get(middleware.ReasonForPoisonedKey) != "":
			fmt.Fprintf(b.out, "%s  dead: moved to the poison topic and acked (%s)\n", id, msg.Metadata.Get(middleware.ReasonForPoisonedKey))
		case d.failure != nil:
			fmt.Fprintf(b.out, "%s  failed: %v; handed to a retry topic, delivered again after its backoff\n", id, d.failure)
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
