package inboxkafka_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/kafka"
	"github.com/watermill-inbox/inbox/middleware"
)

// kafkaEnv is where a test's topics live: an in-process kfake cluster, or
// the real brokers of KAFKA_BROKERS.
type kafkaEnv struct {
	brokers []string
	real    bool
}

// eachBroker runs f on a kfake cluster of its own and, when KAFKA_BROKERS
// is set, on those brokers (skipped otherwise).
func eachBroker(t *testing.T, f func(t *testing.T, env kafkaEnv)) {
	t.Run("kfake", func(t *testing.T) {
		t.Parallel()
		f(t, newKfake(t))
	})
	t.Run("real", func(t *testing.T) {
		t.Parallel()
		var addrs []string
		for _, a := range strings.Split(testenv.Kafka.URL(t), ",") {
			if a = strings.TrimSpace(a); a != "" {
				addrs = append(addrs, a)
			}
		}
		f(t, kafkaEnv{brokers: addrs, real: true})
	})
}

func newKfake(t *testing.T, opts ...kfake.Opt) kafkaEnv {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return kafkaEnv{brokers: c.ListenAddrs()}
}

// saramaConfig is what the tests' clients use: Kafka 2.1, which kfake and
// Kafka 4 both accept.
func saramaConfig() *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_1_0_0
	return cfg
}

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9-]+`)

// names returns a topic and a consumer group named after the test, unique
// per run.
func names(t *testing.T) (topic, group string) {
	base := unsafeName.ReplaceAllString(t.Name(), "-")
	base = base[max(0, len(base)-60):]
	run := watermill.NewShortUUID()[:8]
	return "t-" + base + "-" + run, "g-" + run
}

func (e kafkaEnv) admin(t testing.TB) sarama.ClusterAdmin {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(e.brokers, saramaConfig())
	if err != nil {
		t.Fatalf("kafka admin: %v", err)
	}
	return admin
}

// createTopic creates a main topic; on real brokers it is deleted when the
// test ends.
func (e kafkaEnv) createTopic(t *testing.T, name string, partitions int32) {
	t.Helper()
	admin := e.admin(t)
	defer admin.Close()
	if err := admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false); err != nil {
		t.Fatalf("creating topic %s: %v", name, err)
	}
	e.deleteAtCleanup(t, []string{name}, nil)
}

// deleteAtCleanup deletes topics and consumer groups from real brokers when
// the test ends (a kfake cluster goes as a whole).
func (e kafkaEnv) deleteAtCleanup(t *testing.T, topics, groups []string) {
	if !e.real {
		return
	}
	t.Cleanup(func() {
		admin := e.admin(t)
		defer admin.Close()
		for _, g := range groups {
			if err := admin.DeleteConsumerGroup(g); err != nil && !errors.Is(err, sarama.ErrGroupIDNotFound) {
				t.Logf("deleting consumer group %s: %v", g, err)
			}
		}
		for _, tp := range topics {
			if err := admin.DeleteTopic(tp); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
				t.Errorf("deleting topic %s: %v", tp, err)
			}
		}
	})
}

// newRetry creates a Retry for topic and group with delays, closed (and on
// real brokers its topics and groups deleted) when the test ends.
func newRetry(t *testing.T, env kafkaEnv, topic, group string, delays []time.Duration, log watermill.LoggerAdapter) *inboxkafka.Retry {
	t.Helper()
	return newRetryWith(t, env, inboxkafka.RetryConfig{
		Brokers:       env.brokers,
		ConsumerGroup: group,
		Topics:        []string{topic},
		Delays:        delays,
		SaramaConfig:  saramaConfig(),
		Logger:        log,
	})
}

// newRetryWith creates a Retry of cfg (one topic), closed (and on real
// brokers its topics and groups deleted) when the test ends.
func newRetryWith(t *testing.T, env kafkaEnv, cfg inboxkafka.RetryConfig) *inboxkafka.Retry {
	t.Helper()
	topic, group := cfg.Topics[0], cfg.ConsumerGroup
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := inboxkafka.NewRetry(ctx, cfg)
	if err != nil {
		t.Fatalf("NewRetry: %v", err)
	}
	env.deleteAtCleanup(t, r.RetryTopics(topic), []string{group, group + inboxkafka.RetryConsumerGroupSuffix})
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("Retry.Close: %v", err)
		}
	})
	return r
}

// runUntilCleanup runs router until the test ends, then closes it and ib.
func runUntilCleanup(t *testing.T, router *message.Router, ib *inboxmw.Inbox) {
	t.Helper()
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	t.Cleanup(func() {
		_ = router.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = ib.Close(ctx)
	})
}

// mainSubscriber is a watermill-kafka subscriber of group reading from the
// oldest offset.
func mainSubscriber(t *testing.T, env kafkaEnv, group string) *kafka.Subscriber {
	t.Helper()
	cfg := kafka.DefaultSaramaSubscriberConfig()
	cfg.Version = sarama.V2_1_0_0
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               env.brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		ConsumerGroup:         group,
		OverwriteSaramaConfig: cfg,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	return sub
}

// subscribe wraps a main subscriber of group with r and subscribes to topic;
// the subscriber is closed when the test ends.
func subscribe(t *testing.T, env kafkaEnv, r *inboxkafka.Retry, topic, group string) (<-chan *message.Message, message.Subscriber) {
	t.Helper()
	sub := r.Subscriber(mainSubscriber(t, env, group))
	t.Cleanup(func() {
		if err := sub.Close(); err != nil {
			t.Errorf("closing the subscriber: %v", err)
		}
	})
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatalf("Subscribe(%s): %v", topic, err)
	}
	return ch, sub
}

func publish(t *testing.T, env kafkaEnv, topic string, msgs ...*message.Message) {
	t.Helper()
	cfg := kafka.DefaultSaramaSyncPublisherConfig()
	cfg.Version = sarama.V2_1_0_0
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: env.brokers, Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: cfg}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish(topic, msgs...); err != nil {
		t.Fatal(err)
	}
}

// receive returns the next message of ch, failing the test after within.
func receive(t *testing.T, ch <-chan *message.Message, within time.Duration, what string) *message.Message {
	t.Helper()
	select {
	case m, ok := <-ch:
		if !ok {
			t.Fatalf("waiting for %s: the channel was closed", what)
		}
		return m
	case <-time.After(within):
		t.Fatalf("no %s within %s", what, within)
		return nil
	}
}

// copyOf is a copy as the middleware makes it: the original's UUID, payload
// and metadata, plus the inbox key and attempt count.
func copyOf(id, key string, attempts int) *message.Message {
	m := message.NewMessage(id, []byte("payload of "+id))
	m.Metadata.Set("IdempotencyKey", "order-"+id)
	m.Metadata.Set("tenant", "acme")
	m.Metadata.Set(inboxmw.MetadataKey, key)
	m.Metadata.Set(inboxmw.MetadataAttempts, fmt.Sprint(attempts))
	return m
}

// logRecorder is a watermill.LoggerAdapter that keeps its messages.
type logRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (r *logRecorder) add(level, msg string, fields watermill.LogFields) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, fmt.Sprintf("%s %s %v", level, msg, fields))
}

// count returns how many recorded lines hold all of subs.
func (r *logRecorder) count(subs ...string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
outer:
	for _, l := range r.lines {
		for _, s := range subs {
			if !strings.Contains(l, s) {
				continue outer
			}
		}
		n++
	}
	return n
}

func (r *logRecorder) logger() watermill.LoggerAdapter { return recLogger{rec: r} }

type recLogger struct {
	rec    *logRecorder
	fields watermill.LogFields
}

func (l recLogger) Error(msg string, err error, f watermill.LogFields) {
	l.rec.add("ERROR", msg+": "+err.Error(), l.fields.Add(f))
}
func (l recLogger) Info(msg string, f watermill.LogFields)  { l.rec.add("INFO", msg, l.fields.Add(f)) }
func (l recLogger) Debug(msg string, f watermill.LogFields) { l.rec.add("DEBUG", msg, l.fields.Add(f)) }
func (l recLogger) Trace(msg string, f watermill.LogFields) { l.rec.add("TRACE", msg, l.fields.Add(f)) }
func (l recLogger) With(f watermill.LogFields) watermill.LoggerAdapter {
	return recLogger{rec: l.rec, fields: l.fields.Add(f)}
}
