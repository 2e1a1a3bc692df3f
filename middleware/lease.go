package middleware

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
)

// handlerResult is what the handler did, as told to the lease's goroutine.
type handlerResult int

const (
	resultFailed    handlerResult = iota + 1 // error or panic: release, then tell the caller
	resultSucceeded                          // wait for the router's ack or nack
	resultAcked                              // succeeded and already acked (InstantAck): complete now
)

// lease is one acquired key, from TryBegin to its Complete or Release. A
// single goroutine (run) makes every store call for it after TryBegin, so
// heartbeats, marks and releases never race each other.
type lease struct {
	ib       *Inbox
	msg      *message.Message
	parent   context.Context // the message's context at claim time: values for detached calls
	handler  string
	key      string
	id       string
	length   time.Duration // granted lease
	interval time.Duration // heartbeat period
	deadline time.Time     // local, monotonic: when the lease ends unless renewed
	cancel   context.CancelCauseFunc

	done     chan handlerResult // buffered: the handler's outcome
	released chan struct{}      // closed once a failed handler's lease was given back

	lost bool // owned by run
}

// Causes of the handler context's cancellation other than a lost lease.
var (
	errHandlerReturned = errors.New("inbox: handler returned")
	errHandlerPanicked = errors.New("inbox: handler panicked")
)

// run executes the handler under a lease kept alive by heartbeats.
func (ib *Inbox) run(h message.HandlerFunc, msg *message.Message, handler, key string, claim inbox.Claim,
	opts inbox.BeginOptions, sent time.Time, instantAcked bool) (out []*message.Message, err error) {
	granted := claim.Lease
	if granted <= 0 {
		granted = opts.Lease
	}
	interval := ib.cfg.HeartbeatInterval
	if interval >= granted {
		interval = granted / 3
	}
	orig := msg.Context()
	hctx, cancel := context.WithCancelCause(orig)
	l := &lease{
		ib: ib, msg: msg, parent: orig, handler: handler, key: key, id: claim.LeaseID,
		length: granted, interval: interval, deadline: sent.Add(granted), cancel: cancel,
		done: make(chan handlerResult, 1), released: make(chan struct{}),
	}
	go l.run()

	msg.SetContext(hctx)
	returned := false
	defer func() {
		msg.SetContext(orig)
		if returned {
			return
		}
		r := recover()
		cancel(errHandlerPanicked)
		l.done <- resultFailed
		<-l.released
		panic(r)
	}()
	out, err = h(msg)
	returned = true

	if err != nil {
		cancel(errHandlerReturned)
		l.done <- resultFailed
		<-l.released // Kafka redelivers in-process: the key must be free before we return
		return out, err
	}
	// The handler's context stays live until the router acks or nacks: the
	// messages it returned may be published with it.
	if instantAcked || isClosedChan(msg.Acked()) {
		l.done <- resultAcked
	} else {
		l.done <- resultSucceeded
	}
	return out, nil
}

const stopped = time.Duration(-1)

func (l *lease) run() {
	defer l.ib.untrack()
	defer l.cancel(errHandlerReturned)

	beat := time.NewTimer(l.interval)
	defer beat.Stop()
	var (
		acked, nacked, abandon <-chan struct{} // armed once the handler succeeded
		retry                  *time.Timer     // armed while Complete is retried
		retryC                 <-chan time.Time
	)
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	// complete tries the mark; true when finished, else a retry is armed.
	complete := func() bool {
		next := l.complete()
		if next == stopped {
			return true
		}
		if retry == nil {
			retry = time.NewTimer(next)
		} else {
			retry.Reset(next)
		}
		retryC = retry.C
		return false
	}

	for {
		select {
		case r := <-l.done:
			switch r {
			case resultFailed:
				if !l.lost {
					l.release("handler failed")
				}
				close(l.released)
				return
			case resultAcked:
				abandon = l.ib.abandon
				if complete() {
					return
				}
			case resultSucceeded:
				acked, nacked, abandon = l.msg.Acked(), l.msg.Nacked(), l.ib.abandon
			}
		case <-beat.C:
			if next := l.beat(); next != stopped {
				beat.Reset(next)
			}
		case <-acked:
			acked, nacked = nil, nil
			if complete() {
				return
			}
		case <-retryC:
			if complete() {
				return
			}
		case <-nacked:
			if !l.lost {
				l.release("message nacked")
			}
			return
		case <-abandon:
			if !l.lost {
				l.release("middleware closed before the mark")
			}
			return
		}
	}
}

// call runs one store call with a detached, bounded context.
func (l *lease) call(op string, timeout time.Duration, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(l.parent), timeout)
	start := time.Now()
	err := f(ctx)
	cancel()
	l.ib.m.StoreCall(op, time.Since(start), err)
	return err
}

func (l *lease) logFields() watermill.LogFields {
	return watermill.LogFields{"message_uuid": l.msg.UUID, "handler_name": l.handler, "inbox_key": l.key}
}

// lose cancels the handler's context: this consumer no longer holds the key.
func (l *lease) lose(cause error) {
	l.lost = true
	l.cancel(cause)
	l.ib.m.Outcome(l.handler, OutcomeLeaseLost)
	l.ib.log.Error("Inbox lease lost; handler context canceled", cause, l.logFields())
}

// beat extends the lease and returns when to beat next, or stopped.
func (l *lease) beat() time.Duration {
	if l.lost {
		return stopped
	}
	left := time.Until(l.deadline)
	if left <= 0 {
		l.lose(fmt.Errorf("%w: lease of key %q was not renewed before its deadline", inbox.ErrLeaseLost, l.key))
		return stopped
	}
	if l.ib.extendOff.Load() {
		return left // wake at the deadline to cancel the handler
	}
	sent := time.Now()
	err := l.call(OpExtend, min(l.ib.cfg.StoreTimeout, left), func(ctx context.Context) error {
		_, err := l.ib.leases.Extend(ctx, l.key, l.id, l.length)
		return err
	})
	switch {
	case err == nil:
		l.deadline = sent.Add(l.length)
		return l.interval
	case errors.Is(err, inbox.ErrLeaseLost):
		l.lose(fmt.Errorf("heartbeat of key %q: %w", l.key, err))
		return stopped
	case errors.Is(err, inbox.ErrNotSupported):
		if l.ib.extendOff.CompareAndSwap(false, true) {
			l.ib.log.Info("Inbox store cannot extend leases: heartbeats off; a handler still running when its lease ends is canceled", nil)
		}
		return max(time.Until(l.deadline), 0)
	default:
		l.ib.m.Outcome(l.handler, OutcomeStoreError)
		l.ib.log.Error("Inbox heartbeat failed; retrying until the lease deadline", err, l.logFields())
		return min(max(l.interval/4, 10*time.Millisecond), max(time.Until(l.deadline), 0))
	}
}

// complete marks the key processed. It returns stopped when done (marked,
// lost, or given up at the lease's end), else when to retry.
func (l *lease) complete() time.Duration {
	err := l.call(OpComplete, l.ib.cfg.StoreTimeout, func(ctx context.Context) error {
		return l.ib.leases.Complete(ctx, l.key, l.id)
	})
	switch {
	case err == nil:
		l.ib.m.Outcome(l.handler, OutcomeProcessed)
		return stopped
	case errors.Is(err, inbox.ErrLeaseLost):
		if !l.lost {
			l.ib.m.Outcome(l.handler, OutcomeLeaseLost)
		}
		l.ib.log.Error("Handler succeeded but its inbox lease was lost before the mark: a redelivery may run it again", err, l.logFields())
		return stopped
	}
	l.ib.m.Outcome(l.handler, OutcomeStoreError)
	left := time.Until(l.deadline)
	if left <= 0 {
		l.ib.m.Outcome(l.handler, OutcomeCompleteFailed)
		l.ib.log.Error("Inbox mark failed until the lease ended: a redelivery will run the handler again", err, l.logFields())
		return stopped
	}
	l.ib.m.Outcome(l.handler, OutcomeCompleteRetry)
	l.ib.log.Info("Inbox mark failed after a successful handler; retrying in the background", l.logFields().Add(watermill.LogFields{"error": err.Error()}))
	return min(l.interval/4+10*time.Millisecond, left)
}

// release gives the lease back unmarked.
func (l *lease) release(why string) {
	err := l.call(OpRelease, l.ib.cfg.StoreTimeout, func(ctx context.Context) error {
		return l.ib.leases.Release(ctx, l.key, l.id)
	})
	if err != nil {
		l.ib.m.Outcome(l.handler, OutcomeStoreError)
		l.ib.log.Error("Inbox release failed; the key stays claimed until its lease ends", err, l.logFields().Add(watermill.LogFields{"reason": why}))
		return
	}
	l.ib.m.Outcome(l.handler, OutcomeReleased)
	l.ib.log.Debug("Inbox lease released", l.logFields().Add(watermill.LogFields{"reason": why}))
}
