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
	"github.com/watermill-inbox/inbox/stores/driver"
)

// This file is the path of one message, top to bottom: its key, the claim,
// the handler, and the mark (a success) or the Fail (a failed attempt).
// handle picks one of two flows by the kind of store: the lease flow
// (handleLeased, for an inbox.LeaseStore, and for a plain inbox.Store
// through plainLeases, plain.go) or the transactional one (handleTx, a
// TxStore, txstore.go). No goroutine and no timer is started for a
// message: while the handler runs, the Inbox's keeper (keeper.go) renews
// its lease (lease.go); once the router acked the message, the keeper
// hands the mark to the store without waiting (lease.sendEnd), and its
// answer comes back to lease.endAnswered.

// Inbox is the inbox middleware. Build it with [New], add
// [Inbox.Middleware] to a router, and [Inbox.Close] it after the router has
// stopped. It is safe for concurrent use by any number of handlers and
// routers.
type Inbox struct {
	cfg       Config
	leases    inbox.LeaseStore // the store, a plain one through plainLeases; nil for a TxStore
	txs       TxStore          // the store, when it is a TxStore
	async     goer             // makes the calls after a handler without waiting
	stopAsync func()           // stops async's workers, when it has its own (plain.go)
	bound     time.Duration    // StoreTimeout, for a store that does not bound its calls
	keys      *keying.Prepared // bus and group checked and escaped once, by New
	keep      *keeper          // the live leases (nil for a TxStore)
	log       watermill.LoggerAdapter
	m         Metrics

	mu          sync.RWMutex
	closed      bool
	pending     sync.WaitGroup // messages in flight, and marks not yet landed
	abandon     chan struct{}  // closed when Close stops waiting for pending marks
	abandonOnce sync.Once

	extendOff atomic.Bool  // the store answered Extend with ErrNotSupported
	health    *outage.Log  // rate-limits the logs of store failures
	handOff   *outage.Log  // rate-limits the logs of failed hand-offs to Config.Redelivery
	staleLog  *outage.Log  // rate-limits the logs of stale messages
	pace      outage.Pacer // spaces the claims of a failing store

	retention inbox.RetentionReporter // the store, when it reports its retention
	orders    inbox.OrderAdmin        // the store, when Config.OrderKey is set
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
	ib := &Inbox{cfg: cfg, keys: keys, m: cfg.Metrics, abandon: make(chan struct{}), pace: outage.Pacer{Backoff: storeBackoff},
		log: cfg.Logger.With(watermill.LogFields{"inbox_bus": cfg.Bus, "inbox_group": cfg.Group})}
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
		ib.leases = plainLeases{s}
		ib.log.Info("Inbox store has no leases: concurrent deliveries of one message can both run the handler", nil)
	}
	if cfg.OrderKey != nil {
		oa, ok := cfg.Store.(inbox.OrderAdmin)
		if ib.txs != nil || !ok || !oa.KeepsOrder() {
			return nil, fmt.Errorf("%w: inbox middleware: Config.OrderKey is set, and the store (%T) does not keep the order of order keys",
				inbox.ErrNotSupported, cfg.Store)
		}
		ib.orders = oa
	}
	if ib.txs == nil {
		if g, ok := cfg.Store.(goer); ok {
			ib.async = g
		} else {
			w := newWorkers(ib.leases, cfg.StoreTimeout)
			ib.async, ib.stopAsync, ib.bound = w, w.Close, cfg.StoreTimeout
			if _, plain := ib.leases.(plainLeases); !plain {
				ib.log.Info("Inbox store has no Go method (a store of your own, or a wrapper that hides it): its marks and heartbeats run on the inbox's own workers", nil)
			}
		}
		ib.keep = newKeeper(ib)
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

// msgCall is one message going through the middleware, owned by the
// message's goroutine. The lease its claim acquired is a value of its own
// (lease.go), which the keeper shares once the handler runs.
type msgCall struct {
	ib       *Inbox
	h        message.HandlerFunc
	msg      *message.Message
	handler  string
	key      string
	order    string    // the store's order key (orderOf), "" for none
	behind   bool      // the claim's latest answer was Behind: a hand-off counts in MetadataBehind
	attempts int       // the key's attempts, as the claim returned them
	start    time.Time // for Config.Tracer
	lease    *lease    // the lease acquired; nil before, and without one
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
	if m.order, err = ib.orderOf(msg, key); err != nil {
		m.trace("key_error")
		ib.log.Error("Cannot read the message's order key (Config.OrderKey); message nacked", err, m.fields())
		return nil, err
	}
	if !ib.track() {
		m.trace("closed")
		return nil, errClosed
	}
	defer ib.pending.Done()
	if err := m.checkStale(); err != nil {
		return nil, err
	}
	if ib.txs != nil {
		return m.handleTx()
	}
	return m.handleLeased()
}

func (m *msgCall) fields() watermill.LogFields {
	f := logFields(m.msg, m.handler, m.key)
	if m.order != "" {
		f["inbox_order_key"] = m.order
	}
	return f
}

// logFields are the fields of the logs about msg.
func logFields(msg *message.Message, handler, key string) watermill.LogFields {
	f := watermill.LogFields{"message_uuid": msg.UUID, "handler_name": handler}
	if key != "" {
		f["inbox_key"] = key
	}
	return f
}

// keyError handles a message whose key cannot be built.
func (m *msgCall) keyError(err error) ([]*message.Message, error) {
	ib := m.ib
	if !errors.Is(err, inbox.ErrNoKey) {
		// A configuration problem (no alias, oversized segments): refusing
		// keeps the message for a fixed deployment.
		m.trace("key_error")
		ib.log.Error("Cannot build the inbox key; message nacked", err, m.fields())
		return nil, err
	}
	m.report(OutcomeNoKey)
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

// claimFailed counts and logs a claim that failed for good. It returns the
// error to return, or nil under FailOpen: the caller then runs the handler
// without deduplication.
func (m *msgCall) claimFailed(op string, err error) error {
	if ctx := m.msg.Context(); ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		m.trace("canceled")
		return err // shutting down: the router does not log cancellations
	}
	m.ib.m.Outcome(m.handler, OutcomeStoreError)
	if !errors.Is(err, inbox.ErrStoreUnavailable) && !errors.Is(err, context.Canceled) {
		err = fmt.Errorf("%w: inbox %s %q: %w", inbox.ErrStoreUnavailable, op, m.key, err)
	} else {
		err = fmt.Errorf("inbox %s %q: %w", op, m.key, err)
	}
	if m.ib.cfg.FailOpen {
		m.report(OutcomeFailOpen)
		m.ib.health.Fail("Inbox store failed; processing WITHOUT deduplication (FailOpen)", err, m.fields())
		return nil
	}
	m.trace(OutcomeStoreError)
	m.ib.health.Fail("Inbox store failed; message nacked for redelivery", err, m.fields())
	return err
}

// duplicate acks a message whose key is processed, without the handler.
func (m *msgCall) duplicate() ([]*message.Message, error) {
	m.report(OutcomeDuplicate)
	m.ib.log.Debug("Duplicate message skipped: key already processed", m.fields())
	return nil, nil
}

// busy reports a key that stayed busy for the whole wait: held by a lease,
// waiting out a failed attempt's backoff, or behind an earlier message of
// its order key.
func (m *msgCall) busy(retryAfter time.Duration, backingOff bool) error {
	fields := m.fields().Add(watermill.LogFields{"retry_after": retryAfter.String(), "backing_off": backingOff})
	if m.behind {
		m.report(OutcomeBehind)
		m.ib.log.Info("Inbox key waits behind an earlier message of its order key; message nacked for redelivery", fields)
	} else {
		m.report(OutcomeBusy)
		m.ib.log.Info("Inbox key busy (another consumer's lease, or a failed attempt's backoff); message nacked for redelivery", fields)
	}
	return &inbox.BusyError{Key: m.key, RetryAfter: retryAfter, BackingOff: backingOff}
}

// dead reports a dead key: err is the handler's error when this attempt
// made it dead, nil for a later delivery, whose error then wraps the
// reason the store kept.
func (m *msgCall) dead(reason string, err error) error {
	m.report(OutcomeDead)
	msg := "Inbox key is dead: message refused without running the handler (inboxctl forget replays it)"
	if err != nil {
		msg = "Handler failed on the last attempt allowed (MaxAttempts): inbox key marked dead"
	} else if reason != "" {
		err = errors.New(reason)
	}
	m.ib.log.Error(msg, err, m.fields().Add(watermill.LogFields{"attempts": m.attempts, "reason": reason}))
	return &inbox.DeadError{Key: m.key, Attempts: m.attempts, Reason: reason, Err: err}
}

// report counts how the claim was settled, and traces it.
func (m *msgCall) report(o Outcome) {
	m.ib.m.Outcome(m.handler, o)
	m.trace(o)
}

// trace reports how the claim was settled to Config.Tracer.
func (m *msgCall) trace(o Outcome) {
	if t := m.ib.cfg.Tracer; t != nil {
		t.Step(m.msg.Context(), "claim", m.key, m.start, o, m.attempts, nil)
	}
}

// storeCall makes one store call and waits for it (bounded by StoreTimeout
// for a store that does not bound its calls itself), times it and traces
// it.
func (m *msgCall) storeCall(ctx context.Context, op string, f func(context.Context) error) error {
	start, cctx := time.Now(), ctx
	if m.ib.bound > 0 {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, m.ib.bound)
		defer cancel()
	}
	err := f(cctx)
	m.ib.reportCall(ctx, op, m.key, m.attempts, start, err)
	return err
}

// reportCall reports a store call of key's that ran from start, with its
// error, to Metrics and Config.Tracer.
func (ib *Inbox) reportCall(ctx context.Context, op, key string, attempts int, start time.Time, err error) {
	ib.m.StoreCall(op, time.Since(start), err)
	if t := ib.cfg.Tracer; t != nil {
		t.Step(ctx, op, key, start, "", attempts, err)
	}
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

// ---- The lease flow --------------------------------------------------------

// handleLeased claims the key with a lease and runs the handler under it.
// A plain Store comes here too, through plainLeases: its claim is
// IsProcessed, its mark MarkProcessed, and nothing stops two concurrent
// deliveries of one message from both running the handler.
func (m *msgCall) handleLeased() ([]*message.Message, error) {
	ib := m.ib
	ctx := m.msg.Context()
	if acked(m.msg) {
		// Acked before the handler (InstantAck): subscribers cancel the
		// message context at ack, so the claim must not depend on it.
		ctx = context.WithoutCancel(ctx)
	}
	opts := inbox.BeginOptions{Owner: ib.cfg.Owner, Lease: ib.cfg.Lease, LeaseID: inbox.NewLeaseID(), OrderKey: m.order,
		Retry: m.msg.Metadata.Get(MetadataAttempts) != ""} // a copy of a failed attempt
	if ib.cfg.PayloadHash != PayloadHashOff {
		sum := sha256.Sum256(m.msg.Payload)
		opts.PayloadHash = hex.EncodeToString(sum[:])
	}
	claim, sent, err := m.claim(ctx, opts)
	m.attempts = claim.Attempts
	switch {
	case err == errRedelivered:
		return nil, nil // the broker holds a copy until the backoff ends
	case errors.Is(err, inbox.ErrBusy):
		return nil, err
	case err != nil:
		if err := m.claimFailed(OpTryBegin, err); err != nil {
			return nil, err
		}
		return m.runHandler(m.msg.Context(), func(string) {})
	}
	if claim.Status == inbox.Acquired {
		m.lease = newLease(m, claim, opts, sent)
	}
	if claim.PayloadMismatch {
		ib.m.Outcome(m.handler, OutcomePayloadMismatch)
		ib.log.Error("Known inbox key arrived with a different payload", inbox.ErrPayloadMismatch, m.fields())
		if ib.cfg.PayloadHash == PayloadHashReject {
			m.trace(OutcomePayloadMismatch)
			if claim.Status == inbox.Acquired {
				l := m.lease // not yet held by the keeper
				m.giveBack(OpRelease, "payload mismatch", l.deadline, func(ctx context.Context) error { return ib.leases.Release(ctx, m.key, l.id) })
			}
			return nil, fmt.Errorf("%w: key %q", inbox.ErrPayloadMismatch, m.key)
		}
	}
	switch claim.Status {
	case inbox.Processed:
		return m.duplicate()
	case inbox.Dead:
		if m.order != "" && ib.cfg.OrderOnDead == OrderOnDeadSkip {
			// A copy of a dead message: its order key may still wait on it
			// (the consumer that killed it stopped first, or ran under
			// OrderOnDeadBlock).
			m.skipDeadOrder(context.WithoutCancel(ctx), false)
		}
		return nil, m.dead(claim.Reason, nil)
	case inbox.Acquired:
		m.trace(OutcomeAcquired)
		return m.run()
	}
	return nil, m.claimFailed(OpTryBegin, fmt.Errorf("store answered status %v", claim.Status))
}

// acked reports whether the router (or InstantAck) acked msg already.
func acked(msg *message.Message) bool {
	select {
	case <-msg.Acked():
		return true
	default:
		return false
	}
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
	// The busy wait runs from the first pause to the claim's end: the polls
	// between pauses are waiting too (a slow store's count as much as the
	// pauses), so it is the elapsed time, not the sum of the pauses.
	var waitedFrom time.Time
	defer func() {
		if !waitedFrom.IsZero() {
			m.ib.m.Waited(m.handler, WaitBusy, time.Since(waitedFrom))
		}
	}()
	handOff := true
	for retry := 0; ; retry++ {
		err = m.paced(ctx, limit, OpTryBegin, func(ctx context.Context) (err error) {
			sent = time.Now()
			c, err = m.ib.leases.TryBegin(ctx, m.key, opts)
			return err
		})
		m.behind = err == nil && c.Status == inbox.Behind
		if err != nil || c.Status != inbox.Busy && c.Status != inbox.Behind {
			return c, sent, err
		}
		if m.behind {
			// Waiting behind an earlier message of its order key: its
			// turn comes once that one is processed, at a time nobody
			// knows (behindDelay).
			c.RetryAfter, c.BackingOff = m.behindDelay(c.RetryAfter), true
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
		if waitedFrom.IsZero() {
			waitedFrom = time.Now()
		}
		if err := sleep(ctx, d, nil); err != nil {
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
		if err = m.storeCall(ctx, op, f); err == nil {
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

// errHandlerReturned cancels the handler's context once the lease is over.
var errHandlerReturned = errors.New("inbox: handler returned")

// run executes the handler under the lease, which the keeper renews while
// the handler runs. A handler that succeeded is marked once the router
// acked its message (the keeper watches for the verdict: a failed publish
// of the messages it returned, or a middleware outside the inbox that
// turned the success into an error, nacks, and the handler must run
// again), or at once when the message was acked already (InstantAck). A
// message with an order key whose handler returned no messages is marked
// before the ack instead (markBeforeAck). A handler that failed ends its
// attempt before run returns.
func (m *msgCall) run() ([]*message.Message, error) {
	l := m.lease
	var hctx context.Context
	hctx, l.cancel = context.WithCancelCause(m.msg.Context())
	m.ib.pending.Add(1) // the lease's, until its mark or release is done
	m.ib.keep.hold(l)   // from here on, the keeper shares l (lease.go)
	out, err := m.runHandler(hctx, m.handlerAborted)
	switch {
	case err != nil:
		return m.handlerFailed(out, err)
	case m.order != "" && len(out) == 0 && !acked(m.msg):
		l.markBeforeAck()
	case !acked(m.msg):
		// The handler's context stays live until the router acks or
		// nacks: the messages it returned may be published with it.
		m.ib.keep.awaitVerdict(l)
	default:
		l.endLease(driver.Complete, "")
	}
	return out, nil
}

// ---- A failed attempt -------------------------------------------------------

// handlerFailed ends an attempt whose handler returned err, in the
// handler's goroutine: the store keeps the key for its backoff or marks it
// dead (failAttempt), then the message is handed to the broker's delay
// (Config.Redelivery), or its error returned for the broker to redeliver.
// The Fail is synchronous: Kafka's subscriber redelivers in-process at once,
// so the key must be given back before the middleware returns.
func (m *msgCall) handlerFailed(out []*message.Message, err error) ([]*message.Message, error) {
	dead, backoff := m.failAttempt(err.Error(), errors.Is(err, inbox.ErrPermanent))
	n := m.ib.cfg.MaxAttempts
	switch {
	case dead:
		return out, m.dead(inbox.TruncateReason(err.Error(), 512), err)
	case backoff > 0 && m.redeliverable(backoff) && m.redeliver(backoff, m.attempts, err) == nil:
		return nil, nil // the broker holds a copy until the backoff ends
	case n > 0:
		// Transient: a filtered poison queue lets the broker redeliver it.
		return out, &inbox.AttemptError{Key: m.key, Attempt: m.attempts, MaxAttempts: n, RetryAfter: backoff, Err: err}
	}
	return out, err
}

// handlerAborted ends an attempt whose handler panicked or exited its
// goroutine.
func (m *msgCall) handlerAborted(why string) { m.failAttempt(why, false) }

// failAttempt takes the lease back from the keeper after a failed handler
// (why) and, unless it was lost, gives it back with the store's Fail: the
// store keeps the key from the next attempt for Config.Backoff, or marks
// it dead when this attempt was the last one allowed (Config.MaxAttempts)
// or the error is permanent. It reports whether the key is dead and the
// backoff the store holds. A store that counts no attempts (a plain
// Store: the claim's Attempts is 0) holds neither. A store without Fail
// (an older remote service) releases instead.
func (m *msgCall) failAttempt(why string, permanent bool) (dead bool, backoff time.Duration) {
	l := m.lease
	lost, deadline := m.ib.keep.drop(l)
	l.cancel(errHandlerReturned)
	defer m.ib.pending.Done()
	if lost {
		return false, 0
	}
	cfg := m.ib.cfg
	opts := inbox.FailOptions{Reason: inbox.TruncateReason(why, 512), OrderKey: m.order}
	if m.attempts > 0 {
		if opts.Dead = permanent || cfg.MaxAttempts > 0 && m.attempts >= cfg.MaxAttempts; !opts.Dead {
			opts.RetryAfter = cfg.Backoff(m.attempts)
		}
	}
	err := m.giveBack(OpFail, why, deadline, func(ctx context.Context) error { return m.ib.leases.Fail(ctx, m.key, l.id, opts) })
	if errors.Is(err, inbox.ErrNotSupported) {
		opts = inbox.FailOptions{}
		err = m.giveBack(OpRelease, why, deadline, func(ctx context.Context) error { return m.ib.leases.Release(ctx, m.key, l.id) })
	}
	if err != nil {
		return false, 0
	}
	if opts.Dead && m.order != "" {
		m.deadOrder()
	}
	return opts.Dead, opts.RetryAfter
}

// deadOrder follows the Fail that made m's key dead, with its order key:
// under OrderOnDeadBlock it logs and counts the order key blocked; under
// OrderOnDeadSkip it lets the order key go on without the key.
func (m *msgCall) deadOrder() {
	if m.ib.cfg.OrderOnDead == OrderOnDeadSkip {
		m.skipDeadOrder(m.lease.base, true)
		return
	}
	m.ib.m.Outcome(m.handler, OutcomeOrderBlocked)
	m.ib.log.Error("Inbox key is dead, and its order key is blocked: the order key's later messages wait until an operator lets them go "+
		"(inboxctl order ORDER_KEY shows it, inboxctl order-release ORDER_KEY releases it; ORDER_KEY is inbox_order_key)", inbox.ErrDead, m.fields())
}

// skipDeadOrder lets m's order key go on past m's key, which is dead
// (OrderOnDeadSkip): the store's ReleaseOrder, retried while the store
// fails as giveBack retries, for at most MaxBusyWait. An order key whose
// head is another key, or that has none (ErrLeaseLost), has gone on
// already. killed says this attempt made the key dead; else a delivery
// found it dead.
func (m *msgCall) skipDeadOrder(ctx context.Context, killed bool) {
	ib := m.ib
	giveUp := time.Now().Add(ib.cfg.MaxBusyWait)
	call := func(ctx context.Context) error { return ib.orders.ReleaseOrder(ctx, m.order, m.key) }
	err := m.storeCall(ctx, OpReleaseOrder, call)
	for retry := 0; err != nil && !errors.Is(err, inbox.ErrLeaseLost) && retryable(ctx, err); retry++ {
		ib.m.Outcome(m.handler, OutcomeStoreError)
		wait := storeBackoff.Pause(retry)
		if time.Until(giveUp) < wait {
			break
		}
		ib.health.Fail("Inbox store call to let an order key go on past a dead key failed; retrying", err, m.fields())
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ib.abandon:
			t.Stop()
			return
		}
		err = m.storeCall(ctx, OpReleaseOrder, call)
	}
	switch {
	case err == nil:
		ib.health.OK()
		ib.m.Outcome(m.handler, OutcomeOrderSkipped)
		ib.log.Info("Inbox key is dead; its order key goes on without it (OrderOnDeadSkip)", m.fields())
	case errors.Is(err, inbox.ErrLeaseLost):
		if killed {
			ib.log.Info("Inbox key is dead; its order key had gone on already", m.fields())
		}
	default:
		ib.m.Outcome(m.handler, OutcomeOrderBlocked)
		ib.health.Fail("Inbox could not let the order key go on past its dead key (OrderOnDeadSkip): the order key's later messages wait "+
			"until the dead message is delivered again, or an operator lets them go (inboxctl order-release ORDER_KEY; ORDER_KEY is inbox_order_key)",
			err, m.fields())
	}
}

// giveBack makes a Release or a Fail of m's lease and waits for it,
// retrying a failure with jittered backoff (storeBackoff) for at most
// MaxBusyWait and until the lease's deadline or Close gives up waiting: a
// key left claimed waits for its lease to end before the next delivery can
// run it. It logs the end and returns the last error.
func (m *msgCall) giveBack(op, why string, deadline time.Time, f func(context.Context) error) error {
	ib, base := m.ib, m.lease.base
	giveUp := earlier(deadline, time.Now().Add(ib.cfg.MaxBusyWait))
	err := m.storeCall(base, op, f)
	for retry := 0; err != nil && !errors.Is(err, inbox.ErrLeaseLost) && retryable(base, err); retry++ {
		ib.m.Outcome(m.handler, OutcomeStoreError)
		wait := storeBackoff.Pause(retry)
		if time.Until(giveUp) < wait {
			break
		}
		ib.health.Fail("Inbox store call after the handler failed; retrying", err, m.fields().Add(watermill.LogFields{"op": op}))
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ib.abandon:
			t.Stop()
			return err
		}
		err = m.storeCall(base, op, f)
	}
	fields := m.fields().Add(watermill.LogFields{"reason": why})
	switch {
	case err == nil:
		ib.health.OK()
		ib.m.Outcome(m.handler, OutcomeReleased)
		ib.log.Debug("Inbox lease given back", fields)
	case errors.Is(err, inbox.ErrLeaseLost):
		ib.log.Debug("Inbox lease already gone when given back", fields)
	case !errors.Is(err, inbox.ErrNotSupported):
		ib.health.Fail("Inbox "+op+" failed; the key stays claimed until its lease ends", err, fields)
	}
	return err
}

// ---- Close and the count of pending marks ---------------------------------

// Close stops accepting messages and waits until every pending mark has
// landed: the Complete of each message whose handler succeeded and that the
// router acked, or its Release when nacked. Call it after the router has
// stopped. When ctx ends first, Close gives the remaining leases back (those
// keys are then handled again on redelivery) and returns an error wrapping
// ctx.Err() without waiting for those releases. Either way the Inbox's own
// goroutines end. Messages arriving after Close fail with [inbox.ErrClosed].
func (ib *Inbox) Close(ctx context.Context) error {
	ib.mu.Lock()
	ib.closed = true
	ib.mu.Unlock()
	drained := make(chan struct{})
	go func() { ib.pending.Wait(); close(drained) }()
	select {
	case <-drained:
		ib.keep.close(false)
		ib.stopWorkers()
		return nil
	case <-ctx.Done():
	}
	ib.abandonOnce.Do(func() { close(ib.abandon) })
	ib.keep.close(true)
	// The releases just sent still get their answers: a call made after
	// the workers' Close runs in a goroutine of its own.
	ib.stopWorkers()
	ib.log.Error("Inbox closing before every pending mark landed; giving their leases back", ctx.Err(), nil)
	return fmt.Errorf("inbox middleware: closed before every pending mark landed; the others are abandoned: %w", ctx.Err())
}

// stopWorkers stops the workers of a store without a Go method.
func (ib *Inbox) stopWorkers() {
	if ib.stopAsync != nil {
		ib.stopAsync()
	}
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

// sleep waits for d, adding it to total unless total is nil, or until ctx
// ends.
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
		if total != nil {
			*total += d
		}
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
// store was unavailable, the middleware was closing, a context ended
// (context.Canceled or DeadlineExceeded, whether the router's or one a
// handler's error wraps: a timeout is worth another try), or (with
// Config.MaxAttempts) an attempt failed that was not the last one allowed
// ([inbox.ErrAttemptFailed]). A dead key ([inbox.ErrDead]) is not
// transient, whatever error it wraps, nor is a handler's other error
// without MaxAttempts: set MaxAttempts to poison a message whose handler
// keeps timing out. Use it to keep transient failures out of a poison
// queue, which would ack them and lose their only copy:
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
