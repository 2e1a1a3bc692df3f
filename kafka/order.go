package inboxkafka

import (
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// OrderByRecordKey returns the key of the Kafka record msg was consumed
// from, as watermill-kafka's subscriber puts it in the message context
// ([kafka.MessageKeyFromCtx]). It is an order key for the middleware
// (inboxmw.Config.OrderKey): Kafka's producers send the records of one
// key to one partition, in order, and with it the inbox keeps that order
// when one of them fails and its retry waits in a retry topic. A record
// without a key, and a message not consumed by a watermill-kafka
// subscriber, have no order key (""). A copy handed back by [Retry]
// carries the order key its original had.
func OrderByRecordKey(msg *message.Message) (string, error) {
	key, _ := kafka.MessageKeyFromCtx(msg.Context())
	return string(key), nil
}
