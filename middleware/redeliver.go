package inboxmw

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
)

// Redeliverer hands a message back to its broker, to be delivered to the
// same handler again once a delay has passed: the broker, not the consumer,
// then holds a failed attempt's backoff ([Config.Redelivery]). Package
// inboxamqp (RabbitMQ delay queues that dead-letter back to the queue) and
// package inboxkafka (retry topics) implement it.
type Redeliverer interface {
	// Redeliver publishes msg, a copy the middleware made of a message
	// consumed from topic (the topic the router's handler subscribed to,
	// [message.SubscribeTopicFromCtx]), so that the broker delivers it to
	// the same queue or consumer group again after delay, rounded up to a
	// delay the broker holds (an implementation with a longest delay uses it
	// for longer waits: the copy then comes back early and is handed off
	// again for the rest). It returns nil only once the broker holds the
	// copy (a publisher confirm, an acknowledged produce): the middleware
	// then acks the original. An error leaves the original to the broker's
	// own redelivery.
	//
	// The copy keeps the original's UUID, payload and metadata, plus
	// [MetadataKey] and [MetadataAttempts]; the implementation must carry
	// them all. It is the middleware's own: the implementation may change
	// it and need not copy it again. A copy that arrives twice, or while its key still waits, is
	// harmless: the store decides when the key runs again and drops copies
	// of a processed key.
	Redeliver(ctx context.Context, topic string, msg *message.Message, delay time.Duration) error
}

// Metadata fields of the copies handed to a [Redeliverer].
const (
	// MetadataKey holds the inbox key of the message the copy was made of.
	// A message carrying it is keyed by it, provided its bus, group and
	// alias are this inbox's (else it is keyed as usual): a copy keeps its
	// key even when the id came from where the broker put the original (a
	// Kafka offset, an AMQP property). Like the IdempotencyKey field, it is
	// trusted: a producer that sets it chooses the message's id.
	MetadataKey = "inbox_key"

	// MetadataAttempts counts the failed attempts behind the copy (decimal),
	// for the transactional mode, whose store counts none: its backoff is
	// Config.Backoff of this count.
	MetadataAttempts = "inbox_attempts"

	// MetadataOrderKey holds the order key the copy's message had in the
	// store (Config.OrderKey, scoped to the inbox key's bus, group and
	// alias), so that a copy keeps its place whatever the broker does to
	// the original's record key or headers. Read only with a MetadataKey
	// that is this inbox's.
	MetadataOrderKey = "inbox_order_key"

	// MetadataBehind counts the hand-offs of a copy that waited behind an
	// earlier message of its order key (decimal).
	MetadataBehind = "inbox_behind"

	// MetadataBehindSince holds when the message was first handed off to
	// wait behind an earlier message of its order key (Unix milliseconds):
	// the longer it has waited, the longer each hand-off (behindDelay).
	MetadataBehindSince = "inbox_behind_since"
)

// behindDelay is how long a message that waits behind an earlier one of
// its order key is handed off for: what the earlier one's backoff has
// left (left), so that it comes back about when its turn may come; at
// least RedeliveryMinDelay, and at least a quarter of the time it has
// waited behind so far (MetadataBehindSince), at most behindMaxDelay. A
// message whose turn comes soon (the one ahead is processed, or on its way
// back) comes back at the broker's shortest delay; one behind a dead
// message (which waits for an operator) comes back less and less often:
// after a minute of waiting, every 15 s.
//
// A count of hand-offs instead (from the fourth on, Config.Backoff of the
// count) was measured first: the messages of a key that come back from
// the broker's delay out of their order (retry topics deliver copies
// concurrently) are handed off again one after the other, and a count
// grew to 15 hand-offs of one message, some waiting a minute each while
// nothing was dead.
func (m *msgCall) behindDelay(left time.Duration) time.Duration {
	d := max(left, m.ib.cfg.RedeliveryMinDelay)
	if ms, err := strconv.ParseInt(m.msg.Metadata.Get(MetadataBehindSince), 10, 64); err == nil {
		if waited := time.Since(time.UnixMilli(ms)); waited > 0 {
			d = max(d, min(waited/4, behindMaxDelay))
		}
	}
	return d
}

// behindMaxDelay bounds what behindDelay adds for the time waited: a
// message behind a dead one comes back at least once a minute, and runs
// at most a minute after an operator lets the dead one go.
const behindMaxDelay = time.Minute

// DefaultRedeliveryMinDelay is the default of Config.RedeliveryMinDelay:
// every failed attempt with a backoff of a millisecond or more is handed
// off. A shorter wait costs a consumer less than a hand-off (a publish and
// the broker's confirm); a longer one held in-process blocks its consumer
// or partition for that long, and on Kafka for watermill-kafka's
// NackResendSleep (100 ms by default) besides. A handed-off copy waits at
// least the Redeliverer's shortest delay (250 ms for inboxamqp's and
// inboxkafka's default ladders).
const DefaultRedeliveryMinDelay = time.Millisecond

// keyOf returns msg's inbox key: the one a copy carries (MetadataKey), when
// its bus, group and alias are this inbox's, else the one its id sources
// give.
func (ib *Inbox) keyOf(msg *message.Message) (string, error) {
	if carried := msg.Metadata.Get(MetadataKey); carried != "" {
		if k, err := keying.Parse(carried); err == nil && k.Bus == ib.cfg.Bus && k.Group == ib.cfg.Group {
			if alias, err := ib.cfg.Alias(msg); err == nil && alias == k.Alias {
				return carried, nil
			}
		}
	}
	key, _, err := ib.keys.KeyString(msg)
	return key, err
}

// orderOf returns the order key of msg, whose inbox key is key, as the
// store gets it: "" without Config.OrderKey or when it gives none; the one
// a copy carries (MetadataOrderKey) when it is scoped as key is; else
// Config.OrderKey's, scoped by key's bus, group and alias (the part of key
// before its id), as a hash (keying.HashID) when it could not be a key's
// id.
func (ib *Inbox) orderOf(msg *message.Message, key string) (string, error) {
	if ib.cfg.OrderKey == nil || key == "" {
		return "", nil
	}
	scope := key[:scopeLen(key)]
	if carried := msg.Metadata.Get(MetadataOrderKey); carried != "" && msg.Metadata.Get(MetadataKey) == key &&
		len(carried) > len(scope) && carried[:len(scope)] == scope {
		return carried, nil
	}
	id, err := ib.cfg.OrderKey(msg)
	if err != nil {
		return "", fmt.Errorf("inbox middleware: Config.OrderKey: %w", err)
	}
	if id == "" {
		return "", nil
	}
	if !utf8.ValidString(id) || strings.IndexByte(id, 0) >= 0 || len(scope)+len(id) > inbox.MaxKeyLen {
		id = keying.HashID(id)
	}
	return scope + id, nil
}

// scopeLen is the length of key's bus, group and alias with the colon
// after them: bus, group and alias hold no raw colon (keying escapes
// them), so the third colon ends them.
func scopeLen(key string) int {
	n := 0
	for i := 0; i < len(key); i++ {
		if key[i] == ':' {
			if n++; n == 3 {
				return i + 1
			}
		}
	}
	return len(key)
}

// redeliverable reports whether a wait of d goes to Config.Redelivery: one
// is configured, d is at least RedeliveryMinDelay, and the message came
// through a router (its topic is known).
func (m *msgCall) redeliverable(d time.Duration) bool {
	return m.ib.cfg.Redelivery != nil && d >= m.ib.cfg.RedeliveryMinDelay &&
		message.SubscribeTopicFromCtx(m.msg.Context()) != ""
}

// redeliver hands a copy of the message to Config.Redelivery, to come back
// after delay, and returns nil once the broker holds it: the caller then
// returns nil, so the router acks the original. cause is the handler's
// error when this attempt failed, nil for a delivery that found its key
// waiting out a backoff. attempts is the key's count of failed attempts
// carried by the copy (MetadataAttempts).
func (m *msgCall) redeliver(delay time.Duration, attempts int, cause error) error {
	ib := m.ib
	topic := message.SubscribeTopicFromCtx(m.msg.Context())
	cp := m.msg.Copy()
	if m.key != "" {
		cp.Metadata.Set(MetadataKey, m.key)
	}
	cp.Metadata.Set(MetadataAttempts, strconv.Itoa(attempts))
	if m.order != "" {
		cp.Metadata.Set(MetadataOrderKey, m.order)
	}
	if m.behind {
		n, _ := strconv.Atoi(m.msg.Metadata.Get(MetadataBehind))
		cp.Metadata.Set(MetadataBehind, strconv.Itoa(n+1))
		if cp.Metadata.Get(MetadataBehindSince) == "" {
			cp.Metadata.Set(MetadataBehindSince, strconv.FormatInt(time.Now().UnixMilli(), 10))
		}
	} else {
		delete(cp.Metadata, MetadataBehindSince) // its own failure: a wait behind starts anew
	}
	base := context.WithoutCancel(m.msg.Context()) // acked (InstantAck) or not, the hand-off must finish
	ctx, cancel := context.WithTimeout(base, ib.cfg.StoreTimeout)
	start := time.Now()
	err := ib.cfg.Redelivery.Redeliver(ctx, topic, cp, delay)
	cancel()
	ib.reportCall(base, OpRedeliver, m.key, m.attempts, start, err)
	fields := m.fields().Add(watermill.LogFields{"topic": topic, "retry_after": delay.String(), "attempts": attempts})
	if err != nil {
		ib.m.Outcome(m.handler, OutcomeRedeliveryFailed)
		ib.handOff.Fail("Inbox could not hand the message to the broker's redelivery; it goes back to the broker, and its redelivery waits in-process",
			err, fields)
		return err
	}
	ib.handOff.OK()
	if cause != nil {
		ib.m.Outcome(m.handler, OutcomeRedelivered)
		ib.log.Error("Handler failed; the message is handed to the broker, which delivers it again after the backoff", cause, fields)
	} else if m.behind {
		m.report(OutcomeBehind)
		ib.log.Debug("Inbox key waits behind an earlier message of its order key; the message is handed to the broker until its turn may come", fields)
	} else {
		m.report(OutcomeRedelivered)
		ib.log.Debug("Inbox key is waiting out a failed attempt's backoff; the message is handed to the broker for the rest", fields)
	}
	return nil
}

// attemptsOf returns the failed attempts a copy carries (MetadataAttempts),
// 0 for a message that is not a copy.
func attemptsOf(msg *message.Message) int {
	n, err := strconv.Atoi(msg.Metadata.Get(MetadataAttempts))
	if err != nil || n < 0 {
		return 0
	}
	return n
}
