package inboxkafka_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/kafka"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
)

func TestTimestamp_outside_a_kafka_subscriber_is_absent(t *testing.T) {
	t.Parallel()
	if ts, ok := inboxkafka.Timestamp(message.NewMessage("m", nil)); ok {
		t.Fatalf("Timestamp of a message built by hand = %s, true; want false", ts)
	}
}

// staleTimeKey is the metadata field whose RFC 3339 time the test's
// publisher writes as the Kafka record's timestamp.
const staleTimeKey = "record_time"

// staleMarshaler is watermill-kafka's marshaler that sets the record's
// timestamp from the metadata field staleTimeKey.
type staleMarshaler struct{ kafka.DefaultMarshaler }

func (m staleMarshaler) Marshal(topic string, msg *message.Message) (*sarama.ProducerMessage, error) {
	pm, err := m.DefaultMarshaler.Marshal(topic, msg)
	if err != nil {
		return nil, err
	}
	if v := msg.Metadata.Get(staleTimeKey); v != "" {
		ts, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return nil, err
		}
		pm.Timestamp = ts
	}
	return pm, nil
}

// A record older than the store's retention (1 h here) is stale: read with
// inboxkafka.Timestamp, it is logged and counted and handled by default,
// and refused with StaleReject, landing in a filtered poison queue without
// running the handler. A fresh record is handled by both.
func TestTimestamp_old_record_is_stale_warned_or_refused(t *testing.T) {
	t.Parallel()
	const topic = "payments"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()

	pubCfg := kafka.DefaultSaramaSyncPublisherConfig()
	pubCfg.Version = sarama.V2_1_0_0 // record timestamps need 0.10+
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers, Marshaler: staleMarshaler{}, OverwriteSaramaConfig: pubCfg}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		id  string
		age time.Duration
	}{{"old", 2 * time.Hour}, {"fresh", 0}} {
		msg := message.NewMessage(watermill.NewUUID(), []byte(r.id))
		msg.Metadata.Set("IdempotencyKey", r.id)
		msg.Metadata.Set(staleTimeKey, time.Now().Add(-r.age).Format(time.RFC3339Nano))
		if err := pub.Publish(topic, msg); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}

	for _, policy := range []inboxmw.StalePolicy{inboxmw.StaleWarn, inboxmw.StaleReject} {
		name := map[inboxmw.StalePolicy]string{inboxmw.StaleWarn: "StaleWarn", inboxmw.StaleReject: "StaleReject"}[policy]
		t.Run(name, func(t *testing.T) {
			store, err := memory.New(memory.Options{Retention: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = store.Close() })
			var c counts
			logs := watermill.NewCaptureLogger()
			ib, err := inboxmw.New(inboxmw.Config{
				Store: store, Bus: "kafka", Group: "payments-" + name, Metrics: &c, Logger: logs,
				Timestamp: inboxkafka.Timestamp,
				Stale:     policy,
			})
			if err != nil {
				t.Fatal(err)
			}
			poison := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
			t.Cleanup(func() { _ = poison.Close() })
			pq, err := wmw.PoisonQueueWithFilter(poison, "poison", func(err error) bool { return !inboxmw.IsTransient(err) })
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var ran []string
			staleRouter(t, brokers, topic, "group-"+name, func(r *message.Router) {
				r.AddMiddleware(pq, ib.Middleware)
			}, func(msg *message.Message) error {
				mu.Lock()
				defer mu.Unlock()
				ran = append(ran, string(msg.Payload))
				return nil
			})
			handled := 2
			if policy == inboxmw.StaleReject {
				handled = 1
			}
			testenv.Eventually(t, 60*time.Second, "the fresh record processed, the stale one counted", func() bool {
				return c.get(inboxmw.OutcomeProcessed) == handled && c.get(inboxmw.OutcomeStale) == 1
			})
			closeCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := ib.Close(closeCtx); err != nil {
				t.Fatal(err)
			}

			var line *watermill.CapturedMessage
			for _, m := range logs.Captured()[watermill.ErrorLogLevel] {
				if strings.HasPrefix(m.Msg, "Message older than the store's retention") {
					line = &m
				}
			}
			if line == nil || line.Fields["inbox_key"] != "kafka:payments-"+name+":charge:old" || !errors.Is(line.Err, inbox.ErrStale) {
				t.Errorf("stale log line %+v; want one for the old record's key, with ErrStale", line)
			}
			mu.Lock()
			defer mu.Unlock()
			if policy == inboxmw.StaleWarn {
				if len(ran) != 2 {
					t.Errorf("StaleWarn: the handler ran for %q, want both records", ran)
				}
				return
			}
			if len(ran) != 1 || ran[0] != "fresh" {
				t.Errorf("StaleReject: the handler ran for %q, want the fresh record only", ran)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ch, err := poison.Subscribe(ctx, "poison")
			if err != nil {
				t.Fatal(err)
			}
			select {
			case m := <-ch:
				m.Ack()
				if string(m.Payload) != "old" || !strings.Contains(m.Metadata.Get(wmw.ReasonForPoisonedKey), inbox.ErrStale.Error()) {
					t.Errorf("poisoned %q with reason %q; want the old record, refused as stale", m.Payload, m.Metadata.Get(wmw.ReasonForPoisonedKey))
				}
			case <-ctx.Done():
				t.Error("the stale record never reached the poison queue")
			}
		})
	}
}

// staleRouter runs a router whose handler "charge" consumes topic in the
// Kafka consumer group, from the oldest offset, with the middlewares setup
// adds, until the test ends.
func staleRouter(t *testing.T, brokers []string, topic, group string, setup func(*message.Router), h message.NoPublishHandlerFunc) {
	t.Helper()
	cfg := kafka.DefaultSaramaSubscriberConfig()
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Version = sarama.V2_1_0_0
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: brokers, Unmarshaler: kafka.DefaultMarshaler{}, ConsumerGroup: group,
		OverwriteSaramaConfig: cfg, NackResendSleep: kafka.NoSleep,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	setup(r)
	r.AddConsumerHandler("charge", topic, sub, h)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		_ = r.Close()
		if err := <-done; err != nil {
			t.Errorf("router: %v", err)
		}
	})
	select {
	case <-r.Running():
	case err := <-done:
		t.Fatalf("router stopped: %v", err)
	}
}
