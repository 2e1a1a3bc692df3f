package inboxkafka_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-inbox/inbox/kafka"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// A failed attempt's backoff waits in a retry topic, not in the partition:
// create the Retry, wrap the subscriber, and pass the Retry as the inbox's
// Redelivery. The first charge of order-1 fails; order-2 goes on meanwhile,
// and order-1 comes back from its retry topic once its backoff has passed.
func ExampleRetry() {
	ctx := context.Background()
	// An in-process Kafka; brokers of a real cluster work the same way.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "orders"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	saramaCfg := kafka.DefaultSaramaSubscriberConfig()
	saramaCfg.Version = sarama.V2_1_0_0
	saramaCfg.Consumer.Offsets.Initial = sarama.OffsetOldest

	// 1. The retry topics of consumer group "billing" on "orders", created
	//    here if they do not exist.
	retry, err := inboxkafka.NewRetry(ctx, inboxkafka.RetryConfig{
		Brokers:       brokers,
		ConsumerGroup: "billing",
		Topics:        []string{"orders"},
		SaramaConfig:  saramaCfg,
	})
	if err != nil {
		panic(err)
	}
	defer retry.Close()
	topics := retry.RetryTopics("orders")
	fmt.Println("retry topics:", topics[0], "...", topics[len(topics)-1])

	// 2. The main subscriber, as usual.
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		ConsumerGroup:         "billing",
		OverwriteSaramaConfig: saramaCfg,
	}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}

	// 3. The inbox, handing failed attempts to the retry topics.
	store, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "kafka", Group: "billing", Redelivery: retry})
	if err != nil {
		panic(err)
	}

	var (
		mu       sync.Mutex
		attempts = map[string]int{}
		charged  = make(chan string, 2)
	)
	charge := func(msg *message.Message) error {
		order := msg.Metadata.Get("IdempotencyKey")
		mu.Lock()
		attempts[order]++
		n := attempts[order]
		mu.Unlock()
		if order == "order-1" && n == 1 {
			return errors.New("payment gateway timeout")
		}
		charged <- fmt.Sprintf("charged %s on attempt %d", order, n)
		return nil
	}

	// 4. The router: the handler subscribes through the wrapped subscriber.
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(ib.Middleware)
	router.AddConsumerHandler("charge", "orders", retry.Subscriber(sub), charge)
	go func() { _ = router.Run(ctx) }()
	<-router.Running()

	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, Marshaler: kafka.DefaultMarshaler{}}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	for _, order := range []string{"order-1", "order-2"} {
		msg := message.NewMessage(watermill.NewUUID(), []byte(order))
		msg.Metadata.Set("IdempotencyKey", order)
		if err := pub.Publish("orders", msg); err != nil {
			panic(err)
		}
	}
	_ = pub.Close()

	var lines []string
	for range 2 {
		lines = append(lines, <-charged)
	}
	slices.Sort(lines)
	for _, l := range lines {
		fmt.Println(l)
	}

	// Shut down in this order: the router (it closes the wrapped
	// subscriber), the inbox, then the Retry (deferred).
	_ = router.Close()
	_ = ib.Close(ctx)
	// Output:
	// retry topics: orders.billing.retry-250ms ... orders.billing.retry-60000ms
	// charged order-1 on attempt 2
	// charged order-2 on attempt 1
}
