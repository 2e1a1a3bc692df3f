// Package inboxotel (import path .../inbox/otel) records the inbox
// middleware's steps as OpenTelemetry spans: give [New] a TracerProvider
// and the result to inboxmw.Config.Tracer.
//
//	ib, err := inboxmw.New(inboxmw.Config{..., Tracer: inboxotel.New(otel.GetTracerProvider())})
//
// Each message gets a span inbox.claim, from the start of the middleware to
// the claim's outcome, and a span per store call, named by its op:
// inbox.try_begin (each retry of a failing claim its own; a TxStore's
// BeginTx, a plain inbox.Store's IsProcessed), inbox.extend (each
// heartbeat), inbox.complete (a TxStore's commit and a plain Store's
// MarkProcessed too), inbox.release, inbox.fail and inbox.release_order
// (an order key let go past a dead key, inboxmw.OrderOnDeadSkip); and a
// span inbox.redeliver for each hand-off of the message to
// inboxmw.Config.Redelivery. All are children of the span in the
// message's context (the handler's, when a tracing middleware of
// Watermill's runs outside the inbox). Each carries inbox.key, the key's
// scope (inbox.bus, inbox.group, inbox.alias) and inbox.attempt; a call or
// hand-off that failed has an error status. The claim's span carries
// inbox.outcome, which is also set, with the key and the attempt, on the
// message context's span: acquired, duplicate, busy, dead, fail_open,
// no_key, store_error, payload_mismatch, redelivered (a delivery that found
// its key waiting out a backoff and was handed to Redelivery), behind (a
// delivery that waits behind an earlier message of its order key), stale (a
// message refused under inboxmw.StaleReject), closed, key_error or
// canceled. The outcomes counted after the claim (processed, released,
// lease_lost, complete_retry, complete_failed, redelivery_failed,
// order_blocked and order_skipped, and redelivered and stale when the
// message went on to the handler) go to
// inboxmw.Metrics only.
package inboxotel

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
)

// Tracer is an [inboxmw.Tracer] over an OpenTelemetry tracer.
type Tracer struct {
	t trace.Tracer
}

var _ inboxmw.Tracer = (*Tracer)(nil)

// New returns a Tracer whose spans tp records.
func New(tp trace.TracerProvider) *Tracer {
	return &Tracer{t: tp.Tracer("github.com/watermill-inbox/inbox/middleware")}
}

// Step implements [inboxmw.Tracer].
func (t *Tracer) Step(ctx context.Context, step, key string, start time.Time, outcome inboxmw.Outcome, attempt int, err error) {
	attrs := make([]attribute.KeyValue, 0, 6)
	if k, perr := keying.Parse(key); perr == nil {
		attrs = append(attrs, attribute.String("inbox.key", key), attribute.String("inbox.bus", k.Bus),
			attribute.String("inbox.group", k.Group), attribute.String("inbox.alias", k.Alias))
	}
	attrs = append(attrs, attribute.Int("inbox.attempt", attempt))
	if outcome != "" {
		attrs = append(attrs, attribute.String("inbox.outcome", string(outcome)))
	}
	_, span := t.t.Start(ctx, "inbox."+step, trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	if step == "claim" {
		trace.SpanFromContext(ctx).SetAttributes(attrs...)
	}
}
