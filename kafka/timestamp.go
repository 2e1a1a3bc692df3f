package inboxkafka

import (
	"time"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Timestamp returns the timestamp of the Kafka record msg was consumed
// from, as watermill-kafka's subscriber puts it in the message context
// ([kafka.MessageTimestampFromCtx]): the producer's create time, or the
// broker's append time on a topic with message.timestamp.type=LogAppendTime.
// It is an inboxmw.TimestampFunc, for the middleware's stale check:
//
//	inboxmw.Config{
//		...
//		Timestamp: inboxkafka.Timestamp, // a record older than the store's retention is stale
//	}
//
// It returns false for a message that was not consumed by a watermill-kafka
// subscriber, and for a record without a timestamp (the pre-0.10 message
// format writes -1).
func Timestamp(msg *message.Message) (time.Time, bool) {
	ts, ok := kafka.MessageTimestampFromCtx(msg.Context())
	if !ok || ts.IsZero() || ts.UnixMilli() <= 0 {
		return time.Time{}, false
	}
	return ts, true
}
