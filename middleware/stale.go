package inboxmw

import (
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
)

// This file is the stale check: a message older than the store's retention
// (by its broker timestamp) may be one whose key has expired, so the store
// can no longer tell a replay from new work.

// StalePolicy says what the middleware does with a message older than the
// store's retention less [Config.StaleMargin].
type StalePolicy int

const (
	// StaleWarn logs the message (at most one line every 10 s) and counts
	// it (outcome stale), then handles it as usual: its key may have
	// expired, so a replay runs the handler again. The default.
	StaleWarn StalePolicy = iota
	// StaleReject refuses it without running the handler, with an error
	// wrapping [inbox.ErrStale] (not transient, for a poison queue), and
	// counts it (outcome stale).
	StaleReject
)

// TimestampFunc returns the time the broker took msg (a Kafka record's
// timestamp, an AMQP timestamp property), or false when msg has none. See
// Config.Timestamp; inboxkafka.Timestamp and inboxamqp.Timestamp are two.
type TimestampFunc func(msg *message.Message) (time.Time, bool)

// staleLimit returns how old a message may be before it is stale, and the
// margin, or false when there is no check: no Config.Timestamp, or a store
// that does not report its retention.
func (ib *Inbox) staleLimit() (limit, retention, margin time.Duration, ok bool) {
	if ib.cfg.Timestamp == nil || ib.retention == nil {
		return 0, 0, 0, false
	}
	retention = ib.retention.Retention()
	if retention <= 0 {
		return 0, 0, 0, false
	}
	margin = ib.cfg.StaleMargin
	if margin == 0 {
		margin = retention / 10
	}
	return retention - margin, retention, margin, true
}

// checkStale reports a message whose broker timestamp is older than the
// store's retention less the margin: logged and counted, and under
// StaleReject an error wrapping inbox.ErrStale to return. A message without
// a timestamp passes.
func (m *msgCall) checkStale() error {
	ib := m.ib
	limit, retention, margin, ok := ib.staleLimit()
	if !ok {
		return nil
	}
	ts, ok := ib.cfg.Timestamp(m.msg)
	if !ok || ts.IsZero() {
		return nil
	}
	age := time.Since(ts)
	if age <= limit {
		return nil
	}
	err := fmt.Errorf("%w: key %q: its broker timestamp %s is %s old, more than the store's retention %s less a margin of %s",
		inbox.ErrStale, m.key, ts.UTC().Format(time.RFC3339Nano), age.Round(time.Millisecond), retention, margin)
	fields := m.fields().Add(watermill.LogFields{
		"broker_timestamp": ts.UTC().Format(time.RFC3339Nano), "age": age.Round(time.Millisecond).String(),
		"retention": retention.String(), "stale_margin": margin.String(),
	})
	if ib.cfg.Stale == StaleReject {
		m.report(OutcomeStale)
		ib.staleLog.Fail("Message older than the store's retention: refused without the handler (StaleReject)", err, fields)
		return err
	}
	ib.m.Outcome(m.handler, OutcomeStale)
	ib.staleLog.Fail("Message older than the store's retention: its key may have expired, so a replay cannot be told from new work; handling it", err, fields)
	return nil
}
