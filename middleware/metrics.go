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
	// OutcomeProcessed: the handler succeeded and the key was marked processed.
	OutcomeProcessed Outcome = "processed"
	// OutcomeDuplicate: the key was already processed; the handler did not run
	// and the message was acked.
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeBusy: another consumer held the key for the whole wait; the
	// message was nacked with ErrBusy.
	OutcomeBusy Outcome = "busy"
	// OutcomeReleased: the lease was given back unmarked, because the handler
	// failed or panicked or the router nacked the message.
	OutcomeReleased Outcome = "released"
	// OutcomeStoreError: a store call failed.
	OutcomeStoreError Outcome = "store_error"
	// OutcomeFailOpen: a store error with Config.FailOpen: the handler ran
	// without deduplication.
	OutcomeFailOpen Outcome = "fail_open"
	// OutcomeNoKey: the message had no id.
	OutcomeNoKey Outcome = "no_key"
	// OutcomePayloadMismatch: a known key arrived with different content.
	OutcomePayloadMismatch Outcome = "payload_mismatch"
	// OutcomeDead: the key is dead (Config.MaxAttempts): the handler failed
	// on the last attempt allowed, or did not run for a key marked dead
	// before; the middleware returned an inbox.DeadError.
	OutcomeDead Outcome = "dead"
	// OutcomeAcquired: the key was claimed and the handler runs. Reported to
	// a Tracer only: the mark counts processed or released.
	OutcomeAcquired Outcome = "acquired"
	// OutcomeLeaseLost: the lease was lost (expired and taken over, or not
	// renewable in time); the handler's context was canceled.
	OutcomeLeaseLost Outcome = "lease_lost"
	// OutcomeCompleteRetry: marking the key after a successful handler failed
	// and is being retried in the background.
	OutcomeCompleteRetry Outcome = "complete_retry"
	// OutcomeCompleteFailed: marking the key failed until the lease ended; a
	// redelivery will run the handler again.
	OutcomeCompleteFailed Outcome = "complete_failed"
)

// Store operations as reported to [Metrics.StoreCall].
const (
	OpTryBegin      = "try_begin"
	OpComplete      = "complete"
	OpRelease       = "release"
	OpFail          = "fail"
	OpExtend        = "extend"
	OpIsProcessed   = "is_processed"
	OpMarkProcessed = "mark_processed"
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
	// outcome that settled it, or a store call after the handler
	// ("complete", "release", "fail", "mark_processed") with its error. ctx
	// is the message's context, key is "" for a message without an id, and
	// attempt is the key's attempt count from the claim.
	Step(ctx context.Context, step, key string, start time.Time, outcome Outcome, attempt int, err error)
}
