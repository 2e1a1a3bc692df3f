package inboxmw

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/sched"
	"github.com/watermill-inbox/inbox/stores/driver"
)

// lease is the lease a message's claim acquired, from the start of its
// handler until its mark or release has landed. The message's goroutine
// builds it (newLease) and hands it to the Inbox's keeper (keeper.hold);
// from then on each part has one owner at a time:
//   - the fields set by newLease never change;
//   - the keeper's fields change under the keeper's lock (keeper.go);
//   - end is written once the keeper dropped the lease (keeper.drop), by
//     whoever ends it (endLease: the message's goroutine, or the keeper
//     on the router's verdict or at Close), then passed along with the
//     call: the store's answer (endAnswered), the keeper's resend after a
//     failure (sendEnd), the store's answer again.
type lease struct {
	// Set by newLease, read-only afterwards:
	ib       *Inbox
	msg      *message.Message // its verdict (Acked, Nacked) and its logs' fields
	handler  string
	key      string
	attempts int
	id       string
	hash     string                  // the claim's payload hash
	ordered  bool                    // the claim had an order key (Config.OrderKey)
	answered chan struct{}           // markBeforeAck's: closed at the mark's first answer
	expires  time.Time               // the claim's ExpiresAt (store clock)
	length   time.Duration           // granted
	interval time.Duration           // heartbeat period
	base     context.Context         // the message's values, without its cancellation
	cancel   context.CancelCauseFunc // the handler's context (set by run)

	// The keeper's, under its lock:
	sched.Entry
	deadline time.Time // when the lease ends unless renewed (monotonic)
	renewing bool      // an Extend is in flight
	lost     bool      // the lease is no longer ours
	settling bool      // the handler is done: no more heartbeats

	// The call that ends the lease, once the keeper dropped it:
	end ending
}

// ending is the call that ends a lease after a successful handler, and its
// retries.
type ending struct {
	op     driver.Kind // Complete or Release
	why    string      // why a Release
	giveUp time.Time   // no resend after it: the lease's deadline
	sent   time.Time   // when the call was last sent
	retry  int         // resends so far
	lost   bool        // the keeper had seen the lease lost before it ended
}

// newLease records the lease that m's claim acquired (asked with opts,
// sent at sent on the local clock). run sets its cancel before the keeper
// holds it.
func newLease(m *msgCall, claim inbox.Claim, opts inbox.BeginOptions, sent time.Time) *lease {
	l := &lease{ib: m.ib, msg: m.msg, handler: m.handler, key: m.key, attempts: m.attempts,
		id: claim.LeaseID, hash: opts.PayloadHash, ordered: opts.OrderKey != "", expires: claim.ExpiresAt,
		length: cmp.Or(max(claim.Lease, 0), opts.Lease), interval: m.ib.cfg.HeartbeatInterval,
		base: context.WithoutCancel(m.msg.Context())}
	if l.interval >= l.length {
		l.interval = l.length / 3
	}
	l.deadline = sent.Add(l.length)
	return l
}

func (l *lease) fields() watermill.LogFields { return logFields(l.msg, l.handler, l.key) }

// endLease ends the lease after a successful handler: the mark (Complete),
// or a Release (why) when the router nacked the message or Close gave up
// waiting. It stops the heartbeat and sends the call without waiting.
func (l *lease) endLease(op driver.Kind, why string) {
	lost, deadline := l.ib.keep.drop(l)
	l.cancel(errHandlerReturned)
	if lost && op == driver.Release {
		l.ib.pending.Done()
		return
	}
	l.end = ending{op: op, why: why, giveUp: deadline, lost: lost}
	l.sendEnd()
}

// markBeforeAck marks the key of a message with an order key whose
// handler succeeded and returned no messages, and waits for the store's
// first answer (at most the store's timeout) before the router acks it.
// Marked after the ack, as other messages are, a consumer killed between
// the two would leave the key unmarked and its message acked: nothing
// would mark it, and its order key's later messages would wait behind it
// until the gate expires. Marked first, a consumer killed before the ack
// has the message delivered again, and that delivery finds it processed.
// A mark that fails is sent again by the keeper as any other (past the
// lease's end: endAnswered), and the message is acked meanwhile. A
// middleware outside the inbox that turns the success into an error does
// not run the handler again: the redelivery finds the key processed.
func (l *lease) markBeforeAck() {
	answered := make(chan struct{})
	l.answered = answered
	l.endLease(driver.Complete, "")
	<-answered
}

// sendEnd hands the lease's mark or release to the store; its answer goes
// to endAnswered.
func (l *lease) sendEnd() {
	op := driver.Op{Kind: l.end.op, Key: l.key, LeaseID: l.id}
	if l.end.op == driver.Complete {
		// What the claim wrote: a store may mark without reading it.
		op.Owner, op.PayloadHash, op.Lease, op.ExpiresAt = l.ib.cfg.Owner, l.hash, l.length, l.expires
	}
	l.end.sent = time.Now()
	l.ib.async.Go(l.base, op, l.endAnswered)
}

// endAnswered gets the store's answer to sendEnd. A failed mark never
// nacks the message (that would run the handler again): a failure that
// may pass is sent again by the keeper after a jittered pause (50 ms
// growing to 2 s) until the lease ends, and it is logged and counted if it
// still fails. The mark of a message with an order key is sent again
// past the lease's end too, until it lands or another holder took the key
// (ErrLeaseLost; stores let a holder whose lease ran out mark while
// nobody did): the message was acked, no redelivery will mark it, and
// while it is not processed it may head its order key's gate, the later
// messages of the order key waiting behind it.
func (l *lease) endAnswered(_ inbox.Claim, err error) {
	ib, e := l.ib, &l.end
	if l.answered != nil {
		close(l.answered)
		l.answered = nil
	}
	name := opName[e.op]
	ib.reportCall(l.base, name, l.key, l.attempts, e.sent, err)
	if err == nil {
		ib.health.OK()
		if e.op == driver.Release {
			ib.m.Outcome(l.handler, OutcomeReleased)
			ib.log.Debug("Inbox lease given back", l.fields().Add(watermill.LogFields{"reason": e.why}))
		} else {
			ib.m.Outcome(l.handler, OutcomeProcessed)
		}
		ib.pending.Done()
		return
	}
	if wait := storeBackoff.Pause(e.retry); !errors.Is(err, inbox.ErrLeaseLost) && retryable(l.base, err) &&
		(time.Until(e.giveUp) >= wait || l.ordered && e.op == driver.Complete) {
		e.retry++ // before resendAt: the keeper may send it again at once
		ib.m.Outcome(l.handler, OutcomeStoreError)
		if e.op != driver.Release {
			ib.m.Outcome(l.handler, OutcomeCompleteRetry)
		}
		ib.health.Fail("Inbox store call after the handler failed; retrying in the background", err, l.fields().Add(watermill.LogFields{"op": name}))
		if ib.keep.resendAt(l, time.Now().Add(wait)) {
			return
		}
	}
	switch {
	case e.op == driver.Release:
		if !errors.Is(err, inbox.ErrLeaseLost) {
			ib.health.Fail("Inbox release failed; the key stays claimed until its lease ends", err, l.fields())
		}
	case errors.Is(err, inbox.ErrLeaseLost):
		if !e.lost {
			ib.m.Outcome(l.handler, OutcomeLeaseLost)
		}
		ib.log.Error("Handler succeeded but its inbox lease was lost before the mark: a redelivery may run it again", err, l.fields())
	default:
		ib.m.Outcome(l.handler, OutcomeCompleteFailed)
		ib.health.Fail("Inbox mark failed until the lease ended: a redelivery will run the handler again", err, l.fields())
	}
	ib.pending.Done()
}

var opName = [...]string{driver.Complete: OpComplete, driver.Release: OpRelease, driver.Extend: OpExtend}

// lose cancels the handler's context: this consumer no longer holds the key.
// It counts and logs first, so that whoever sees the context end (the
// handler, a test) also sees the lease_lost outcome.
func (l *lease) lose(cause error) {
	l.ib.m.Outcome(l.handler, OutcomeLeaseLost)
	l.ib.log.Error("Inbox lease lost; handler context canceled", cause, l.fields())
	l.cancel(cause)
}
