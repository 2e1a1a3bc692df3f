package inboxkafka_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/kafka"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
)

func TestFromOffset_message_outside_a_kafka_router_has_no_id(t *testing.T) {
	t.Parallel()
	src := inboxkafka.FromOffset()
	if src.Name() != inboxkafka.SourceName || src.Name() != "kafka-offset" {
		t.Fatalf("Name() = %q, want %q", src.Name(), "kafka-offset")
	}
	id, err := src.ID(message.NewMessage(watermill.NewUUID(), []byte("x")))
	if err != nil || id != "" {
		t.Fatalf("ID of a message built by hand = %q, %v; want \"\", nil", id, err)
	}

	// Falls through to the next source in a Builder.
	b := keying.Builder{Bus: "kafka", Group: "g", Alias: keying.StaticAlias("a"),
		IDSources: []keying.IDSource{src, keying.FromUUID()}}
	k, from, err := b.Key(message.NewMessage("uuid-1", nil))
	if err != nil || k.ID != "uuid-1" || from != "uuid" {
		t.Fatalf("Builder.Key = %+v from %q, %v; want the UUID from \"uuid\"", k, from, err)
	}
}

// TestFromOffset_keys_by_topic_partition_offset_in_a_router consumes three
// records through a watermill-kafka consumer group on an in-process kfake
// cluster, keyed only by offset. The handler fails once on the second record
// (watermill-kafka resends it in-process: same offset, same key). A replay of
// the topic by a second consumer group (a redelivery of every record) is all
// duplicates, while a producer retry (the third record repeats the first
// one's IdempotencyKey) is a new key: offsets deduplicate redeliveries, not
// producer retries.
func TestFromOffset_keys_by_topic_partition_offset_in_a_router(t *testing.T) {
	t.Parallel()
	const topic = "orders"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()

	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, Marshaler: kafka.DefaultMarshaler{}}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"order-1", "order-2", "order-1"} {
		msg := message.NewMessage(watermill.NewUUID(), []byte(key))
		msg.Metadata.Set("IdempotencyKey", key)
		if err := pub.Publish(topic, msg); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}

	store, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })

	var (
		mu     sync.Mutex
		ran    []string // ids the handler saw, in order
		failed bool
	)
	handler := func(msg *message.Message) error {
		id, err := inboxkafka.FromOffset().ID(msg)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		ran = append(ran, id)
		if id == topic+"/0/1" && !failed {
			failed = true
			return errors.New("first attempt fails")
		}
		return nil
	}

	first := runRouter(t, brokers, topic, "group-1", store, handler)
	testenv.Eventually(t, 60*time.Second, "3 processed by group-1", func() bool { return first.get(inboxmw.OutcomeProcessed) == 3 })
	first.stop(t)

	mu.Lock()
	got := fmt.Sprint(ran)
	mu.Unlock()
	if want := "[orders/0/0 orders/0/1 orders/0/1 orders/0/2]"; got != want {
		t.Errorf("handler ran for %s, want %s", got, want)
	}
	for off, attempts := range []int{1, 2, 1} {
		key := fmt.Sprintf("kafka:billing:charge:orders/0/%d", off)
		rec, err := store.Get(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != inbox.StateProcessed || rec.Attempts != attempts {
			t.Errorf("Get(%s) = %v with %d attempts, want processed with %d", key, rec.State, rec.Attempts, attempts)
		}
	}

	second := runRouter(t, brokers, topic, "group-2", store, handler)
	testenv.Eventually(t, 60*time.Second, "3 duplicates in group-2", func() bool { return second.get(inboxmw.OutcomeDuplicate) == 3 })
	second.stop(t)
	mu.Lock()
	defer mu.Unlock()
	if len(ran) != 4 {
		t.Errorf("the replay ran the handler: it ran for %v", ran)
	}
	if n := second.get(inboxmw.OutcomeProcessed); n != 0 {
		t.Errorf("the replay processed %d records, want 0", n)
	}
}

type runningRouter struct {
	router *message.Router
	inbox  *inboxmw.Inbox
	done   chan error
	counts
}

// runRouter runs a router whose handler "charge" consumes topic in the Kafka
// consumer group, behind the inbox middleware keyed by offset only.
func runRouter(t *testing.T, brokers []string, topic, group string, store inbox.LeaseStore, h message.NoPublishHandlerFunc) *runningRouter {
	t.Helper()
	cfg := kafka.DefaultSaramaSubscriberConfig()
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		ConsumerGroup:         group,
		OverwriteSaramaConfig: cfg,
		NackResendSleep:       kafka.NoSleep,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	rr := &runningRouter{done: make(chan error, 1)}
	rr.inbox, err = inboxmw.New(inboxmw.Config{
		Store:     store,
		Bus:       "kafka",
		Group:     "billing",
		IDSources: []keying.IDSource{inboxkafka.FromOffset()},
		Metrics:   &rr.counts,
	})
	if err != nil {
		t.Fatal(err)
	}
	rr.router, err = message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	rr.router.AddMiddleware(rr.inbox.Middleware)
	rr.router.AddConsumerHandler("charge", topic, sub, h)
	go func() { rr.done <- rr.router.Run(context.Background()) }()
	t.Cleanup(func() { _ = rr.router.Close() })
	select {
	case <-rr.router.Running():
	case err := <-rr.done:
		t.Fatalf("router stopped: %v", err)
	}
	return rr
}

func (rr *runningRouter) stop(t *testing.T) {
	t.Helper()
	if err := rr.router.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-rr.done; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rr.inbox.Close(ctx); err != nil {
		t.Fatal(err)
	}
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
