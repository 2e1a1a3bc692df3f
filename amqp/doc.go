// Package inboxamqp is the inbox's RabbitMQ integration, for
// watermill-amqp/v2 (or any AMQP 0-9-1 broker): it keys messages by their
// AMQP message-id property, makes watermill-amqp accept deliveries whose
// headers are not all strings, and holds failed attempts' backoffs in
// RabbitMQ delay queues ([Delays]).
//
// # Why a marshaler
//
// watermill-amqp's [amqp.DefaultMarshaler] turns every AMQP header into a
// metadata string and fails when a header is an int, a bool, a byte array, a
// timestamp or a nested table, as other clients (Java, Python, .NET, the
// RabbitMQ shovel and federation plugins) routinely send. The subscriber
// nacks such a delivery with requeue before any middleware sees it, so
// RabbitMQ hands it straight back: a hot loop that never reaches the
// handler, the inbox or a poison queue (TestDefaultMarshaler_requeues_non_string_headers_in_a_loop
// shows it). It also drops the delivery's message-id property, the id AMQP
// producers set for exactly this purpose.
//
// [Marshaler] wraps DefaultMarshaler: it turns every header value into a
// string (see "Header values" below) instead of failing, and copies the
// message-id property into the metadata field [DefaultMessageIDKey]
// ("amqp_message_id"), which [FromMessageID] reads:
//
//	amqpConfig := amqp.NewDurableQueueConfig(uri)
//	amqpConfig.Marshaler = inboxamqp.Marshaler{}
//	...
//	inboxmw.Config{
//		...
//		IDSources: []keying.IDSource{
//			keying.FromMetadata(keying.DefaultIDMetadataKey), // IdempotencyKey
//			inboxamqp.FromMessageID(),
//			keying.FromUUID(),
//		},
//	}
//
// Use it on the publishing side too: Marshal sets the message-id property from
// the IdempotencyKey metadata field, else from the Watermill UUID, so that
// consumers that are not Watermill see a stable id as well.
//
// # Header values
//
// Each header value becomes a string, deterministically (the same value
// always gives the same string):
//
//   - string: unchanged.
//   - bool: "true" or "false".
//   - integers (int8 to int64, uint8 to uint64): decimal, e.g. "-42".
//   - float32, float64: the shortest decimal that reads back as the same
//     value (strconv 'g' format, e.g. "1.5", "1e+21"); "NaN", "+Inf", "-Inf".
//   - amqp.Decimal: the exact decimal, e.g. Value 12345, Scale 2: "123.45".
//   - []byte: standard base64 with padding (RFC 4648), as encoding/json
//     writes bytes, so binary values survive and never produce invalid UTF-8.
//   - time.Time: RFC 3339 in UTC, e.g. "2024-05-01T12:00:00Z".
//   - nil (AMQP void): "".
//   - amqp.Table and arrays: compact JSON with keys sorted and HTML
//     characters unescaped, whose leaves follow the rules above (numbers and
//     booleans stay JSON numbers and booleans; bytes, timestamps, decimals
//     and non-finite floats become JSON strings).
//
// The Watermill UUID header ("_watermill_message_uuid" unless configured) is
// converted the same way before DefaultMarshaler reads it.
//
// # Cost
//
// A delivery whose headers are all strings (what Watermill producers send) is
// handed to DefaultMarshaler as it is once the header types are checked, with
// no copy of the headers. A delivery with other header types is copied and
// converted; nested tables, turned into JSON, cost the most.
// BenchmarkUnmarshal compares the two with DefaultMarshaler; BENCHMARKS.md at
// the repository root has what it measured.
//
// # Failed attempts held by RabbitMQ
//
// Without help, a failed attempt's redelivery waits out its backoff inside
// the consumer (inboxmw.Config.Backoff): with a prefetch of one the consumer
// does nothing else meanwhile. [Delays] is an inboxmw.Redeliverer that hands
// the message to RabbitMQ instead: the middleware publishes a copy to a
// delay queue, a durable queue with a message TTL that dead-letters back to
// the consumer's queue through the default exchange, and acks the original
// once RabbitMQ has confirmed the copy; the consumer moves on at once.
//
//	amqpConfig := amqp.NewDurableQueueConfig(uri)
//	amqpConfig.Marshaler = inboxamqp.Marshaler{} // required: dead-lettered copies carry an x-death table header
//	delays, err := inboxamqp.NewDelays(ctx, inboxamqp.DelaysConfig{URI: uri, Queues: []string{"orders"}})
//	if err != nil { ... } // cannot connect, or cannot declare the delay queues: says which
//	defer delays.Close()
//	ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "rabbit", Group: "orders", Redelivery: delays})
//
// RabbitMQ 3.x without plugins: per-message TTLs in one queue expire only at
// its head, so each delay has a queue of its own per consumer queue
// ([DelayQueueName]: "orders.inbox-delay-5s"), declared idempotently by
// [NewDelays] for DelaysConfig.Queues (a setup that cannot declare them, for
// want of permissions or with a wrong vhost, fails there, saying so) or at
// a queue's first hand-off. A wait is rounded up to the next delay of the
// ladder ([DefaultDelays]: 250 ms, 500 ms, 1 s, 2 s, 5 s, 10 s, 20 s, 30 s,
// 1 min), so a copy waits at least its backoff and, from 250 ms to a
// minute, less than 2.5 times it; a longer wait takes the longest delay,
// and the copy, back before its key's backoff has ended, is handed off
// again for the rest. The copy keeps the message's UUID, payload, metadata (the
// IdempotencyKey among them) and headers, plus the inbox's own fields
// (inboxmw.MetadataKey, inboxmw.MetadataAttempts); it is persistent and
// published mandatory, so a delay queue deleted behind the library's back
// is an error, not a silent loss.
//
// Nothing is lost or doubled by the hand-off: the store holds the key's
// backoff and counts its attempts, so a copy that comes back early waits
// only the rest, and MaxAttempts ends in Dead whatever consumer runs the
// attempts. A consumer that dies after the copy was confirmed but before the
// original's ack leaves two deliveries: the original's redelivery finds its
// key waiting and is handed off again, and whichever copy runs first wins;
// the others are acked as duplicates once the key is processed. A hand-off
// that fails (RabbitMQ unreachable, the consumer's queue deleted) returns the
// message to RabbitMQ as an error: it is requeued and its redelivery waits in
// the consumer, as without Delays. A retried message is delivered after
// later messages of its queue.
package inboxamqp
