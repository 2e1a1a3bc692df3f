package inboxmw

import (
	"context"
	"time"
)

// Outcome is what happened to a message, or to its key's mark, as counted by
// [Metrics].
type Outcome string

// The outcomes the middleware counts.
const (
	OutcomeProcessed        Outcome = "processed"         // the handler succeeded and the key was marked processed
	OutcomeDuplicate        Outcome = "duplicate"         // the key was processed already: acked without the handler
	OutcomeBusy             Outcome = "busy"              // another consumer held the key for the whole wait: ErrBusy
	OutcomeReleased         Outcome = "released"          // the lease was given back unmarked: handler failed or panicked, or the message was nacked
	OutcomeStoreError       Outcome = "store_error"       // a store call failed
	OutcomeFailOpen         Outcome = "fail_open"         // a failed claim under Config.FailOpen: the handler ran without deduplication
	OutcomeNoKey            Outcome = "no_key"            // the message had no id
	OutcomePayloadMismatch  Outcome = "payload_mismatch"  // a known key arrived with different content
	OutcomeDead             Outcome = "dead"              // the key is dead (Config.MaxAttempts): an inbox.DeadError was returned
	OutcomeAcquired         Outcome = "acquired"          // the key was claimed and the handler runs; reported to a Tracer only
	OutcomeLeaseLost        Outcome = "lease_lost"        // the lease was lost (taken over, or not renewed in time); the handler's context was canceled
	OutcomeCompleteRetry    Outcome = "complete_retry"    // marking the key failed and is retried in the background
	OutcomeCompleteFailed   Outcome = "complete_failed"   // marking the key failed until the lease ended; a redelivery will run the handler again
	OutcomeRedelivered      Outcome = "redelivered"       // a copy was handed to Config.Redelivery, which holds the key's backoff; the original was acked
	OutcomeRedeliveryFailed Outcome = "redelivery_failed" // the hand-off to Config.Redelivery failed: the message went back to the broker as an error
	OutcomeStale            Outcome = "stale"             // the message is older than the store's retention (Config.Timestamp): handled anyway, or refused under StaleReject
	OutcomeBehind           Outcome = "behind"            // the message waits behind an earlier one of its order key (Config.OrderKey): handed to Config.Redelivery, or nacked after MaxBusyWait
	OutcomeOrderBlocked     Outcome = "order_blocked"     // a message went dead and its order key waits for an operator (OrderOnDeadBlock): inboxctl order-release
	OutcomeOrderSkipped     Outcome = "order_skipped"     // a message went dead and its order key went on without it (OrderOnDeadSkip)
)

// Store operations as reported to [Metrics.StoreCall].
const (
	OpTryBegin  = "try_begin"
	OpComplete  = "complete"
	OpRelease   = "release"
	OpFail      = "fail"
	OpExtend    = "extend"
	OpRedeliver = "redeliver" // not a store call: the hand-off to Config.Redelivery

	OpReleaseOrder = "release_order" // inbox.OrderAdmin.ReleaseOrder: an order key goes on past a dead key (OrderOnDeadSkip)
)

// Reasons of [Metrics.Waited].
const (
	WaitBusy         = "busy"          // polling a key another consumer holds
	WaitStoreBackoff = "store_backoff" // pausing between claims of a failing store
)

// Metrics receives what the middleware counts. Implementations must be safe
// for concurrent use and cheap: they are called on every message. Package
// [github.com/watermill-inbox/inbox/metrics] has a Prometheus one.
type Metrics interface {
	// Outcome counts one outcome for the handler (the router's handler name,
	// "" outside a router).
	Outcome(handler string, o Outcome)
	// StoreCall times one store call; err is its error, nil on success.
	// The hand-off to Config.Redelivery is reported as op [OpRedeliver].
	StoreCall(op string, d time.Duration, err error)
	// Waited reports the time one message waited in-process before its
	// claim was settled, for reason [WaitBusy] or [WaitStoreBackoff].
	Waited(handler, reason string, d time.Duration)
}

// ScopedMetrics is a [Metrics] that labels its series with the inbox's bus
// and group: [New] calls Scope once and reports to the Metrics it returns,
// so one ScopedMetrics can serve several inboxes.
type ScopedMetrics interface {
	Metrics
	Scope(bus, group string) Metrics
}

// NopMetrics is a [Metrics] that counts nothing: the default.
type NopMetrics struct{}

// Outcome implements [Metrics].
func (NopMetrics) Outcome(string, Outcome) {}

// StoreCall implements [Metrics].
func (NopMetrics) StoreCall(string, time.Duration, error) {}

// Waited implements [Metrics].
func (NopMetrics) Waited(string, string, time.Duration) {}

// Tracer receives the steps of each message, for tracing; package
// inboxotel (inbox/otel) records them as OpenTelemetry spans. Calls must be
// cheap and safe for concurrent use.
type Tracer interface {
	// Step reports a step that ran from start until now: "claim", with the
	// outcome that settled it, or one store call, named by its Op ("try_begin",
	// "extend", "complete", "release", "fail"; with a plain inbox.Store,
	// its IsProcessed is a "try_begin" and its MarkProcessed a "complete"),
	// or the hand-off to Config.Redelivery ("redeliver"),
	// with its error. Every call is a step: each retry of
	// a failing claim or mark, each heartbeat's Extend, and with a TxStore
	// its BeginTx ("try_begin") and its commit ("complete"). ctx is the
	// message's context, key is "" for a message without an id, and attempt
	// is the key's attempt count from the claim (0 before the claim
	// answered).
	Step(ctx context.Context, step, key string, start time.Time, outcome Outcome, attempt int, err error)
}
