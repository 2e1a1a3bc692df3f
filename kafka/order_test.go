package inboxkafka_test

import (
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
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
		const accounts, events = 40, 6
		var mu sync.Mutex
		applied := map[string][]int{} // account: the events applied, in order
		ran := map[string]int{}
		router.AddConsumerHandler("ledger", topic, retry.Subscriber(mainSubscriber(t, env, group)), func(m *message.Message) error {
			id, acct := m.Metadata.Get("IdempotencyKey"), m.Metadata.Get("account")
			var n int
			if _, err := fmt.Sscanf(m.Metadata.Get("seq"), "%d", &n); err != nil {
				return fmt.Errorf("event %s without seq: %w", id, err)
			}
			mu.Lock()
			defer mu.Unlock()
			if ran[id]++; ran[id] == 1 && failsFirst(id) {
				return errors.New("ledger busy")
			}
			applied[acct] = append(applied[acct], n)
			return nil
		})
		runUntilCleanup(t, router, ib)

		var msgs []*message.Message
		for e := range events {
			for a := range accounts {
				m := message.NewMessage(watermill.NewUUID(), nil)
				m.Metadata.Set("IdempotencyKey", fmt.Sprintf("acct%d-ev%d", a, e))
				m.Metadata.Set("account", fmt.Sprintf("acct%d", a))
				m.Metadata.Set("seq", fmt.Sprint(e))
				msgs = append(msgs, m)
			}
		}
		publishByAccount(t, env, topic, msgs...)
		testenv.Eventually(t, 60*time.Second, "every event applied", func() bool {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, seqs := range applied {
				n += len(seqs)
			}
			return n >= accounts*events
		})
		mu.Lock()
		defer mu.Unlock()
		failed := 0
		for id, n := range ran {
			if failsFirst(id) && n > 0 {
				failed++
			}
		}
		if failed == 0 {
			t.Fatal("no first attempt failed: the test checks nothing")
		}
		want := []int{0, 1, 2, 3, 4, 5}
		for a := range accounts {
			acct := fmt.Sprintf("acct%d", a)
			if got := applied[acct]; !slices.Equal(got, want) {
				t.Errorf("%s's events applied in the order %v, want %v", acct, got, want)
			}
		}
		t.Logf("%d of %d events failed their first attempt", failed, accounts*events)
	})
}

// failsFirst picks the events whose first attempt fails: about one in six,
// the same on every run.
func failsFirst(id string) bool {
	h := fnv.New32a()
	h.Write([]byte(id))
	return h.Sum32()%6 == 0
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
