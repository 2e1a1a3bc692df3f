package inboxkafka_test

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/kafka"
	"github.com/watermill-inbox/inbox/middleware"
)

// The order of one record key holds through failures whose retries wait
// in the retry topics: 4 partitions, 40 accounts with 6 events each,
// published in order with the account as the record key, and the first
// attempt of about one event in six failing. Every account's effects are
// applied in its publish order, each once, while the other accounts' go
// on.
func TestOrderByRecordKey_keeps_each_keys_order_through_retries(t *testing.T) {
	t.Parallel()
	eachBroker(t, func(t *testing.T, env kafkaEnv) {
		topic, group := names(t)
		env.createTopic(t, topic, 4)
		retry := newRetry(t, env, topic, group, []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second}, nil)
		store := newMemoryStore(t)
		ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "kafka", Group: group, Redelivery: retry,
			Backoff: func(int) time.Duration { return 300 * time.Millisecond }, OrderKey: inboxkafka.OrderByRecordKey})
		if err != nil {
			t.Fatal(err)
		}
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		router.AddMiddleware(ib.Middleware)
		ledger := &testenv.Ledger{Accounts: 40, Events: 6, FailOneIn: 6}
		router.AddConsumerHandler("ledger", topic, retry.Subscriber(mainSubscriber(t, env, group)), ledger.Handle)
		runUntilCleanup(t, router, ib)
		publishByAccount(t, env, topic, ledger.Messages()...)
		testenv.Eventually(t, 60*time.Second, "every event applied", ledger.Done)
		ledger.Check(t)
	})
}

// publishByAccount publishes msgs with their "account" as the record key,
// so that one account's events go to one partition, in order.
func publishByAccount(t *testing.T, env kafkaEnv, topic string, msgs ...*message.Message) {
	t.Helper()
	cfg := kafka.DefaultSaramaSyncPublisherConfig()
	cfg.Version = sarama.V2_1_0_0
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: env.brokers, OverwriteSaramaConfig: cfg,
		Marshaler: kafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) { return m.Metadata.Get("account"), nil })},
		watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for _, m := range msgs {
		if err := pub.Publish(topic, m); err != nil {
			t.Fatal(err)
		}
	}
}
