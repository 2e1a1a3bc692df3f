package inboxamqp_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/amqp"
	"github.com/watermill-inbox/inbox/keying"
)

func TestHeaderString_converts_every_amqp_field_type(t *testing.T) {
	t.Parallel()
	at := time.Date(2024, 5, 1, 14, 0, 0, 0, time.FixedZone("CEST", 2*3600))
	for _, tc := range []struct {
		name string
		in   any
		want string
	}{
		{"string", "abc", "abc"},
		{"empty string", "", ""},
		{"void", nil, ""},
		{"true", true, "true"},
		{"false", false, "false"},
		{"int8", int8(-8), "-8"},
		{"uint8", uint8(200), "200"},
		{"int16", int16(-300), "-300"},
		{"uint16", uint16(65000), "65000"},
		{"int32", int32(-70000), "-70000"},
		{"uint32", uint32(4000000000), "4000000000"},
		{"int64", int64(math.MinInt64), "-9223372036854775808"},
		{"uint64", uint64(math.MaxUint64), "18446744073709551615"},
		{"int", 42, "42"},
		{"float32", float32(1.1), "1.1"},
		{"float64", 0.1, "0.1"},
		{"float64 large", 1e21, "1e+21"},
		{"NaN", math.NaN(), "NaN"},
		{"+Inf", math.Inf(1), "+Inf"},
		{"-Inf", float32(math.Inf(-1)), "-Inf"},
		{"decimal", amqp091.Decimal{Scale: 2, Value: 12345}, "123.45"},
		{"negative decimal", amqp091.Decimal{Scale: 3, Value: -5}, "-0.005"},
		{"decimal scale 0", amqp091.Decimal{Scale: 0, Value: 7}, "7"},
		{"bytes", []byte{0xde, 0xad, 0xbe, 0xef}, "3q2+7w=="},
		{"invalid UTF-8 bytes", []byte{0xff}, "/w=="},
		{"empty bytes", []byte{}, ""},
		{"timestamp", at, "2024-05-01T12:00:00Z"},
		{"empty table", amqp091.Table{}, "{}"},
		{"table", amqp091.Table{
			"z": int64(1), "a": "<b>&", "bytes": []byte("hi"), "f": 2.5, "nan": math.NaN(),
			"nested": amqp091.Table{"ok": true, "void": nil},
			"list":   []any{int16(2), "x", amqp091.Decimal{Scale: 1, Value: 15}, at},
		}, `{"a":"<b>&","bytes":"aGk=","f":2.5,"list":[2,"x","1.5","2024-05-01T12:00:00Z"],"nan":"NaN","nested":{"ok":true,"void":null},"z":1}`},
		{"array", []any{true, nil, float32(0.5)}, `[true,null,0.5]`},
	} {
		got, err := inboxamqp.HeaderString(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("%s: HeaderString(%#v) = %q, %v; want %q", tc.name, tc.in, got, err, tc.want)
		}
	}
}

func TestHeaderString_rejects_types_amqp_has_no_field_for(t *testing.T) {
	t.Parallel()
	for _, in := range []any{struct{}{}, amqp091.Table{"x": []any{complex(1, 2)}}, map[string]any{}} {
		_, err := inboxamqp.HeaderString(in)
		if !errors.Is(err, inbox.ErrInvalidArgument) {
			t.Errorf("HeaderString(%#v) error %v, want one wrapping inbox.ErrInvalidArgument", in, err)
		}
	}
	_, err := inboxamqp.HeaderString(amqp091.Table{"outer": amqp091.Table{"inner": struct{}{}}})
	if err == nil || !strings.Contains(err.Error(), `table field "outer": table field "inner"`) {
		t.Errorf("error %v does not name the path to the bad value", err)
	}
}

// mixedHeaders are what other AMQP clients send: none of them is a string
// except the Watermill UUID, which a Java producer may send as bytes.
func mixedHeaders() amqp091.Table {
	return amqp091.Table{
		"retries":                        int32(3),
		"urgent":                         true,
		"signature":                      []byte{0xde, 0xad},
		"trace":                          amqp091.Table{"span": int64(7), "tags": []any{"a", int16(2)}},
		"sent_at":                        time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC),
		"nothing":                        nil,
		"plain":                          "text",
		amqp.DefaultMessageUUIDHeaderKey: []byte("uuid-1"),
	}
}

func TestMarshaler_Unmarshal_turns_headers_into_strings(t *testing.T) {
	t.Parallel()
	headers := mixedHeaders()
	d := amqp091.Delivery{Headers: headers, MessageId: "order-42", Body: []byte("payload")}

	if _, err := (amqp.DefaultMarshaler{}).Unmarshal(d); err == nil {
		t.Fatal("watermill-amqp's DefaultMarshaler accepted non-string headers: the premise of this package changed")
	}

	msg, err := inboxamqp.Marshaler{}.Unmarshal(d)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"retries":         "3",
		"urgent":          "true",
		"signature":       "3q0=",
		"trace":           `{"span":7,"tags":["a",2]}`,
		"sent_at":         "2024-05-01T12:00:00Z",
		"nothing":         "",
		"plain":           "text",
		"amqp_message_id": "order-42",
	}
	if len(msg.Metadata) != len(want) {
		t.Errorf("metadata %v, want %v", msg.Metadata, want)
	}
	for k, v := range want {
		if got, ok := msg.Metadata[k]; !ok || got != v {
			t.Errorf("metadata[%q] = %q (present %v), want %q", k, got, ok, v)
		}
	}
	if msg.UUID != "dXVpZC0x" {
		// The UUID header is converted by the same rules (bytes are base64).
		t.Errorf("UUID = %q, want the base64 of the bytes header, %q", msg.UUID, "dXVpZC0x")
	}
	if string(msg.Payload) != "payload" {
		t.Errorf("payload = %q", msg.Payload)
	}
	if _, isInt := headers["retries"].(int32); !isInt {
		t.Error("Unmarshal modified the delivery's header table")
	}
	if id, _ := inboxamqp.FromMessageID().ID(msg); id != "order-42" {
		t.Errorf("FromMessageID = %q, want order-42", id)
	}
}

func TestMarshaler_Unmarshal_is_deterministic(t *testing.T) {
	t.Parallel()
	first, err := inboxamqp.Marshaler{}.Unmarshal(amqp091.Delivery{Headers: mixedHeaders()})
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		again, err := inboxamqp.Marshaler{}.Unmarshal(amqp091.Delivery{Headers: mixedHeaders()})
		if err != nil {
			t.Fatal(err)
		}
		if !first.Equals(again) {
			t.Fatalf("two unmarshals of one delivery differ: %v and %v", first.Metadata, again.Metadata)
		}
	}
}

func TestMarshaler_Unmarshal_message_id_field_holds_only_the_property(t *testing.T) {
	t.Parallel()
	m := inboxamqp.Marshaler{MessageIDKey: "mid"}
	msg, err := m.Unmarshal(amqp091.Delivery{Headers: amqp091.Table{"mid": "forged"}})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := msg.Metadata["mid"]; ok {
		t.Errorf("a header named like the message-id field survived without a message-id: %q", v)
	}
	msg, err = m.Unmarshal(amqp091.Delivery{Headers: amqp091.Table{"mid": "forged"}, MessageId: "real"})
	if err != nil {
		t.Fatal(err)
	}
	if got := msg.Metadata["mid"]; got != "real" {
		t.Errorf("metadata[mid] = %q, want the property %q", got, "real")
	}
	if _, ok := msg.Metadata[inboxamqp.DefaultMessageIDKey]; ok {
		t.Errorf("the default field %q was set although MessageIDKey is %q", inboxamqp.DefaultMessageIDKey, "mid")
	}
	id, err := keying.FromMetadata("mid").ID(msg)
	if err != nil || id != "real" {
		t.Errorf("FromMetadata(mid) = %q, %v", id, err)
	}
}

func TestMarshaler_Unmarshal_without_headers(t *testing.T) {
	t.Parallel()
	msg, err := inboxamqp.Marshaler{}.Unmarshal(amqp091.Delivery{Body: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if msg.UUID != "" || len(msg.Metadata) != 0 {
		t.Errorf("got UUID %q, metadata %v; want none", msg.UUID, msg.Metadata)
	}
	if id, _ := inboxamqp.FromMessageID().ID(msg); id != "" {
		t.Errorf("FromMessageID = %q without a message-id", id)
	}
}

func TestMarshaler_Marshal_sets_message_id(t *testing.T) {
	t.Parallel()
	withKey := message.NewMessage("uuid-1", []byte("x"))
	withKey.Metadata.Set("IdempotencyKey", "order-1")
	withKey.Metadata.Set(inboxamqp.DefaultMessageIDKey, "stale, from an earlier hop")
	withoutKey := message.NewMessage("uuid-2", nil)
	long := message.NewMessage("uuid-3", nil)
	long.Metadata.Set("IdempotencyKey", strings.Repeat("k", 300))
	custom := message.NewMessage("uuid-4", nil)
	custom.Metadata.Set("IdempotencyKey", "ignored")
	custom.Metadata.Set("OrderID", "o-9")

	for _, tc := range []struct {
		name string
		m    inboxamqp.Marshaler
		msg  *message.Message
		want string
	}{
		{"IdempotencyKey", inboxamqp.Marshaler{}, withKey, "order-1"},
		{"UUID", inboxamqp.Marshaler{}, withoutKey, "uuid-2"},
		{"hashed when over 255 bytes", inboxamqp.Marshaler{}, long, keying.HashID(strings.Repeat("k", 300))},
		{"IDKeys", inboxamqp.Marshaler{IDKeys: []string{"Missing", "OrderID"}}, custom, "o-9"},
		{"PostprocessPublishing wins", inboxamqp.Marshaler{DefaultMarshaler: amqp.DefaultMarshaler{
			PostprocessPublishing: func(p amqp091.Publishing) amqp091.Publishing { p.MessageId = "mine"; return p },
		}}, withKey, "mine"},
	} {
		p, err := tc.m.Marshal(tc.msg)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if p.MessageId != tc.want {
			t.Errorf("%s: MessageId = %q, want %q", tc.name, p.MessageId, tc.want)
		}
		if len(p.MessageId) > inboxamqp.MaxMessageIDLen {
			t.Errorf("%s: MessageId is %d bytes, over the AMQP limit", tc.name, len(p.MessageId))
		}
		if _, ok := p.Headers[inboxamqp.DefaultMessageIDKey]; ok {
			t.Errorf("%s: the message-id metadata field was sent as a header", tc.name)
		}
		if p.Headers[amqp.DefaultMessageUUIDHeaderKey] != tc.msg.UUID || p.DeliveryMode != amqp091.Persistent {
			t.Errorf("%s: the default marshaler's work is missing: %+v", tc.name, p)
		}
	}
}

func TestMarshaler_round_trip(t *testing.T) {
	t.Parallel()
	msg := message.NewMessage("uuid-1", []byte("body"))
	msg.Metadata.Set("IdempotencyKey", "order-1")
	msg.Metadata.Set("tenant", "acme")
	m := inboxamqp.Marshaler{}
	p, err := m.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.Unmarshal(amqp091.Delivery{Headers: p.Headers, Body: p.Body, MessageId: p.MessageId})
	if err != nil {
		t.Fatal(err)
	}
	if got.UUID != "uuid-1" || string(got.Payload) != "body" || got.Metadata["tenant"] != "acme" ||
		got.Metadata["IdempotencyKey"] != "order-1" || got.Metadata[inboxamqp.DefaultMessageIDKey] != "order-1" {
		t.Errorf("round trip gave UUID %q payload %q metadata %v", got.UUID, got.Payload, got.Metadata)
	}
}
