// Package inboxkafka is the inbox's Kafka package (watermill-kafka/v3,
// sarama): keys from a record's position in the log ([FromOffset]), and
// retry topics that hold a failed attempt's backoff in Kafka ([Retry]).
//
// This package imports watermill-kafka (and so sarama); the core packages of
// the inbox do not.
//
// # Keys from offsets
//
// [FromOffset] keys Watermill messages consumed from Kafka by their position
// in the log: "topic/partition/offset". It is an opt-in fallback for
// messages that carry no id of their own (no IdempotencyKey header and no
// Watermill UUID, e.g. records written by a producer that is not Watermill).
// Put it after the ids the producer chose:
//
//	inboxmw.Config{
//		...
//		IDSources: append(keying.DefaultIDSources(), inboxkafka.FromOffset()),
//	}
//
// An offset identifies a delivery position, not a message: it deduplicates
// redeliveries of the same record (a consumer that crashed before committing
// its offset, a rebalance, a nacked message that watermill-kafka resends),
// but a producer that retries a send writes a new record at a new offset,
// which is a new key. Only an id chosen by the producer deduplicates producer
// retries. Keys built from offsets are also tied to the topic: a topic that is
// deleted and created again restarts its offsets at 0 and would collide with
// the old keys within the store's retention; use a new bus or group name then.
//
// The partition and offset are those watermill-kafka's subscriber puts in the
// message context ([kafka.MessagePartitionFromCtx],
// [kafka.MessagePartitionOffsetFromCtx]); the topic is the one the router
// subscribed to ([message.SubscribeTopicFromCtx]). Kafka topic names hold
// only ASCII letters, digits, '.', '_' and '-', so the '/' separators are
// unambiguous.
//
// # Retry topics
//
// Without redelivery, a failed attempt's backoff (the time the store keeps
// the key unclaimable) is waited out in the consumer: watermill-kafka
// resends the nacked message in-process, and its partition waits with it.
// [Retry] moves that wait into Kafka, in the manner of Spring Kafka's
// non-blocking retries: the middleware hands a copy of the message to a
// retry topic, acks the original once Kafka has the copy, and the partition
// moves on at once; the copy comes back to the same handler when its delay
// has passed. The store still counts the attempts and decides when the key
// may run again, so MaxAttempts and Dead work as before, whichever consumer
// runs the attempt, and a copy that arrives twice is dropped by its key.
//
// The wiring: create the Retry, wrap the main subscriber with
// [Retry.Subscriber], and pass the Retry as inboxmw.Config.Redelivery:
//
//	retry, err := inboxkafka.NewRetry(ctx, inboxkafka.RetryConfig{
//		Brokers:       brokers,
//		ConsumerGroup: "billing", // the subscriber's consumer group
//		Topics:        []string{"orders"},
//		SaramaConfig:  saramaConfig,
//	})
//	...
//	defer retry.Close()
//	ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "kafka", Group: "billing", Redelivery: retry})
//	...
//	router.AddMiddleware(ib.Middleware)
//	router.AddConsumerHandler("charge", "orders", retry.Subscriber(subscriber), handler)
//
// Close the router first (it closes the wrapped subscriber, and with it the
// main one), then the inbox, then the Retry.
//
// Topics and groups. For each main topic of RetryConfig.Topics and each
// delay of the ladder (RetryConfig.Delays), [NewRetry] creates a retry topic
// through the admin API unless it exists, named by RetryConfig.TopicName
// ([DefaultTopicName]: "orders.billing.retry-250ms"), with one partition
// and the main topic's replication factor unless RetryConfig.Partitions and
// ReplicationFactor say otherwise (the default ladder has 9 delays: 9
// topics per main topic and consumer group). The
// retry topics belong to one consumer group: two groups on one topic retry
// their own failures. They are consumed in a consumer group of their own,
// "billing.retry" (RetryConfig.RetryConsumerGroup), so consumers joining and
// leaving them do not rebalance the main group. A setup that cannot reach
// the brokers, create or describe a topic, or describe the retry group fails
// in NewRetry with an error that says which; a missing permission to write
// or read the retry topics shows at the first hand-off (the middleware then
// falls back to the in-process wait) or in the subscriber's logs.
//
// The ladder. A retry topic holds one delay, since Kafka cannot deliver a
// record later than the ones behind it. A copy goes to the shortest delay
// that is at least the wait the middleware asks for, so it waits up to the
// next delay of the ladder (the default, 250 ms, 500 ms, 1 s, 2 s, 5 s,
// 10 s, 20 s, 30 s, 1 min, waits less than 2.5 times what was asked, from
// 250 ms up). A
// wait longer than the longest delay takes the longest: the copy then comes
// back before its key's backoff has ended, and the middleware hands it off
// again for the remainder. A copy carries its due time in the [DueHeader]
// header (the producer's clock; a consumer holds a copy at most its topic's
// delay, whatever the clocks say); the header is removed from the message's
// metadata on the way back.
//
// Holding. The subscriber of [Retry.Subscriber] holds a retry message until
// it is due, and meanwhile its retry topic's partition waits (as Spring
// pauses it): the copies of one retry topic share a delay, so the first is
// due first. The main topic's partitions and the other retry topics move
// on. Unlike a main topic's partition, a retry topic's partition does not
// wait for a message's ack before it sends the next one: it sends its due
// messages as they come, up to RetryConfig.Concurrency of them at once (the
// router handles each in a goroutine of its own), and commits its offset up
// to its first message not yet acked. A rebalance or Close lets a held or
// unacked message go without acking it: the partition's next owner reads it
// again, with the acked messages behind it that were not yet committed
// (their keys are processed: the inbox drops them), and holds it until the
// same due time.
//
// Order. A retried message is handled after the messages that followed it
// in its partition: per-key order is lost for it (as with Spring's retry
// topics), and the retried messages of one retry topic run concurrently, in
// no order. Where a key's messages must be handled in order, leave
// inboxmw.Config.Redelivery unset: a failed message's redelivery then waits
// its backoff in the consumer, and its partition with it.
//
// Retention. A copy is the message's only copy once the original is acked,
// so retry topics need what the main topics need: a retention longer than
// the longest delay plus the longest time the consumers may be down
// (Kafka's default of 7 days is plenty; a retention of minutes would lose
// copies), and a replication factor and min.insync.replicas that survive a
// broker's loss (RetryConfig.RequiredAcks defaults to all in-sync
// replicas). The inbox store's retention must likewise outlast them.
//
// A retry message's context carries no watermill-kafka partition, offset
// or key (they would be the retry topic's, so [FromOffset] yields none for
// it): the copy is keyed by its inboxmw.MetadataKey metadata.
package inboxkafka

import (
	"strconv"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/keying"
)

// SourceName is the name of the [keying.IDSource] that [FromOffset] returns,
// as it appears in logs and metrics.
const SourceName = "kafka-offset"

// FromOffset returns a [keying.IDSource] named [SourceName] that yields
// "topic/partition/offset" for a message consumed by a watermill-kafka
// subscriber inside a [message.Router], e.g. "orders/3/1207".
//
// It yields "" (no id: the builder asks the next source) when any of the
// three is missing from the message context: a message built by hand, or one
// consumed outside a router (the router sets the topic).
func FromOffset() keying.IDSource { return offsetSource{} }

type offsetSource struct{}

func (offsetSource) Name() string { return SourceName }

func (offsetSource) ID(msg *message.Message) (string, error) {
	ctx := msg.Context()
	topic := message.SubscribeTopicFromCtx(ctx)
	if topic == "" {
		return "", nil
	}
	partition, ok := kafka.MessagePartitionFromCtx(ctx)
	if !ok {
		return "", nil
	}
	offset, ok := kafka.MessagePartitionOffsetFromCtx(ctx)
	if !ok {
		return "", nil
	}
	b := make([]byte, 0, len(topic)+2+11+20)
	b = append(b, topic...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(partition), 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, offset, 10)
	return string(b), nil
}
