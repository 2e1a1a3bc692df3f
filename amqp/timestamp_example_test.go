package inboxamqp_test

import (
	"fmt"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-inbox/inbox/amqp"
)

// Marshaler copies a delivery's timestamp property into the metadata, where
// Timestamp (an inboxmw.TimestampFunc, for Config.Timestamp) reads it, and
// sets it back when the message is published again.
func ExampleTimestamp() {
	var m inboxamqp.Marshaler
	msg, err := m.Unmarshal(amqp091.Delivery{Timestamp: time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC), Body: []byte("{}")})
	if err != nil {
		panic(err)
	}
	ts, ok := inboxamqp.Timestamp(msg)
	fmt.Println(ts, ok)

	again, err := m.Marshal(msg) // a poison queue's copy, a forward
	if err != nil {
		panic(err)
	}
	fmt.Println(again.Timestamp)
	// Output:
	// 2024-05-01 12:00:00 +0000 UTC true
	// 2024-05-01 12:00:00 +0000 UTC
}
