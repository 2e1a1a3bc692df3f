package inboxmw

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
)

// lease is one acquired key, from TryBegin to its Complete or Release.
//
// Its store calls after TryBegin (heartbeat Extends, the Complete or Release)
// are serialised by mu, so they never race each other. Heartbeats are driven
// by the Inbox's scheduler, one goroutine for all leases: a handler that ends
// before its first heartbeat costs no timer and no goroutine of its own.
// After a successful handler, an ack waiter (see ackWaiters: goroutines
// reused from one message to the next) waits for the router's ack, or, on a
// store whose calls never block, the lease waits in inlineMarks to be settled
// by the next message.
//
// The fields that hold pointers come first, so that the collector's bitmap
// of a lease (written at every allocation) covers them and not the rest.
type lease struct {
	ib      *Inbox
	msg     *message.Message
	base    detached // the message's values without its cancellation
	handler string
	key     string
	id      string
	cancel  context.CancelCauseFunc
	parent  parentLink // the parent of the handler's context

	// owned by the scheduler, under its lock
	prevBeat, nextBeat *lease
	next               mono
	queued             bool

	length   time.Duration // granted lease
	interval time.Duration // heartbeat period
	acked    bool          // acked before the handler ran (InstantAck)

	mu       sync.Mutex
	deadline mono // when the lease ends unless renewed
	extendAt mono // when the first heartbeat's Extend is due
	lost     bool // the lease is no longer ours
	done     bool // finished: no more heartbeats

	// buf holds key and id, when they fit (see Inbox.handle).
	buf [leaseBuf]byte
}

// mono is a reading of the monotonic clock: nanoseconds since monoEpoch. A
// time.Time holds a pointer (its location) and three words.
type mono int64

var monoEpoch = time.Now()

func monoNow() mono                     { return mono(time.Since(monoEpoch)) }
func monoOf(t time.Time) mono           { return mono(t.Sub(monoEpoch)) }
func (m mono) add(d time.Duration) mono { return m + mono(d) }

// until is the time from now to m.
func until(m mono) time.Duration { return time.Duration(m - monoNow()) }

// detached is a context with the values of ctx and never canceled, as
// context.WithoutCancel's, kept in the lease instead of allocated. One
// difference: context.Cause of it is the cause of ctx's cancellation, if
// any (WithoutCancel's hides it); the store calls it is made for do not ask.
type detached struct{ ctx context.Context }

func (detached) Deadline() (time.Time, bool) { return time.Time{}, false }
func (detached) Done() <-chan struct{}       { return nil }
func (detached) Err() error                  { return nil }
func (d *detached) Value(key any) any        { return d.ctx.Value(key) }
func (d *detached) String() string           { return "inbox.detached" }

// leaseBuf is the room in a lease for its key and lease id: keys of up to 96
// bytes need no allocation of their own.
const leaseBuf = 96 + leaseIDLen

// Causes of the handler context's cancellation other than a lost lease.
var (
	errHandlerReturned = errors.New("inbox: handler returned")
	errHandlerPanicked = errors.New("inbox: handler panicked")
)

const stopped = time.Duration(-1)

// run executes the handler under a lease kept alive by heartbeats.
func (ib *Inbox) run(h message.HandlerFunc, l *lease, claim inbox.Claim,
	opts inbox.BeginOptions, sent time.Time, instantAcked bool) (out []*message.Message, err error) {
	granted := claim.Lease
	if granted <= 0 {
		granted = opts.Lease
	}
	interval := ib.cfg.HeartbeatInterval
	if interval >= granted {
		interval = granted / 3
	}
	msg := l.msg
	orig := msg.Context()
	var hctx context.Context
	var cancel context.CancelCauseFunc
	if _, dl := orig.Deadline(); dl || orig.Err() != nil {
		// Done already, or due to end at a deadline (a timeout set outside
		// the middleware): a child of its own, canceled as the stdlib
		// cancels children, with the parent's Err (DeadlineExceeded).
		hctx, cancel = context.WithCancelCause(orig)
		l.parent.linked = true
	} else {
		l.parent.ctx = orig
		hctx, cancel = context.WithCancelCause(&l.parent)
	}
	at := monoOf(sent)
	l.base.ctx, l.id, l.length, l.interval, l.deadline, l.cancel = orig, claim.LeaseID, granted, interval, at.add(granted), cancel
	l.extendAt = at.add(interval)
	ib.beats.schedule(l, at.add(min(interval, linkAfter)))

	msg.SetContext(hctx)
	returned := false
	defer func() {
		msg.SetContext(orig)
		if returned {
			return
		}
		r := recover()
		cancel(errHandlerPanicked)
		if r == nil { // runtime.Goexit in the handler: let it go on
			l.finish("handler exited its goroutine")
			return
		}
		l.finish("handler panicked")
		panic(r)
	}()
	out, err = h(msg)
	returned = true

	if err != nil {
		cancel(errHandlerReturned)
		// Synchronous: Kafka's subscriber redelivers in-process at once, so
		// the key must be free before the middleware returns.
		l.finish("handler failed")
		return out, err
	}
	// The handler's context stays live until the router acks or nacks: the
	// messages it returned may be published with it.
	l.acked = instantAcked
	if ib.marks != nil {
		if instantAcked {
			l.settle(ackedV, false)
		} else {
			ib.marks.add(l)
		}
		return out, nil
	}
	ib.waiters.start(l)
	return out, nil
}

// finish stops the lease without marking: no more heartbeats, and the lease
// is released unless it was lost. It ends the lease's pending count.
func (l *lease) finish(why string) {
	defer l.ib.untrack()
	l.mu.Lock()
	l.end()
	if !l.lost {
		l.release(why)
	}
	l.mu.Unlock()
	l.ib.beats.unschedule(l)
}

// verdict is the router's answer on a message whose handler succeeded.
type verdict uint8

const (
	undecided  verdict = iota
	ackedV             // acked: Complete
	nackedV            // nacked: Release
	abandonedV         // Close gave up waiting: Release
)

// verdict reads the router's verdict on l's message without waiting.
func (l *lease) verdict() verdict {
	switch {
	case l.acked || isClosedChan(l.msg.Acked()):
		return ackedV
	case isClosedChan(l.msg.Nacked()):
		return nackedV
	case isClosedChan(l.ib.abandon):
		return abandonedV
	}
	return undecided
}

// awaitAck waits for the router's verdict on a message whose handler
// succeeded, then settles the lease. It runs on an ack waiter.
func (l *lease) awaitAck() {
	v := l.verdict() // acked already: the common case, without a select of three
	if v == undecided {
		select {
		case <-l.msg.Acked():
			v = ackedV
		case <-l.msg.Nacked():
			v = nackedV
		case <-l.ib.abandon:
			v = abandonedV
		}
	}
	l.settle(v, true)
}

// settle acts on the router's verdict v: Complete on ack, Release on nack or
// when Close gave up. A failed Complete is retried in the background: on the
// caller's goroutine when mayBlock (an ack waiter), else on a goroutine of
// its own, so that a handler's goroutine settling inline marks never waits.
func (l *lease) settle(v verdict, mayBlock bool) {
	defer l.cancel(errHandlerReturned)
	switch v {
	case nackedV:
		l.finish("message nacked")
		return
	case abandonedV:
		l.finish("middleware closed before the mark")
		return
	}
	l.mu.Lock()
	next := l.complete()
	if next == stopped {
		l.end()
	}
	l.mu.Unlock()
	if next == stopped {
		l.ib.beats.unschedule(l)
		l.ib.untrack()
		return
	}
	if mayBlock {
		l.retryComplete(next)
		return
	}
	go l.retryComplete(next)
}

// retryComplete retries a failed Complete in the background until it lands,
// the lease is lost or ends, or the middleware closes. Heartbeats go on
// meanwhile.
//
//go:noinline
func (l *lease) retryComplete(next time.Duration) {
	retry := time.NewTimer(next)
	defer retry.Stop()
	for {
		select {
		case <-retry.C:
		case <-l.ib.abandon:
			l.finish("middleware closed before the mark")
			return
		}
		l.mu.Lock()
		next = l.complete()
		if next == stopped {
			l.end()
		}
		l.mu.Unlock()
		if next == stopped {
			l.ib.beats.unschedule(l)
			l.ib.untrack()
			return
		}
		retry.Reset(next)
	}
}

// storeCtx returns the context for a store call after the handler: detached
// from the message's cancellation, bounded by StoreTimeout unless the store
// bounds its calls itself.
func (l *lease) storeCtx(timeout time.Duration) (context.Context, context.CancelFunc) {
	if !l.ib.timeouts {
		return &l.base, noCancel
	}
	return context.WithTimeout(&l.base, timeout)
}

func noCancel() {}

func (l *lease) logFields() watermill.LogFields {
	return watermill.LogFields{"message_uuid": l.msg.UUID, "handler_name": l.handler, "inbox_key": l.key}
}

// lose cancels the handler's context: this consumer no longer holds the key.
// Call with mu held.
func (l *lease) lose(cause error) {
	l.lost = true
	l.cancel(cause)
	l.ib.m.Outcome(l.handler, OutcomeLeaseLost)
	l.ib.log.Error("Inbox lease lost; handler context canceled", cause, l.logFields())
}

// end marks l done: no more heartbeats, and the handler's context no longer
// linked to the message's. Call with mu held.
func (l *lease) end() {
	l.done = true
	l.parent.unlink()
}

// beat is one heartbeat, run by the scheduler on a goroutine of its own. The
// first one, linkAfter after the claim, links the handler's context to the
// message's; the Extends start at extendAt.
func (l *lease) beat() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return
	}
	if !l.parent.linked {
		l.parent.link(l.cancel)
	}
	if l.lost {
		return
	}
	if until(l.extendAt) > 0 {
		l.ib.beats.schedule(l, l.extendAt)
		return
	}
	if next := l.extend(); next != stopped {
		// Under mu, so that finish (which sets done under mu first) can
		// never be followed by a re-schedule.
		l.ib.beats.schedule(l, monoNow().add(next))
	}
}

// extend renews the lease and returns when to beat next, or stopped. Call
// with mu held.
func (l *lease) extend() time.Duration {
	left := until(l.deadline)
	if left <= 0 {
		l.lose(fmt.Errorf("%w: lease of key %q was not renewed before its deadline", inbox.ErrLeaseLost, l.key))
		return stopped
	}
	if l.ib.extendOff.Load() {
		return left // wake at the deadline to cancel the handler
	}
	sent := time.Now()
	ctx, cancel := l.storeCtx(min(l.ib.cfg.StoreTimeout, left))
	_, err := l.ib.leases.Extend(ctx, l.key, l.id, l.length)
	cancel()
	l.ib.endCall(OpExtend, sent, err)
	switch {
	case err == nil:
		l.deadline = monoOf(sent).add(l.length)
		return l.interval
	case errors.Is(err, inbox.ErrLeaseLost):
		l.lose(fmt.Errorf("heartbeat of key %q: %w", l.key, err))
		return stopped
	case errors.Is(err, inbox.ErrNotSupported):
		if l.ib.extendOff.CompareAndSwap(false, true) {
			l.ib.log.Info("Inbox store cannot extend leases: heartbeats off; a handler still running when its lease ends is canceled", nil)
		}
		return max(until(l.deadline), 0)
	default:
		l.ib.m.Outcome(l.handler, OutcomeStoreError)
		l.ib.log.Error("Inbox heartbeat failed; retrying until the lease deadline", err, l.logFields())
		return min(max(l.interval/4, 10*time.Millisecond), max(until(l.deadline), 0))
	}
}

// complete marks the key processed. It returns stopped when done (marked,
// lost, or given up at the lease's end), else when to retry. Call with mu
// held.
func (l *lease) complete() time.Duration {
	start := l.ib.startCall()
	ctx, cancel := l.storeCtx(l.ib.cfg.StoreTimeout)
	err := l.ib.leases.Complete(ctx, l.key, l.id)
	cancel()
	l.ib.endCall(OpComplete, start, err)
	if err == nil {
		l.ib.m.Outcome(l.handler, OutcomeProcessed)
		return stopped
	}
	return l.completeFailed(err)
}

// completeFailed is complete's slow path, kept out of its frame so that the
// ack goroutine's stack stays small.
//
//go:noinline
func (l *lease) completeFailed(err error) time.Duration {
	if errors.Is(err, inbox.ErrLeaseLost) {
		if !l.lost {
			l.ib.m.Outcome(l.handler, OutcomeLeaseLost)
		}
		l.ib.log.Error("Handler succeeded but its inbox lease was lost before the mark: a redelivery may run it again", err, l.logFields())
		return stopped
	}
	l.ib.m.Outcome(l.handler, OutcomeStoreError)
	left := until(l.deadline)
	if left <= 0 {
		l.ib.m.Outcome(l.handler, OutcomeCompleteFailed)
		l.ib.log.Error("Inbox mark failed until the lease ended: a redelivery will run the handler again", err, l.logFields())
		return stopped
	}
	l.ib.m.Outcome(l.handler, OutcomeCompleteRetry)
	l.ib.log.Info("Inbox mark failed after a successful handler; retrying in the background", l.logFields().Add(watermill.LogFields{"error": err.Error()}))
	return min(l.interval/4+10*time.Millisecond, left)
}

// release gives the lease back unmarked. Call with mu held.
func (l *lease) release(why string) {
	start := l.ib.startCall()
	ctx, cancel := l.storeCtx(l.ib.cfg.StoreTimeout)
	err := l.ib.leases.Release(ctx, l.key, l.id)
	cancel()
	l.ib.endCall(OpRelease, start, err)
	if err != nil {
		l.ib.m.Outcome(l.handler, OutcomeStoreError)
		l.ib.log.Error("Inbox release failed; the key stays claimed until its lease ends", err, l.logFields().Add(watermill.LogFields{"reason": why}))
		return
	}
	l.ib.m.Outcome(l.handler, OutcomeReleased)
	l.ib.log.Debug("Inbox lease released", l.logFields().Add(watermill.LogFields{"reason": why}))
}

// linkAfter is how long a handler runs before its context is linked to the
// message's (see parentLink).
const linkAfter = 10 * time.Millisecond

// parentLink is the parent of a handler's context: the message's context,
// whose values it passes on at once and whose cancellation it passes on once
// linked. A context derived from the message's straight away registers with
// it (subscribers give each message a context of its own, so a map and a
// channel made for it) and unregisters when it ends: work on every message,
// for the sake of the few handlers still running when the message's context
// is canceled (a subscriber closing). The scheduler links it linkAfter into
// the handler instead (lease.beat), so a handler that ends before never
// registers. Message contexts that are done already, or that have a
// deadline (a timeout set outside the middleware: its handler's context
// must end with context.DeadlineExceeded, at the deadline), are the handler
// context's parent directly (lease.run).
//
// To [context.WithCancelCause] it is a context that is never canceled (Done
// is nil), so the handler's context does not register with it.
type parentLink struct {
	ctx    context.Context // the message's
	stop   func() bool     // undoes the link; nil when not linked
	linked bool
}

func (p *parentLink) Deadline() (time.Time, bool) { return time.Time{}, false }
func (p *parentLink) Done() <-chan struct{}       { return nil }
func (p *parentLink) Err() error                  { return nil }
func (p *parentLink) Value(key any) any           { return p.ctx.Value(key) }
func (p *parentLink) String() string              { return "inbox.parentLink" }

// link makes the message context's cancellation cancel the handler's (with
// cancel), with the message context's cause. Call under the lease's mu.
func (p *parentLink) link(cancel context.CancelCauseFunc) {
	p.linked = true
	ctx := p.ctx
	p.stop = context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
}

// unlink undoes link, so that the message's context does not keep the
// handler's registered after the lease. Call under the lease's mu.
func (p *parentLink) unlink() {
	p.linked = true // never link after the lease
	if p.stop != nil {
		p.stop()
		p.stop = nil
	}
}
