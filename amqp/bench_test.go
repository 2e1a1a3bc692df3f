package inboxamqp_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-inbox/inbox/amqp"
)

// BenchmarkUnmarshal compares the cost of the inboxamqp marshaler with
// watermill-amqp's DefaultMarshaler on a delivery whose headers are all
// strings (what Watermill producers send, and all DefaultMarshaler accepts),
// and measures inboxamqp on a delivery with headers of other types.
func BenchmarkUnmarshal(b *testing.B) {
	strs := amqp091.Table{
		amqp.DefaultMessageUUIDHeaderKey: "0b6c3a8e-6f0e-4f7b-9d1c-3c2b1a0f9e8d",
		"IdempotencyKey":                 "order-42",
		"name":                           "OrderPlaced",
		"tenant":                         "acme",
	}
	d := amqp091.Delivery{Headers: strs, MessageId: "order-42", Body: []byte(`{"order":42}`)}
	b.Run("strings/default", func(b *testing.B) {
		b.ReportAllocs()
		m := amqp.DefaultMarshaler{}
		for b.Loop() {
			if _, err := m.Unmarshal(d); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("strings/inboxamqp", func(b *testing.B) {
		b.ReportAllocs()
		m := inboxamqp.Marshaler{}
		for b.Loop() {
			if _, err := m.Unmarshal(d); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("mixed/inboxamqp", func(b *testing.B) {
		b.ReportAllocs()
		m := inboxamqp.Marshaler{}
		dm := amqp091.Delivery{Headers: mixedHeaders(), MessageId: "order-42", Body: []byte(`{"order":42}`)}
		for b.Loop() {
			if _, err := m.Unmarshal(dm); err != nil {
				b.Fatal(err)
			}
		}
	})
}
