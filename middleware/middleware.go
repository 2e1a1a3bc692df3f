package inboxmw

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/outage"
	"github.com/watermill-inbox/inbox/keying"
)

// This file is the path of one message, top to bottom: its key, the claim,
// the handler and the mark. handle picks the flow by the kind of store:
// handleLeased (an inbox.LeaseStore), handleTx (a TxStore) or handlePlain.
// In the leased flow one goroutine per lease, lease.watch, makes every store
// call after the claim: the heartbeat, then Complete on ack, Release on a
// nack or Close, Fail when the handler failed.

// Inbox is the inbox middleware. Build it with [New], add
// [Inbox.Middleware] to a router, and [Inbox.Close] it after the router has
// stopped. It is safe for concurrent use by any number of handlers and
// routers.
type Inbox struct {
	cfg    Config
	leases inbox.LeaseStore // the store, when it is a LeaseStore
	txs    TxStore          // the store, when it is a TxStore
	keys   *keying.Prepared // bus and group checked and escaped once, by New
	log    watermill.LoggerAdapter
	m      Metrics

	mu          sync.RWMutex
	closed      bool
	pending     sync.WaitGroup // messages between their claim and their mark
	abandon     chan struct{}  // closed when Close stops waiting for pending marks
	abandonOnce sync.Once

	extendOff atomic.Bool  // the store answered Extend with ErrNotSupported
	health    *outage.Log  // rate-limits the logs of store failures
	handOff   *outage.Log  // rate-limits the logs of failed hand-offs to Config.Redelivery
	pace      outage.Pacer // spaces the claims of a failing store

	retention inbox.RetentionReporter // the store, when it reports its retention
	staleLog  *outage.Log             // rate-limits the logs of stale messages
}

// New returns the middleware for cfg. It fails with an error wrapping
// [ErrInvalidConfig] that lists every problem of cfg.
func New(cfg Config) (*Inbox, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	kb := keying.Builder{Bus: cfg.Bus, Group: cfg.Group, Alias: cfg.Alias, IDSources: cfg.IDSources}
	keys, err := kb.Prepare() // cannot fail: Validate checked kb
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	ib := &Inbox{
		cfg:     cfg,
		keys:    keys,
		log:     cfg.Logger.With(watermill.LogFields{"inbox_bus": cfg.Bus, "inbox_group": cfg.Group}),
		m:       cfg.Metrics,
		abandon: make(chan struct{}),
		pace:    outage.Pacer{Backoff: storeBackoff},
	}
	ib.health = outage.NewLog(ib.log, "Inbox store recovered")
	ib.handOff = outage.NewLog(ib.log, "Inbox hand-offs to the broker's redelivery work again")
	ib.staleLog = outage.NewLog(ib.log, "")
	ib.retention, _ = cfg.Store.(inbox.RetentionReporter)
	if sm, ok := cfg.Metrics.(ScopedMetrics); ok {
		ib.m = sm.Scope(cfg.Bus, cfg.Group)
	}
	switch s := cfg.Store.(type) {
	case TxStore:
		ib.txs = s
	case inbox.LeaseStore:
		ib.leases = s
	default:
		ib.log.Info("Inbox store has no leases: concurrent deliveries of one message can both run the handler", nil)
	}
	if cfg.Timestamp != nil && ib.retention == nil {
		ib.log.Info("Inbox store does not report its retention: no stale check (Config.Timestamp is ignored)", nil)
	}
	return ib, nil
}

// Middleware is the [message.HandlerMiddleware]: router.AddMiddleware(ib.Middleware)
// or router.AddHandler(...).AddMiddleware(ib.Middleware).
func (ib *Inbox) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) { return ib.handle(h, msg) }
}

// msgCall is one message going through the middleware.
type msgCall struct {
	ib       *Inbox
	h        message.HandlerFunc
	msg      *message.Message
	handler  string
	key      string
	attempts int       // the key's attempts, as the claim returned them
	start    time.Time // for Config.Tracer
}

// handle builds the message's key and hands the message to the flow of the
// store's kind.
func (ib *Inbox) handle(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	m := &msgCall{ib: ib, h: h, msg: msg, handler: message.HandlerNameFromCtx(msg.Context()), start: time.Now()}
	key, err := ib.keyOf(msg)
	if err != nil {
		return m.keyError(err)
	}
	m.key = key
	if !ib.track() {
		m.traced("closed")
		return nil, errClosed
	}
	defer ib.pending.Done()
	if err := m.checkStale(); err != nil {
		return nil, err
	}
	switch {
	case ib.leases != nil:
		return m.handleLeased()
	case ib.txs != nil:
		return m.handleTx()
	default:
		return m.handlePlain()
	}
}

func (m *msgCall) fields() watermill.LogFields {
	f := watermill.LogFields{"message_uuid": m.msg.UUID, "handler_name": m.handler}
	if m.key != "" {
		f["inbox_key"] = m.key
	}
	return f
}

// keyError handles a message whose key cannot be built.
func (m *msgCall) keyError(err error) ([]*message.Message, error) {
	ib := m.ib
	if !errors.Is(err, inbox.ErrNoKey) {
		// A configuration problem (no alias, oversized segments): refusing
		// keeps the message for a fixed deployment.
		m.traced("key_error")
		ib.log.Error("Cannot build the inbox key; message nacked", err, m.fields())
		return nil, err
	}
	m.settle(OutcomeNoKey)
	if ib.cfg.MissingKey == MissingKeyReject {
		ib.log.Error("Message has no idempotency key; rejected (MissingKeyReject)", err, m.fields())
		return nil, err
	}
	ib.log.Info("Message has no idempotency key; processing it without deduplication", m.fields().Add(watermill.LogFields{"reason": err.Error()}))
	if ib.txs != nil {
		return m.handleTx() // its handler expects a transaction, without a claim
	}
	return m.h(m.msg)
}

// storeFailed counts and logs a claim that failed for good. It returns the
// error to return, or nil under FailOpen: the caller then runs the handler
// without deduplication.
func (m *msgCall) storeFailed(op string, err error) error {
	if ctx := m.msg.Context(); ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		m.traced("canceled")
		return err // shutting down: the router does not log cancellations
	}
	m.ib.m.Outcome(m.handler, OutcomeStoreError)
	if !errors.Is(err, inbox.ErrStoreUnavailable) && !errors.Is(err, context.Canceled) {
		err = fmt.Errorf("%w: inbox %s %q: %w", inbox.ErrStoreUnavailable, op, m.key, err)
	} else {
		err = fmt.Errorf("inbox %s %q: %w", op, m.key, err)
	}
	if m.ib.cfg.FailOpen {
		m.settle(OutcomeFailOpen)
		m.ib.health.Fail("Inbox store failed; processing WITHOUT deduplication (FailOpen)", err, m.fields())
		return nil
	}
	m.traced(OutcomeStoreError)
	m.ib.health.Fail("Inbox store failed; message nacked for redelivery", err, m.fields())
	return err
}

// duplicate acks a message whose key is processed, without the handler.
func (m *msgCall) duplicate() ([]*message.Message, error) {
	m.settle(OutcomeDuplicate)
	m.ib.log.Debug("Duplicate message skipped: key already processed", m.fields())
	return nil, nil
}

// busy reports a key that stayed busy for the whole wait: held by a lease,
// or waiting out a failed attempt's backoff.
func (m *msgCall) busy(retryAfter time.Duration, backingOff bool) error {
	m.settle(OutcomeBusy)
	m.ib.log.Info("Inbox key busy (another consumer's lease, or a failed attempt's backoff); message nacked for redelivery",
		m.fields().Add(watermill.LogFields{"retry_after": retryAfter.String(), "backing_off": backingOff}))
	return &inbox.BusyError{Key: m.key, RetryAfter: retryAfter, BackingOff: backingOff}
}

// dead reports a dead key: err is the handler's error when this attempt
// made it dead, nil for a later delivery.
func (m *msgCall) dead(reason string, err error) error {
	m.settle(OutcomeDead)
	msg := "Inbox key is dead: message refused without running the handler (inboxctl forget replays it)"
	if err != nil {
		msg = "Handler failed on the last attempt allowed (MaxAttempts): inbox key marked dead"
	}
	m.ib.log.Error(msg, err, m.fields().Add(watermill.LogFields{"attempts": m.attempts, "reason": reason}))
	return &inbox.DeadError{Key: m.key, Attempts: m.attempts, Reason: reason, Err: err}
}

// settle counts how the claim was settled, and traces it.
func (m *msgCall) settle(o Outcome) {
	m.ib.m.Outcome(m.handler, o)
	m.traced(o)
}

// traced reports how the claim was settled to Config.Tracer.
func (m *msgCall) traced(o Outcome) {
	if t := m.ib.cfg.Tracer; t != nil {
		t.Step(m.msg.Context(), "claim", m.key, m.start, o, m.attempts, nil)
	}
}

// call runs one store call bounded by timeout, times it, and traces it.
func (m *msgCall) call(ctx context.Context, op string, timeout time.Duration, f func(context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	start := time.Now()
	err := f(cctx)
	m.ib.m.StoreCall(op, time.Since(start), err)
	cancel()
	if t := m.ib.cfg.Tracer; t != nil {
		t.Step(ctx, op, m.key, start, "", m.attempts, err)
	}
	return err
}

type ctxKey struct{}

// KeyFromCtx returns the inbox key of the message whose handler got ctx
// (the key inboxctl takes), or "" outside the middleware and for a message
// without an id.
func KeyFromCtx(ctx context.Context) string {
	k, _ := ctx.Value(ctxKey{}).(string)
	return k
}

// runHandler runs the handler with the message's context set to ctx, the
// key in it, and restores it. If the handler panics or exits its goroutine
// (runtime.Goexit), abort runs first, then the panic or the exit goes on.
// When the handler succeeded, the messages it returned get their derived
// ids (deriveOutputs, outputs.go), whatever the flow.
func (m *msgCall) runHandler(ctx context.Context, abort func(why string)) (out []*message.Message, err error) {
	orig := m.msg.Context()
	if m.key != "" {
		ctx = context.WithValue(ctx, ctxKey{}, m.key)
	}
	m.msg.SetContext(ctx)
	returned := false
	defer func() {
		m.msg.SetContext(orig)
		if returned {
			return
		}
		if r := recover(); r != nil {
			abort(fmt.Sprintf("handler panicked: %v", r))
			panic(r)
		}
		abort("handler exited its goroutine (runtime.Goexit)")
	}()
	out, err = m.h(m.msg)
	returned = true
	if err == nil {
		m.deriveOutputs(out)
	}
	return out, err
}

// ---- The leased flow -------------------------------------------------------

// handleLeased claims the key with a lease, runs the handler under it, and
// leaves the mark to the lease's goroutine.
func (m *msgCall) handleLeased() ([]*message.Message, error) {
	ib := m.ib
	ctx := m.msg.Context()
	select {
	case <-m.msg.Acked():
		// Acked before the handler (InstantAck): subscribers cancel the
		// message context at ack, so the claim must not depend on it.
		ctx = context.WithoutCancel(ctx)
	default:
	}
	opts := inbox.BeginOptions{Owner: ib.cfg.Owner, Lease: ib.cfg.Lease, LeaseID: inbox.NewLeaseID()}
	if ib.cfg.PayloadHash != PayloadHashOff {
		sum := sha256.Sum256(m.msg.Payload)
		opts.PayloadHash = hex.EncodeToString(sum[:])
	}
	claim, sent, err := m.claim(ctx, opts)
	m.attempts = claim.Attempts
	if err == errRedelivered {
		return nil, nil // the broker holds a copy until the backoff ends
	}
	if errors.Is(err, inbox.ErrBusy) {
		return nil, err
	}
	if err != nil {
		if err := m.storeFailed(OpTryBegin, err); err != nil {
			return nil, err
		}
		return m.runHandler(m.msg.Context(), func(string) {})
	}
	if claim.PayloadMismatch {
		ib.m.Outcome(m.handler, OutcomePayloadMismatch)
		ib.log.Error("Known inbox key arrived with a different payload", inbox.ErrPayloadMismatch, m.fields())
		if ib.cfg.PayloadHash == PayloadHashReject {
			m.traced(OutcomePayloadMismatch)
			if claim.Status == inbox.Acquired {
				l := m.newLease(claim, opts, sent)
				l.release("payload mismatch", l.failGiveUp())
			}
			return nil, fmt.Errorf("%w: key %q", inbox.ErrPayloadMismatch, m.key)
		}
	}
	switch claim.Status {
	case inbox.Processed:
		return m.duplicate()
	case inbox.Dead:
		return nil, m.dead(claim.Reason, nil)
	case inbox.Acquired:
		m.traced(OutcomeAcquired)
		return m.newLease(claim, opts, sent).run()
	}
	return nil, m.storeFailed(OpTryBegin, fmt.Errorf("store answered status %v", claim.Status))
}

// busySlack is the "little" added to a holder's remaining lease when waiting
// on a busy key, so that a lease ending on time is seen free.
const busySlack = 250 * time.Millisecond

// errRedelivered ends a claim whose message was handed to the broker.
var errRedelivered = errors.New("inbox: handed to the broker's redelivery")

// claim runs TryBegin (through paced) until it gives an answer to act on,
// for at most MaxBusyWait and while ctx lasts. A busy key is polled with
// jittered backoff (20 ms growing to 1 s) for at most the time the
// holder's lease (or the backoff) has left when the answer arrives, plus
// busySlack. A key waiting out a failed attempt's backoff longer than
// RedeliveryMinDelay is handed to Config.Redelivery instead, once: then
// claim returns errRedelivered. sent is the local time the final TryBegin
// was sent: the lease's deadline is reckoned from it.
func (m *msgCall) claim(ctx context.Context, opts inbox.BeginOptions) (c inbox.Claim, sent time.Time, err error) {
	limit := time.Now().Add(m.ib.cfg.MaxBusyWait)
	var waited time.Duration
	defer m.reportWait(WaitBusy, &waited)
	handOff := true
	for retry := 0; ; retry++ {
		err = m.paced(ctx, limit, OpTryBegin, func(ctx context.Context) (err error) {
			sent = time.Now()
			c, err = m.ib.leases.TryBegin(ctx, m.key, opts)
			return err
		})
		if err != nil || c.Status != inbox.Busy {
			return c, sent, err
		}
		if c.BackingOff && handOff && m.redeliverable(c.RetryAfter) {
			handOff = false // a failed hand-off falls back to waiting
			if m.redeliver(c.RetryAfter, c.Attempts, nil) == nil {
				return c, sent, errRedelivered
			}
		}
		// The store reckoned RetryAfter before it replied: from the reply's
		// arrival it is an upper bound (from sent it would fall short by
		// the call's time, which a slow store under load makes longer
		// than busySlack).
		limit = earlier(limit, time.Now().Add(c.RetryAfter+busySlack))
		d := min(busyBackoff.Pause(retry), time.Until(limit))
		if d <= 0 {
			return c, sent, m.busy(c.RetryAfter, c.BackingOff)
		}
		if err := sleep(ctx, d, &waited); err != nil {
			return c, sent, fmt.Errorf("waiting on busy inbox key %q: %w", m.key, err)
		}
	}
}

// The pauses of the middleware's retry loops (outage.Backoff's table lists
// every loop of the library).
var (
	busyBackoff  = outage.Backoff{Min: 20 * time.Millisecond, Max: time.Second}     // polling a busy key
	storeBackoff = outage.Backoff{Min: 50 * time.Millisecond, Max: 2 * time.Second} // a failing store: claims (paced), marks and releases
)

// errPaced is the error of a claim not sent: the store was failing and the
// wait for a slot ended first.
var errPaced = fmt.Errorf("%w: the store is failing; claims are paced", inbox.ErrStoreUnavailable)

// paced makes a claim's store call (TryBegin, BeginTx or IsProcessed),
// retrying it while the store fails, until limit. During an outage the
// claims of the whole Inbox are paced (Inbox.pace): each waits for a slot of
// its own, one jittered pause apart (50 ms doubling to 2 s), so that an
// outage or a misconfigured store costs a few calls a second however many
// messages are in flight, and no message is nacked before MaxBusyWait, which
// would make a redelivery storm. FailOpen does not wait: it prefers running
// the handler.
func (m *msgCall) paced(ctx context.Context, limit time.Time, op string, f func(context.Context) error) error {
	ib := m.ib
	if ib.cfg.FailOpen {
		limit = time.Now()
	}
	var waited time.Duration
	defer m.reportWait(WaitStoreBackoff, &waited)
	for err := errPaced; ; {
		d, ok := ib.pace.Reserve(limit)
		if !ok { // no slot is free before limit
			return cmp.Or(sleep(ctx, time.Until(limit), &waited), err)
		}
		if err := sleep(ctx, d, &waited); err != nil {
			return err
		}
		if err = m.call(ctx, op, ib.cfg.StoreTimeout, f); err == nil {
			ib.pace.OK()
			ib.health.OK()
			return nil
		}
		if !retryable(ctx, err) {
			return err
		}
		ib.pace.Failed()
		ib.health.Fail("Inbox store failed; claims back off", err, m.fields())
		if !time.Now().Before(limit) {
			return err
		}
	}
}

// reportWait reports the time the claim waited, if any, to Metrics.Waited.
func (m *msgCall) reportWait(reason string, waited *time.Duration) {
	if *waited > 0 {
		m.ib.m.Waited(m.handler, reason, *waited)
	}
}

// retryable reports whether a failed store call may succeed if repeated:
// not bad input, not a closed store, not a busy key, not the end of ctx.
func retryable(ctx context.Context, err error) bool {
	return !errors.Is(err, inbox.ErrInvalidArgument) && !errors.Is(err, inbox.ErrClosed) &&
		!errors.Is(err, inbox.ErrNotSupported) && !errors.Is(err, inbox.ErrBusy) && ctx.Err() == nil
}

// lease is one acquired key, from its claim to its Complete or Release.
// Every store call on it after the claim is made by its goroutine, watch,
// so they never race each other.
type lease struct {
	msgCall
	id        string
	base      context.Context // the message's values, without its cancellation
	cancel    context.CancelCauseFunc
	length    time.Duration // granted
	interval  time.Duration // heartbeat period
	deadline  time.Time     // when the lease ends unless renewed (monotonic)
	lost      bool          // the lease is no longer ours
	killed    bool          // the failed attempt marked the key dead
	permanent bool          // the handler's error is inbox.Permanent: dead at once
	backoff   time.Duration // the failed attempt's, when Fail landed

	handled  chan string    // "" when the handler succeeded, else why it failed
	released sync.WaitGroup // done when watch has released after a failed handler
}

// errHandlerReturned cancels the handler's context once the lease is over.
var errHandlerReturned = errors.New("inbox: handler returned")

func (m *msgCall) newLease(claim inbox.Claim, opts inbox.BeginOptions, sent time.Time) *lease {
	granted := claim.Lease
	if granted <= 0 {
		granted = opts.Lease
	}
	interval := m.ib.cfg.HeartbeatInterval
	if interval >= granted {
		interval = granted / 3
	}
	return &lease{
		msgCall: *m, id: claim.LeaseID, base: context.WithoutCancel(m.msg.Context()),
		length: granted, interval: interval, deadline: sent.Add(granted),
		handled: make(chan string, 1),
	}
}

// run executes the handler under the lease, which watch keeps alive.
func (l *lease) run() ([]*message.Message, error) {
	hctx, cancel := context.WithCancelCause(l.msg.Context())
	l.cancel = cancel
	l.ib.pending.Add(1) // the lease's, until watch is done
	go l.watch()
	out, err := l.runHandler(hctx, l.failed)
	if err != nil {
		// Synchronous: Kafka's subscriber redelivers in-process at once, so
		// the key must be given back before the middleware returns.
		l.permanent = errors.Is(err, inbox.ErrPermanent)
		l.failed(err.Error())
		if n := l.ib.cfg.MaxAttempts; l.killed {
			return out, l.dead(inbox.TruncateReason(err.Error(), 512), err)
		} else if l.backoff > 0 && l.redeliverable(l.backoff) && l.redeliver(l.backoff, l.attempts, err) == nil {
			return nil, nil // the broker holds a copy until the backoff ends
		} else if n > 0 {
			// Transient: a filtered poison queue lets the broker redeliver it.
			return out, &inbox.AttemptError{Key: l.key, Attempt: l.attempts, MaxAttempts: n, RetryAfter: l.backoff, Err: err}
		}
		return out, err
	}
	// The handler's context stays live until the router acks or nacks: the
	// messages it returned may be published with it.
	l.handled <- ""
	return out, nil
}

// failed tells watch that the handler failed (why) and waits for the Fail.
func (l *lease) failed(why string) {
	l.cancel(errHandlerReturned)
	l.released.Add(1)
	l.handled <- why
	l.released.Wait()
}

// watch is the lease's goroutine. While the handler runs it renews the
// lease every interval, and cancels the handler's context if the lease is
// lost. When the handler fails it releases the lease at once. When the
// handler succeeded it keeps renewing until the router's verdict: Complete
// on ack, Release on nack, or Release when Close gives up waiting.
func (l *lease) watch() {
	defer l.ib.pending.Done()
	defer l.cancel(errHandlerReturned)
	beat := time.NewTimer(l.interval)
	defer beat.Stop()
	var acked, nacked, abandon <-chan struct{} // set once the handler succeeded
	handled := l.handled
	for {
		select {
		case why := <-handled:
			if why != "" {
				l.fail(why)
				l.released.Done()
				return
			}
			handled, acked, nacked, abandon = nil, l.msg.Acked(), l.msg.Nacked(), l.ib.abandon
		case <-acked:
			l.complete()
			return
		case <-nacked:
			l.release("message nacked", l.deadline)
			return
		case <-abandon:
			l.release("middleware closed before the mark", time.Now())
			return
		case <-beat.C:
			if next, ok := l.extend(); ok {
				beat.Reset(next)
			}
		}
	}
}

// extend renews the lease. It returns when to renew next, or false when the
// lease is lost (the handler's context is then canceled) and no more
// heartbeats are due.
func (l *lease) extend() (time.Duration, bool) {
	left := time.Until(l.deadline)
	if left <= 0 {
		l.lose(fmt.Errorf("%w: lease of key %q was not renewed before its deadline", inbox.ErrLeaseLost, l.key))
		return 0, false
	}
	if l.ib.extendOff.Load() {
		return left, true // wake at the deadline to cancel the handler
	}
	sent := time.Now()
	err := l.call(l.base, OpExtend, min(l.ib.cfg.StoreTimeout, left), func(ctx context.Context) error {
		_, err := l.ib.leases.Extend(ctx, l.key, l.id, l.length)
		return err
	})
	switch {
	case err == nil:
		l.ib.health.OK()
		l.deadline = sent.Add(l.length)
		return l.interval, true
	case errors.Is(err, inbox.ErrLeaseLost):
		l.lose(fmt.Errorf("heartbeat of key %q: %w", l.key, err))
		return 0, false
	case errors.Is(err, inbox.ErrNotSupported):
		if l.ib.extendOff.CompareAndSwap(false, true) {
			l.ib.log.Info("Inbox store cannot extend leases: heartbeats off; a handler still running when its lease ends is canceled", nil)
		}
		return max(time.Until(l.deadline), 0), true
	}
	l.ib.m.Outcome(l.handler, OutcomeStoreError)
	l.ib.health.Fail("Inbox heartbeat failed; retrying until the lease deadline", err, l.fields())
	return min(max(l.interval/4, 10*time.Millisecond), max(time.Until(l.deadline), 0)), true
}

// lose cancels the handler's context: this consumer no longer holds the key.
func (l *lease) lose(cause error) {
	l.lost = true
	l.cancel(cause)
	l.ib.m.Outcome(l.handler, OutcomeLeaseLost)
	l.ib.log.Error("Inbox lease lost; handler context canceled", cause, l.fields())
}

// complete marks the key processed under the lease, retrying a failure
// until the lease ends. No heartbeat runs meanwhile: Complete is what
// matters now, and repeating it is safe (a Complete whose reply was lost
// succeeds again), where an Extend after a Complete that landed unseen
// would report the key's own lease as lost.
func (l *lease) complete() {
	err := l.ib.persist(&l.msgCall, l.base, OpComplete, l.deadline, func(ctx context.Context) error {
		return l.ib.leases.Complete(ctx, l.key, l.id)
	})
	l.ib.marked(&l.msgCall, err, l.lost)
	if errors.Is(err, errAbandoned) {
		l.release("middleware closed before the mark", time.Now())
	}
}

// failGiveUp is how long a release after a failed handler is retried: the
// middleware returns only then (Kafka redelivers in-process at once), so
// for at most MaxBusyWait.
func (l *lease) failGiveUp() time.Time {
	return earlier(l.deadline, time.Now().Add(l.ib.cfg.MaxBusyWait))
}

// release gives the lease back unmarked, unless it was lost already,
// retrying a failure until giveUp: a key left claimed waits for its lease
// to end before the next delivery can run it.
func (l *lease) release(why string, giveUp time.Time) {
	l.giveBack(OpRelease, why, giveUp, func(ctx context.Context) error {
		return l.ib.leases.Release(ctx, l.key, l.id)
	})
}

// fail ends the failed attempt (why: the handler's error): the store keeps
// the key from the next attempt for Config.Backoff, or marks it dead when
// this attempt was the last one allowed (Config.MaxAttempts). A store
// without Fail (an older remote service) releases instead.
func (l *lease) fail(why string) {
	if l.lost {
		return
	}
	cfg := l.ib.cfg
	opts := inbox.FailOptions{Reason: inbox.TruncateReason(why, 512)}
	if opts.Dead = l.permanent || cfg.MaxAttempts > 0 && l.attempts >= cfg.MaxAttempts; !opts.Dead {
		opts.RetryAfter = cfg.Backoff(l.attempts)
	}
	err := l.giveBack(OpFail, why, l.failGiveUp(), func(ctx context.Context) error {
		return l.ib.leases.Fail(ctx, l.key, l.id, opts)
	})
	if errors.Is(err, inbox.ErrNotSupported) {
		l.release(why, l.failGiveUp())
	}
	l.killed = opts.Dead && err == nil
	if err == nil {
		l.backoff = opts.RetryAfter
	}
}

// giveBack makes a Release or a Fail through persist, and logs its end.
func (l *lease) giveBack(op, why string, giveUp time.Time, f func(context.Context) error) error {
	if l.lost {
		return nil
	}
	err := l.ib.persist(&l.msgCall, l.base, op, giveUp, f)
	fields := l.fields().Add(watermill.LogFields{"reason": why})
	switch {
	case err == nil:
		l.ib.m.Outcome(l.handler, OutcomeReleased)
		l.ib.log.Debug("Inbox lease given back", fields)
	case errors.Is(err, inbox.ErrLeaseLost):
		l.ib.log.Debug("Inbox lease already gone when given back", fields)
	case errors.Is(err, inbox.ErrNotSupported):
	default:
		l.ib.health.Fail("Inbox "+op+" failed; the key stays claimed until its lease ends", err, fields)
	}
	return err
}

// ---- After the handler: the mark and the release, shared by the flows ---

var errAbandoned = errors.New("inbox: middleware closed before the mark")

// persist makes a store call after the handler (the mark, or a release),
// retrying a failure with jittered backoff (storeBackoff: 50 ms growing
// to 2 s) until it lands, the store answers ErrLeaseLost, giveUp
// passes, or Close gives up waiting (errAbandoned). A failed mark never
// nacks the message: that would run the handler again. It returns nil when
// the call landed, else the last error.
func (ib *Inbox) persist(m *msgCall, base context.Context, op string, giveUp time.Time, f func(context.Context) error) (err error) {
	if err = m.call(base, op, ib.cfg.StoreTimeout, f); err == nil {
		ib.health.OK()
		return nil
	}
	// The retries are a function of their own, so that the lease
	// goroutine's stack stays small enough not to grow on every message's
	// path (BENCHMARKS.md, "The lease goroutine's stack").
	return ib.retry(m, base, op, giveUp, f, err)
}

func (ib *Inbox) retry(m *msgCall, base context.Context, op string, giveUp time.Time, f func(context.Context) error, err error) error {
	for retry := 0; ; retry++ {
		if errors.Is(err, inbox.ErrLeaseLost) || !retryable(base, err) {
			return err
		}
		ib.m.Outcome(m.handler, OutcomeStoreError)
		wait := storeBackoff.Pause(retry)
		if time.Until(giveUp) < wait {
			return err
		}
		if op == OpComplete || op == OpMarkProcessed {
			ib.m.Outcome(m.handler, OutcomeCompleteRetry)
		}
		ib.health.Fail("Inbox store call after the handler failed; retrying in the background", err,
			m.fields().Add(watermill.LogFields{"op": op}))
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ib.abandon:
			t.Stop()
			return errAbandoned
		}
		if err = m.call(base, op, ib.cfg.StoreTimeout, f); err == nil {
			ib.health.OK()
			return nil
		}
	}
}

// marked counts and logs the end of a mark made by persist. lost says the
// lease was reported lost already.
func (ib *Inbox) marked(m *msgCall, err error, lost bool) {
	switch {
	case err == nil:
		ib.m.Outcome(m.handler, OutcomeProcessed)
	case errors.Is(err, errAbandoned):
	case errors.Is(err, inbox.ErrLeaseLost):
		if !lost {
			ib.m.Outcome(m.handler, OutcomeLeaseLost)
		}
		ib.log.Error("Handler succeeded but its inbox lease was lost before the mark: a redelivery may run it again", err, m.fields())
	default:
		ib.m.Outcome(m.handler, OutcomeCompleteFailed)
		ib.health.Fail("Inbox mark failed until the lease ended: a redelivery will run the handler again", err, m.fields())
	}
}

// ---- The plain flow (an inbox.Store without leases) -----------------------

// handlePlain is the ADR's flow: IsProcessed, run, MarkProcessed once the
// router acks. Two concurrent deliveries of one message can both pass
// IsProcessed and both run the handler.
func (m *msgCall) handlePlain() ([]*message.Message, error) {
	ib := m.ib
	var done bool
	err := m.paced(m.msg.Context(), time.Now().Add(ib.cfg.MaxBusyWait), OpIsProcessed, func(ctx context.Context) (err error) {
		done, err = ib.cfg.Store.IsProcessed(ctx, m.key)
		return err
	})
	if err != nil {
		if err := m.storeFailed(OpIsProcessed, err); err != nil {
			return nil, err
		}
	}
	if done {
		return m.duplicate()
	}
	m.traced(OutcomeAcquired)
	out, err := m.runHandler(m.msg.Context(), func(string) {})
	if err != nil {
		return out, err
	}
	ib.pending.Add(1)
	go func() {
		defer ib.pending.Done()
		select {
		case <-m.msg.Acked():
		case <-m.msg.Nacked():
			ib.m.Outcome(m.handler, OutcomeReleased)
			return
		case <-ib.abandon:
			return
		}
		err := ib.persist(m, context.WithoutCancel(m.msg.Context()), OpMarkProcessed, time.Now().Add(ib.cfg.Lease), func(ctx context.Context) error {
			return ib.cfg.Store.MarkProcessed(ctx, m.key)
		})
		ib.marked(m, err, false)
	}()
	return out, nil
}

// ---- The transactional flow (a TxStore) -----------------------------------

// handleTx claims the key in a transaction of the store's, which the
// handler runs in, and commits the mark with the handler's writes. Without
// a key, the transaction holds no claim.
func (m *msgCall) handleTx() ([]*message.Message, error) {
	// The store bounds the wait on a concurrent claim by its lock timeout,
	// and the transaction lives on in the handler: it is begun with the
	// message context, not the call's StoreTimeout.
	var claim TxClaim
	err := m.paced(m.msg.Context(), time.Now().Add(m.ib.cfg.MaxBusyWait), OpTryBegin, func(context.Context) (err error) {
		claim, err = m.ib.txs.BeginTx(m.msg.Context(), m.key)
		return err
	})
	var be *inbox.BusyError
	switch {
	case errors.As(err, &be):
		return nil, m.busy(be.RetryAfter, be.BackingOff)
	case errors.Is(err, inbox.ErrBusy):
		return nil, m.busy(0, false)
	case err != nil:
		return nil, m.storeFailed(OpTryBegin, err)
	case claim.Status == inbox.Processed:
		return m.duplicate()
	}
	return m.runTx(claim)
}

// runTx runs the handler in the claim's transaction and ends it. Processed
// and released are counted only for a claimed key (a message without a key
// was counted as no_key).
func (m *msgCall) runTx(claim TxClaim) ([]*message.Message, error) {
	claimed := m.key != ""
	if claimed {
		m.traced(OutcomeAcquired)
	}
	count := func(o Outcome) {
		if claimed || o == OutcomeStoreError {
			m.ib.m.Outcome(m.handler, o)
		}
	}
	out, err := m.runHandler(claim.Context, func(why string) {
		_ = claim.Finish(nil, errors.New("inbox: "+why))
		count(OutcomeReleased)
	})
	if err != nil {
		count(OutcomeReleased)
		err = claim.Finish(nil, err)
		// The store counts no attempts: the copies do (MetadataAttempts).
		if n := attemptsOf(m.msg) + 1; claimed && !errors.Is(err, inbox.ErrPermanent) && m.ib.cfg.Redelivery != nil {
			if d := m.ib.cfg.Backoff(n); m.redeliverable(d) && m.redeliver(d, n, err) == nil {
				return nil, nil // rolled back; the broker holds a copy until the backoff ends
			}
		}
		return nil, err
	}
	// The commit, timed and traced as a store call; Finish takes no context.
	err = m.call(m.msg.Context(), OpComplete, m.ib.cfg.StoreTimeout, func(context.Context) error { return claim.Finish(out, nil) })
	switch {
	case err == nil:
		count(OutcomeProcessed)
	case errors.Is(err, inbox.ErrStoreUnavailable):
		count(OutcomeStoreError)
	default:
		count(OutcomeReleased)
	}
	return nil, err
}

// ---- Close and the count of pending marks ---------------------------------

// Close stops accepting messages and waits until every pending mark has
// landed: the Complete of each message whose handler succeeded and that the
// router acked, or its Release when nacked. Call it after the router has
// stopped. When ctx ends first, Close gives the remaining leases back (those
// keys are then handled again on redelivery) and returns an error wrapping
// ctx.Err() without waiting for those releases (each is bounded by
// StoreTimeout). Messages arriving after Close fail with [inbox.ErrClosed].
func (ib *Inbox) Close(ctx context.Context) error {
	ib.mu.Lock()
	ib.closed = true
	ib.mu.Unlock()
	drained := make(chan struct{})
	go func() { ib.pending.Wait(); close(drained) }()
	select {
	case <-drained:
		return nil
	case <-ctx.Done():
	}
	ib.abandonOnce.Do(func() { close(ib.abandon) })
	ib.log.Error("Inbox closing before every pending mark landed; giving their leases back", ctx.Err(), nil)
	return fmt.Errorf("inbox middleware: closed before every pending mark landed; the others are abandoned: %w", ctx.Err())
}

// track counts a message in flight; false once closed. A mark left pending
// after the handler returned holds a count of its own, added while the
// message's count is held.
func (ib *Inbox) track() bool {
	ib.mu.RLock()
	defer ib.mu.RUnlock()
	if !ib.closed {
		ib.pending.Add(1)
	}
	return !ib.closed
}

var errClosed = fmt.Errorf("inbox middleware: %w", inbox.ErrClosed)

// ---- Small helpers ---------------------------------------------------------

// sleep waits for d, adding it to total, or until ctx ends.
func sleep(ctx context.Context, d time.Duration, total *time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		*total += d
		return nil
	}
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// IsTransient reports whether err, returned by the middleware, means "try
// again later" rather than "this message is bad": the key was busy, the
// store was unavailable, the middleware was closing, or (with
// Config.MaxAttempts) an attempt failed that was not the last one allowed
// ([inbox.ErrAttemptFailed]). A dead key ([inbox.ErrDead]) is not
// transient, nor is a handler's error without MaxAttempts. Use it to keep
// such messages out of a poison queue, which would ack them and lose their
// only copy:
//
//	poison, err := wmw.PoisonQueueWithFilter(pub, "poison", func(err error) bool {
//		return !inboxmw.IsTransient(err)
//	})
func IsTransient(err error) bool {
	if errors.Is(err, inbox.ErrDead) {
		return false // whatever the handler's error it wraps
	}
	return errors.Is(err, inbox.ErrAttemptFailed) || errors.Is(err, inbox.ErrBusy) || errors.Is(err, inbox.ErrStoreUnavailable) ||
		errors.Is(err, inbox.ErrClosed) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
