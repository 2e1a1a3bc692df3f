package inboxamqp

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
)

// TimestampKey is the metadata field that [Marshaler] copies the AMQP
// timestamp property into (RFC 3339, UTC, whole seconds as AMQP carries
// them), and sets the property back from: a message republished from a
// consumed one (a poison queue, a delay queue, a forward) keeps the time
// its producer first sent it. [Timestamp] reads it.
const TimestampKey = "amqp_timestamp"

// Timestamp returns the AMQP timestamp property of a delivery that
// [Marshaler] unmarshaled (from the metadata field [TimestampKey]), or false
// when it had none. It is an inboxmw.TimestampFunc, for the middleware's
// stale check:
//
//	inboxmw.Config{
//		...
//		Timestamp: inboxamqp.Timestamp, // a message older than the store's retention is stale
//	}
//
// RabbitMQ does not stamp messages itself: the property is the producer's.
// Marshal sets it for the messages Watermill publishes through [Marshaler].
func Timestamp(msg *message.Message) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339Nano, msg.Metadata.Get(TimestampKey))
	if err != nil || t.IsZero() {
		return time.Time{}, false
	}
	return t, true
}

// stampDelivery copies a delivery's timestamp property into msg's metadata
// field TimestampKey, or removes the field when the delivery has none, so
// that the field only ever holds the property.
func stampDelivery(msg *message.Message, d amqp091.Delivery) {
	if d.Timestamp.IsZero() {
		delete(msg.Metadata, TimestampKey)
		return
	}
	msg.Metadata.Set(TimestampKey, d.Timestamp.UTC().Format(time.RFC3339Nano))
}

// stampPublishing sets p's timestamp property, unless PostprocessPublishing
// set one: from msg's field TimestampKey (a republished message keeps its
// producer's time), else the time of publishing. The field is never sent
// as a header.
func stampPublishing(p *amqp091.Publishing, msg *message.Message) {
	delete(p.Headers, TimestampKey)
	if !p.Timestamp.IsZero() {
		return
	}
	if t, ok := Timestamp(msg); ok {
		p.Timestamp = t
		return
	}
	p.Timestamp = time.Now().UTC().Truncate(time.Second)
}
