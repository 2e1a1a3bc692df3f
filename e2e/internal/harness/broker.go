package harness

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-inbox/inbox/amqp"
	"github.com/watermill-inbox/inbox/internal/testenv"
)

// Broker kinds.
const (
	Rabbit = "rabbit"
	Kafka  = "kafka"
)

// BrokerKind is a column of the matrix: a broker the suite runs against.
type BrokerKind struct {
	// Name names the subtests ("rabbit", "kafka", "kafka-real").
	Name string
	// Start returns the broker for one test case; it skips (or fails, per
	// internal/testenv) when the broker is not available, and stops what it
	// started when the test ends.
	Start func(t *testing.T) BrokerSpec
}

// Brokers are the brokers of the matrix: RabbitMQ from the service table,
// Kafka in-process (kfake, one cluster per case), and a real Kafka when
// KAFKA_BROKERS is set.
func Brokers() []BrokerKind {
	return []BrokerKind{
		{Name: "rabbit", Start: func(t *testing.T) BrokerSpec {
			return BrokerSpec{Kind: Rabbit, AMQPURL: testenv.RabbitMQ.URL(t)}
		}},
		{Name: "kafka", Start: startKfake},
		{Name: "kafka-real", Start: func(t *testing.T) BrokerSpec {
			raw := testenv.Kafka.URL(t)
			var addrs []string
			for _, a := range strings.Split(raw, ",") {
				if a = strings.TrimSpace(a); a != "" {
					addrs = append(addrs, a)
				}
			}
			// A real broker refuses sessions below group.min.session.timeout.ms (6 s by default).
			return BrokerSpec{Kind: Kafka, Brokers: addrs, Session: 10 * time.Second}
		}},
	}
}

// startKfake runs an in-process Kafka cluster for one test case. Sessions are
// short so that a killed consumer's partitions move on quickly.
func startKfake(t *testing.T) BrokerSpec {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return BrokerSpec{Kind: Kafka, Brokers: c.ListenAddrs(), Session: 3 * time.Second}
}

// BrokerSpec says how to reach a broker; it travels to child processes as
// JSON.
type BrokerSpec struct {
	Kind    string        `json:"kind"`
	AMQPURL string        `json:"amqp_url,omitempty"`
	Brokers []string      `json:"brokers,omitempty"`
	Session time.Duration `json:"session,omitempty"` // Kafka consumer group session timeout
	// SingleActive makes RabbitMQ queues single active consumer queues
	// (x-single-active-consumer): one consumer gets the deliveries, in
	// order, the others stand by.
	SingleActive bool `json:"single_active,omitempty"`
}

// queueArgs are the arguments of the broker's RabbitMQ queues.
func (b BrokerSpec) queueArgs() amqp.Table {
	if b.SingleActive {
		return amqp.Table{"x-single-active-consumer": true}
	}
	return nil
}

// Bus is the bus segment of the inbox keys.
func (b BrokerSpec) Bus() string { return b.Kind }

// partitionKey is the metadata field that chooses a Kafka partition for a
// message published by [BrokerSpec.Publisher]; recordKey, when set, is its
// Kafka record key.
const (
	partitionKey = "e2e_partition"
	recordKey    = "e2e_record_key"
)

// CreateDest creates a fresh queue (RabbitMQ) or topic (Kafka, with the given
// number of partitions) named after the test, and deletes it when the test
// ends.
func (b BrokerSpec) CreateDest(t *testing.T, partitions int) string {
	t.Helper()
	name := "e2e-" + sanitize(t.Name()) + "-" + watermill.NewShortUUID()[:8]
	switch b.Kind {
	case Rabbit:
		conn, ch := b.amqpChannel(t)
		defer conn.Close()
		// The arguments of watermill-amqp's durable queue configuration, so
		// that its own declaration matches.
		if _, err := ch.QueueDeclare(name, true, false, false, false, b.queueArgs()); err != nil {
			t.Fatalf("declaring queue %s: %v", name, err)
		}
		t.Cleanup(func() {
			conn, ch := b.amqpChannel(t)
			defer conn.Close()
			if _, err := ch.QueueDelete(name, false, false, false); err != nil {
				t.Errorf("deleting queue %s: %v", name, err)
			}
		})
	case Kafka:
		admin, err := sarama.NewClusterAdmin(b.Brokers, b.saramaConfig())
		if err != nil {
			t.Fatalf("kafka admin: %v", err)
		}
		defer admin.Close()
		err = admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: int32(partitions), ReplicationFactor: 1}, false)
		if err != nil {
			t.Fatalf("creating topic %s: %v", name, err)
		}
		t.Cleanup(func() {
			admin, err := sarama.NewClusterAdmin(b.Brokers, b.saramaConfig())
			if err != nil {
				t.Errorf("kafka admin: %v", err)
				return
			}
			defer admin.Close()
			if err := admin.DeleteTopic(name); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
				t.Errorf("deleting topic %s: %v", name, err)
			}
		})
	default:
		t.Fatalf("unknown broker kind %q", b.Kind)
	}
	return name
}

func (b BrokerSpec) amqpChannel(t testing.TB) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
	conn, err := amqp.Dial(b.AMQPURL)
	if err != nil {
		t.Fatalf("connecting to RabbitMQ: %v", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		t.Fatalf("RabbitMQ channel: %v", err)
	}
	return conn, ch
}

func (b BrokerSpec) saramaConfig() *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_1_0_0
	cfg.ClientID = "inbox-e2e"
	cfg.Metadata.Retry.Backoff = 100 * time.Millisecond
	return cfg
}

func (b BrokerSpec) amqpConfig() wamqp.Config {
	cfg := wamqp.NewDurableQueueConfig(b.AMQPURL)
	// Publishers set the AMQP message-id (from IdempotencyKey); subscribers
	// turn every header into a string instead of requeueing the delivery
	// forever, and copy the message-id into the metadata.
	cfg.Marshaler = inboxamqp.Marshaler{}
	cfg.Queue.Arguments = b.queueArgs()
	return cfg
}

// Publisher returns a publisher to the broker. A Kafka message carrying
// the metadata field e2e_partition goes to that partition (else to 0), with
// the metadata field e2e_record_key, when set, as its record key.
func (b BrokerSpec) Publisher() (message.Publisher, error) {
	switch b.Kind {
	case Rabbit:
		return wamqp.NewPublisher(b.amqpConfig(), watermill.NopLogger{})
	case Kafka:
		cfg := kafka.DefaultSaramaSyncPublisherConfig()
		cfg.Version = sarama.V2_1_0_0
		cfg.Producer.Partitioner = sarama.NewManualPartitioner
		cfg.Metadata.Retry.Backoff = 100 * time.Millisecond
		return kafka.NewPublisher(kafka.PublisherConfig{
			Brokers:               b.Brokers,
			Marshaler:             partitionMarshaler{},
			OverwriteSaramaConfig: cfg,
		}, watermill.NopLogger{})
	}
	return nil, fmt.Errorf("unknown broker kind %q", b.Kind)
}

type partitionMarshaler struct{ kafka.DefaultMarshaler }

func (m partitionMarshaler) Marshal(topic string, msg *message.Message) (*sarama.ProducerMessage, error) {
	pm, err := m.DefaultMarshaler.Marshal(topic, msg)
	if err != nil {
		return nil, err
	}
	if v := msg.Metadata.Get(partitionKey); v != "" {
		p, err := strconv.Atoi(v)
		if err != nil {
			return nil, fmt.Errorf("metadata %s=%q: %w", partitionKey, v, err)
		}
		pm.Partition = int32(p)
	}
	if v := msg.Metadata.Get(recordKey); v != "" {
		pm.Key = sarama.StringEncoder(v)
	}
	return pm, nil
}

// Subscriber returns a subscriber that competes with the others of group
// for dest's messages: on RabbitMQ a consumer of queue dest, on Kafka a
// member of consumer group group reading from the oldest offset.
func (b BrokerSpec) Subscriber(group string) (message.Subscriber, error) {
	switch b.Kind {
	case Rabbit:
		return wamqp.NewSubscriber(b.amqpConfig(), watermill.NopLogger{})
	case Kafka:
		return kafka.NewSubscriber(kafka.SubscriberConfig{
			Brokers:               b.Brokers,
			Unmarshaler:           kafka.DefaultMarshaler{},
			ConsumerGroup:         group,
			OverwriteSaramaConfig: b.subscriberConfig(),
			NackResendSleep:       50 * time.Millisecond,
			ReconnectRetrySleep:   100 * time.Millisecond,
		}, watermill.NopLogger{})
	}
	return nil, fmt.Errorf("unknown broker kind %q", b.Kind)
}

// subscriberConfig is the sarama config of consumers: from the oldest
// offset, short waits and sessions, so that a killed consumer's partitions
// move on quickly.
func (b BrokerSpec) subscriberConfig() *sarama.Config {
	cfg := kafka.DefaultSaramaSubscriberConfig()
	cfg.Version = sarama.V2_1_0_0
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	cfg.Consumer.MaxWaitTime = 100 * time.Millisecond
	cfg.Consumer.Group.Session.Timeout = b.Session
	cfg.Consumer.Group.Heartbeat.Interval = b.Session / 10
	cfg.Consumer.Group.Rebalance.Retry.Backoff = 100 * time.Millisecond
	// How long a rebalance waits for members to rejoin (60 s by default): a
	// member that closes mid-rebalance must not hold the others' joins, and
	// their router's close, for a minute.
	cfg.Consumer.Group.Rebalance.Timeout = 2 * b.Session
	cfg.Metadata.Retry.Backoff = 100 * time.Millisecond
	return cfg
}

// Raw is a message published with the broker's own client, bypassing
// Watermill's marshaler: no Watermill UUID unless a header sets it.
type Raw struct {
	Body []byte
	// AMQPHeaders are AMQP header values of any AMQP type.
	AMQPHeaders amqp.Table
	// MessageID is the AMQP message-id property.
	MessageID string
	// KafkaHeaders are Kafka record headers (bytes).
	KafkaHeaders map[string][]byte
	// Partition is the Kafka partition.
	Partition int32
}

// PublishRaw publishes raw messages to dest with the broker's client.
func (b BrokerSpec) PublishRaw(t testing.TB, dest string, msgs ...Raw) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch b.Kind {
	case Rabbit:
		conn, ch := b.amqpChannel(t)
		defer conn.Close()
		if err := ch.Confirm(false); err != nil {
			t.Fatalf("confirm mode: %v", err)
		}
		for _, m := range msgs {
			conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", dest, true, false, amqp.Publishing{
				Headers: m.AMQPHeaders, Body: m.Body, MessageId: m.MessageID, DeliveryMode: amqp.Persistent,
			})
			if err != nil {
				t.Fatalf("raw publish to %s: %v", dest, err)
			}
			if ok, err := conf.WaitContext(ctx); err != nil || !ok {
				t.Fatalf("raw publish to %s not confirmed: %v", dest, err)
			}
		}
	case Kafka:
		cfg := b.saramaConfig()
		cfg.Producer.Return.Successes = true
		cfg.Producer.RequiredAcks = sarama.WaitForAll
		cfg.Producer.Partitioner = sarama.NewManualPartitioner
		p, err := sarama.NewSyncProducer(b.Brokers, cfg)
		if err != nil {
			t.Fatalf("kafka producer: %v", err)
		}
		defer p.Close()
		for _, m := range msgs {
			pm := &sarama.ProducerMessage{Topic: dest, Value: sarama.ByteEncoder(m.Body), Partition: m.Partition}
			for k, v := range m.KafkaHeaders {
				pm.Headers = append(pm.Headers, sarama.RecordHeader{Key: []byte(k), Value: v})
			}
			if _, _, err := p.SendMessage(pm); err != nil {
				t.Fatalf("raw produce to %s: %v", dest, err)
			}
		}
	}
}

// ReadOne reads one message from dest with a new consumer (its own Kafka
// group), acks it and returns it; it fails the test after timeout.
func (b BrokerSpec) ReadOne(t testing.TB, dest string, timeout time.Duration) *message.Message {
	t.Helper()
	sub, err := b.Subscriber("reader-" + watermill.NewShortUUID())
	if err != nil {
		t.Fatalf("subscriber: %v", err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ch, err := sub.Subscribe(ctx, dest)
	if err != nil {
		t.Fatalf("subscribing to %s: %v", dest, err)
	}
	select {
	case m, ok := <-ch:
		if !ok {
			t.Fatalf("subscription to %s closed", dest)
		}
		m.Ack()
		return m
	case <-ctx.Done():
		t.Fatalf("no message on %s within %s", dest, timeout)
	}
	return nil
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	out := b.String()
	if len(out) > 80 {
		out = out[len(out)-80:]
	}
	return strings.Trim(out, "-")
}

// WaitConsumers waits until n consumers of group share dest: on RabbitMQ n
// consumers on the queue, on Kafka a stable group of n members that all have
// partitions.
func (b BrokerSpec) WaitConsumers(t *testing.T, dest, group string, n int) {
	t.Helper()
	var state string
	ready := func() bool { return false }
	// One connection (or admin client) for all the polls.
	switch b.Kind {
	case Rabbit:
		conn, err := amqp.Dial(b.AMQPURL)
		if err != nil {
			t.Fatalf("connecting to RabbitMQ: %v", err)
		}
		defer conn.Close()
		ready = func() bool {
			// A channel per poll: a failed passive declare closes it.
			ch, err := conn.Channel()
			if err != nil {
				state = err.Error()
				return false
			}
			defer ch.Close()
			q, err := ch.QueueDeclarePassive(dest, true, false, false, false, nil)
			if err != nil {
				state = err.Error()
				return false
			}
			state = fmt.Sprintf("%d consumers", q.Consumers)
			return q.Consumers >= n
		}
	case Kafka:
		var admin sarama.ClusterAdmin
		defer func() {
			if admin != nil {
				_ = admin.Close()
			}
		}()
		ready = func() bool {
			if admin == nil {
				a, err := sarama.NewClusterAdmin(b.Brokers, b.saramaConfig())
				if err != nil {
					state = err.Error()
					return false
				}
				admin = a
			}
			gs, err := admin.DescribeConsumerGroups([]string{group})
			if err != nil || len(gs) != 1 {
				state = fmt.Sprint(err)
				return false
			}
			g := gs[0]
			assigned := 0
			for _, m := range g.Members {
				if len(m.MemberAssignment) > 0 {
					if a, err := m.GetMemberAssignment(); err == nil && len(a.Topics[dest]) > 0 {
						assigned++
					}
				}
			}
			state = fmt.Sprintf("group %s with %d members, %d assigned", g.State, len(g.Members), assigned)
			return g.State == "Stable" && len(g.Members) == n && assigned == n
		}
	}
	waitFor(t, 60*time.Second, fmt.Sprintf("%d consumers on %s", n, dest), ready, func() string { return state })
}

// Collector reads every message of a destination (its own Kafka group, from
// the oldest offset) and acks it, until the test ends.
type Collector struct {
	mu   sync.Mutex
	msgs []*message.Message
}

// Collect starts a Collector on dest.
func (b BrokerSpec) Collect(t testing.TB, dest string) *Collector {
	t.Helper()
	sub, err := b.Subscriber("collector-" + watermill.NewShortUUID())
	if err != nil {
		t.Fatalf("subscriber: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := sub.Subscribe(ctx, dest)
	if err != nil {
		cancel()
		_ = sub.Close()
		t.Fatalf("subscribing to %s: %v", dest, err)
	}
	c := &Collector{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ch {
			m.Ack()
			c.mu.Lock()
			c.msgs = append(c.msgs, m)
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = sub.Close()
		<-done
	})
	return c
}

// Messages returns the messages read so far, in order.
func (c *Collector) Messages() []*message.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.msgs)
}
