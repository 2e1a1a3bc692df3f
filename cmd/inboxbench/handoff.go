package main

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	inboxmw "github.com/watermill-inbox/inbox/middleware"
)

// The hand-off floor of the failures section: the broker's
// hand-off of a failed attempt without the inbox. It runs the same router
// and handler as the inbox's variants, with no store: when the handler
// fails, it hands a copy of the message to the same Redeliverer the inbox
// uses (RabbitMQ's delay queues, Kafka's retry topics), with the same
// backoff, waits until the broker holds it (the same publisher confirm or
// acknowledged produce), and acks the original; the copy runs the handler
// again when it comes back. What the inbox adds to a failed attempt beyond
// that (its Fail, the copy's claim, the waits the store imposes) is the
// difference between the two.

// floorBaseline is the hand-off floor's variant without failures, its
// variants' baseline.
const floorBaseline = "floor-no-failures"

// baselineOf is the variant whose trial of the same repetition variant v's
// ratios are taken against.
func baselineOf(v failureVariant) string {
	if v.floor {
		return floorBaseline
	}
	return failuresBaseline
}

// handOffFloor is the hand-off floor's middleware, in place of the inbox.
type handOffFloor struct {
	redelivery inboxmw.Redeliverer
	backoff    func(attempt int) time.Duration
	metrics    *countingMetrics

	mu    sync.Mutex
	fails map[string][]inbox.FailOptions // by message UUID: each hand-off's delay, for the waits' check
}

// middleware runs the handler; on an error it hands a copy to the broker
// and acks the original once the broker holds it, or returns the error
// (the broker redelivers the original) when the hand-off failed.
func (f *handOffFloor) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err == nil {
			return out, nil
		}
		// As the middleware does: the copy carries the failed attempts
		// behind it, and waits the backoff of their count.
		attempts := 1
		if n, aerr := strconv.Atoi(msg.Metadata.Get(inboxmw.MetadataAttempts)); aerr == nil && n > 0 {
			attempts = n + 1
		}
		delay := f.backoff(attempts)
		cp := msg.Copy()
		cp.Metadata.Set(inboxmw.MetadataAttempts, strconv.Itoa(attempts))
		ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), inboxmw.DefaultStoreTimeout)
		defer cancel()
		start := time.Now()
		herr := f.redelivery.Redeliver(ctx, message.SubscribeTopicFromCtx(msg.Context()), cp, delay)
		f.metrics.StoreCall(inboxmw.OpRedeliver, time.Since(start), herr)
		if herr != nil {
			f.metrics.Outcome("", inboxmw.OutcomeRedeliveryFailed)
			return nil, errors.Join(err, herr)
		}
		f.metrics.Outcome("", inboxmw.OutcomeRedelivered)
		f.mu.Lock()
		f.fails[msg.UUID] = append(f.fails[msg.UUID], inbox.FailOptions{RetryAfter: delay})
		f.mu.Unlock()
		return nil, nil
	}
}
