// Package kafkakey keys Watermill messages consumed from Kafka by their
// position in the log: "topic/partition/offset".
//
// It is an opt-in fallback for messages that carry no id of their own (no
// IdempotencyKey header and no Watermill UUID, e.g. records written by a
// producer that is not Watermill). Put it after the ids the producer chose:
//
//	inboxmw.Config{
//		...
//		IDSources: append(keying.DefaultIDSources(), kafkakey.FromOffset()),
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
// This package imports watermill-kafka (and so sarama); the core packages of
// the inbox do not.
package kafkakey

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
