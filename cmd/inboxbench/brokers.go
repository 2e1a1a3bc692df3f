package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"

	inboxamqp "github.com/watermill-inbox/inbox/amqp"
	inboxkafka "github.com/watermill-inbox/inbox/kafka"
	inboxmw "github.com/watermill-inbox/inbox/middleware"
)

// A broker makes, for each trial, a new queue or topic holding n messages
// and the subscribers that will consume it.
type broker interface {
	name() string
	// prepare publishes spec's messages to a new queue or topic for
	// spec.consumers concurrent consumers, and waits until the broker holds
	// them all.
	prepare(ctx context.Context, spec trialSpec) (*trialSetup, error)
	close() error
}

// trialSpec is what one trial's queue or topic holds, and how it is
// consumed.
type trialSpec struct {
	n, consumers int
	// msgs makes the messages for topic; nil: benchMessages(topic, n).
	msgs func(topic string) []*message.Message
	// redelivery sets up the broker's redelivery of failed attempts for the
	// trial (RabbitMQ: inboxamqp.Delays and its delay queues; Kafka:
	// inboxkafka.Retry, its retry topics, and its subscriber around the
	// consumer group's) in trialSetup.redelivery. failures (implied by
	// redelivery) makes RabbitMQ's consumers read with inboxamqp.Marshaler,
	// which a delay queue's dead-lettered copies need.
	redelivery, failures bool
	// route, on Kafka, gives a message its record key and partition; nil:
	// no key, the partitions in turn.
	route func(*message.Message) (key string, partition int32)
}

func (s trialSpec) messages(topic string) []*message.Message {
	if s.msgs != nil {
		return s.msgs(topic)
	}
	return benchMessages(topic, s.n)
}

type trialSetup struct {
	topic string
	group string // the inbox key's group
	// subs are the subscribers, one router handler each; RabbitMQ's are
	// competing consumers on one queue, Kafka's one consumer group member
	// with a partition per consumer.
	subs    []message.Subscriber
	cleanup func()
	// redelivery is the broker's Redeliverer when trialSpec.redelivery
	// asked for one (closed and its queues or topics deleted by cleanup).
	redelivery inboxmw.Redeliverer
}

var trialSeq atomic.Int64

func newName(run string) string {
	return "inboxbench-" + run + "-" + strconv.FormatInt(trialSeq.Add(1), 10)
}

// benchMessages returns n messages with distinct UUIDs and payloads (the
// Deduplicator keys by a hash of the payload).
func benchMessages(topic string, n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(`{"topic":"`+topic+`","order":`+strconv.Itoa(i)+`,"amount_cents":1999}`))
	}
	return msgs
}

// rabbit is RabbitMQ through watermill-amqp with its durable-queue defaults
// (persistent messages, prefetch 1).
type rabbit struct {
	url  string
	run  string
	conn *amqp091.Connection
}

func newRabbit(url, run string) (*rabbit, error) {
	conn, err := amqp091.Dial(url)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: %w", err)
	}
	return &rabbit{url: url, run: run, conn: conn}, nil
}

func (r *rabbit) name() string { return "rabbitmq" }
func (r *rabbit) close() error { return r.conn.Close() }

func (r *rabbit) prepare(ctx context.Context, spec trialSpec) (*trialSetup, error) {
	queue := newName(r.run)
	cfg := amqp.NewDurableQueueConfig(r.url)
	if spec.failures || spec.redelivery {
		cfg.Marshaler = inboxamqp.Marshaler{}
	}
	logger := watermill.NopLogger{}
	sub, err := amqp.NewSubscriber(cfg, logger)
	if err != nil {
		return nil, err
	}
	ts := &trialSetup{topic: queue, group: queue}
	var delays *inboxamqp.Delays
	ts.cleanup = func() {
		_ = sub.Close()
		if delays != nil {
			_ = delays.Close()
		}
		if ch, err := r.conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			if spec.redelivery {
				for _, d := range inboxamqp.DefaultDelays {
					_, _ = ch.QueueDelete(inboxamqp.DelayQueueName(queue, d), false, false, false)
				}
			}
			_ = ch.Close()
		}
	}
	fail := func(err error) (*trialSetup, error) {
		ts.cleanup()
		return nil, err
	}
	if err := sub.SubscribeInitialize(queue); err != nil {
		return fail(err)
	}
	pub, err := amqp.NewPublisher(cfg, logger)
	if err != nil {
		return fail(err)
	}
	msgs := spec.messages(queue)
	n := len(msgs)
	err = pub.Publish(queue, msgs...)
	err = errors.Join(err, pub.Close())
	if err != nil {
		return fail(fmt.Errorf("publishing to %s: %w", queue, err))
	}
	// Publishing is asynchronous: wait until the queue holds every message.
	ch, err := r.conn.Channel()
	if err != nil {
		return fail(err)
	}
	defer ch.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			return fail(err)
		}
		if q.Messages >= n {
			break
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("queue %s holds %d of %d messages after a minute", queue, q.Messages, n))
		}
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	if spec.redelivery {
		if delays, err = inboxamqp.NewDelays(ctx, inboxamqp.DelaysConfig{URI: r.url, Queues: []string{queue}}); err != nil {
			return fail(fmt.Errorf("delay queues of %s: %w", queue, err))
		}
		ts.redelivery = delays
	}
	for range spec.consumers {
		ts.subs = append(ts.subs, sub) // each Subscribe opens a channel of its own
	}
	return ts, nil
}

// kafkaVersion: watermill-kafka's default (1.0) is older than current
// brokers accept; 2.1 works with kfake and Kafka 2.1+.
var kafkaVersion = sarama.V2_1_0_0

// kafkaBroker is Kafka through watermill-kafka: an in-process kfake cluster
// unless brokers are given.
type kafkaBroker struct {
	run string
	// retryPartitions is RetryConfig.Partitions of the trials' retry
	// topics (-failures-retry-partitions).
	retryPartitions int32
	cluster         *kfake.Cluster
	brokers         []string
	admin           sarama.ClusterAdmin
	producer        sarama.SyncProducer
}

func newKafka(brokers []string, run string) (*kafkaBroker, error) {
	k := &kafkaBroker{run: run, brokers: brokers}
	if len(brokers) == 0 {
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return nil, fmt.Errorf("kfake: %w", err)
		}
		k.cluster, k.brokers = c, c.ListenAddrs()
	}
	cfg := sarama.NewConfig()
	cfg.Version = kafkaVersion
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	var err error
	if k.admin, err = sarama.NewClusterAdmin(k.brokers, cfg); err != nil {
		_ = k.close()
		return nil, fmt.Errorf("kafka admin: %w", err)
	}
	if k.producer, err = sarama.NewSyncProducer(k.brokers, cfg); err != nil {
		_ = k.close()
		return nil, fmt.Errorf("kafka producer: %w", err)
	}
	return k, nil
}

func (k *kafkaBroker) name() string { return "kafka" }

func (k *kafkaBroker) close() error {
	var errs []error
	if k.producer != nil {
		errs = append(errs, k.producer.Close())
	}
	if k.admin != nil {
		errs = append(errs, k.admin.Close())
	}
	if k.cluster != nil {
		k.cluster.Close()
	}
	return errors.Join(errs...)
}

// prepare makes a topic with a partition per consumer, spreads n messages
// over them round robin, and returns one consumer-group subscriber: it runs
// a consumer per partition, each handling one message at a time.
func (k *kafkaBroker) prepare(ctx context.Context, spec trialSpec) (*trialSetup, error) {
	consumers := spec.consumers
	topic := newName(k.run)
	if err := k.admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: int32(consumers), ReplicationFactor: 1}, false); err != nil {
		return nil, fmt.Errorf("creating topic %s: %w", topic, err)
	}
	ts := &trialSetup{topic: topic, group: topic + "-group"}
	var sub message.Subscriber
	var retry *inboxkafka.Retry
	ts.cleanup = func() {
		if sub != nil {
			_ = sub.Close()
		}
		if retry != nil {
			_ = retry.Close()
			for _, t := range retry.RetryTopics(topic) {
				_ = k.admin.DeleteTopic(t)
			}
		}
		// kfake deletes a group's state from the group's goroutine while
		// DeleteTopics reads it from another (a data race the race
		// detector reports): on kfake, leave the groups, which go with the
		// cluster at the end of the run.
		if k.cluster == nil {
			_ = k.admin.DeleteConsumerGroup(ts.group)
			if retry != nil {
				_ = k.admin.DeleteConsumerGroup(ts.group + inboxkafka.RetryConsumerGroupSuffix)
			}
		}
		_ = k.admin.DeleteTopic(topic)
	}
	fail := func(err error) (*trialSetup, error) {
		ts.cleanup()
		return nil, err
	}
	msgs := spec.messages(topic)
	batch := make([]*sarama.ProducerMessage, 0, 1000)
	for i, m := range msgs {
		pm, err := kafka.DefaultMarshaler{}.Marshal(topic, m)
		if err != nil {
			return fail(err)
		}
		pm.Partition = int32(i % consumers)
		if spec.route != nil {
			key, part := spec.route(m)
			pm.Key, pm.Partition = sarama.StringEncoder(key), part
		}
		batch = append(batch, pm)
		if len(batch) == cap(batch) || i == len(msgs)-1 {
			if err := k.producer.SendMessages(batch); err != nil {
				return fail(fmt.Errorf("producing to %s: %w", topic, err))
			}
			batch = batch[:0]
		}
	}
	cfg := kafka.DefaultSaramaSubscriberConfig()
	cfg.Version = kafkaVersion
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	s, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               k.brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		ConsumerGroup:         ts.group,
		OverwriteSaramaConfig: cfg,
	}, watermill.NopLogger{})
	if err != nil {
		return fail(err)
	}
	sub = s
	if spec.redelivery {
		rc := sarama.NewConfig()
		rc.Version = kafkaVersion
		retry, err = inboxkafka.NewRetry(ctx, inboxkafka.RetryConfig{Brokers: k.brokers, ConsumerGroup: ts.group, Topics: []string{topic}, SaramaConfig: rc, Partitions: k.retryPartitions})
		if err != nil {
			return fail(fmt.Errorf("retry topics of %s: %w", topic, err))
		}
		sub, ts.redelivery = retry.Subscriber(s), retry
	}
	ts.subs = []message.Subscriber{sub}
	return ts, nil
}
