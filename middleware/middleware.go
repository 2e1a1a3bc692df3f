package inboxmw

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
)

// Inbox is the inbox middleware. Build it with [New], add
// [Inbox.Middleware] to a router, and [Inbox.Close] it after the router has
// stopped. It is safe for concurrent use by any number of handlers and
// routers.
type Inbox struct {
	cfg    Config
	leases inbox.LeaseStore // nil when the store is a plain inbox.Store
	keys   keying.Builder
	log    watermill.LoggerAdapter
	m      Metrics

	// state counts the messages between their claim and their mark, with
	// closedBit set once Close was called. drained is closed when the count
	// reaches zero after Close.
	state       atomic.Int64
	drained     chan struct{}
	drainedOnce sync.Once

	abandon     chan struct{} // closed when Close stops waiting for pending marks
	abandonOnce sync.Once

	extendOff atomic.Bool  // the store answered Extend with ErrNotSupported
	beats     *scheduler   // heartbeats of every lease; nil for a plain Store
	waiters   *ackWaiters  // wait for the router's ack after a successful handler
	marks     *inlineMarks // instead of waiters, when the store's calls never block; else nil
	timeouts  bool         // wrap store calls in StoreTimeout (the store does not bound them itself)
	timed     bool         // Metrics were configured: time the store calls
}

// New returns the middleware for cfg. It fails with an error wrapping
// [ErrInvalidConfig] that lists every problem of cfg.
func New(cfg Config) (*Inbox, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ib := &Inbox{
		cfg:     cfg,
		keys:    keying.Builder{Bus: cfg.Bus, Group: cfg.Group, Alias: cfg.Alias, IDSources: cfg.IDSources},
		log:     cfg.Logger.With(watermill.LogFields{"inbox_bus": cfg.Bus, "inbox_group": cfg.Group}),
		m:       cfg.Metrics,
		abandon: make(chan struct{}),
		drained: make(chan struct{}),
	}
	_, nop := cfg.Metrics.(NopMetrics)
	ib.timed = !nop
	ib.timeouts = true
	nonBlocking := false
	if b, ok := cfg.Store.(inbox.BoundedCalls); ok && b.CallTimeout() <= cfg.StoreTimeout {
		ib.timeouts = false
		nonBlocking = b.CallTimeout() == 0
	}
	if ls, ok := cfg.Store.(inbox.LeaseStore); ok {
		ib.leases = ls
		ib.beats = newScheduler()
		ib.waiters = newAckWaiters()
		if nonBlocking {
			ib.marks = newInlineMarks(ib)
		}
	} else {
		ib.log.Info("Inbox store has no leases: concurrent deliveries of one message can both run the handler", nil)
	}
	return ib, nil
}

// Middleware is the [message.HandlerMiddleware]: router.AddMiddleware(ib.Middleware)
// or router.AddHandler(...).AddMiddleware(ib.Middleware).
func (ib *Inbox) Middleware(h message.HandlerFunc) message.HandlerFunc {
	if ib.leases == nil {
		return func(msg *message.Message) ([]*message.Message, error) { return ib.handlePlain(h, msg) }
	}
	return func(msg *message.Message) ([]*message.Message, error) { return ib.handle(h, msg) }
}

// Close stops accepting messages and waits until every pending mark has
// landed: the Complete of each message whose handler succeeded and that the
// router acked, or its Release when nacked. Call it after the router has
// stopped. When ctx ends first, Close gives the remaining leases back (those
// keys are then handled again on redelivery) and returns an error wrapping
// ctx.Err() without waiting for those releases (each is bounded by
// StoreTimeout). Messages arriving after Close fail with [inbox.ErrClosed].
func (ib *Inbox) Close(ctx context.Context) error {
	v := ib.state.Or(closedBit) | closedBit
	if ib.marks != nil {
		ib.marks.close()
	}
	if v == closedBit {
		ib.markDrained()
	}
	select {
	case <-ib.drained:
		ib.stopBeats()
		return nil
	case <-ctx.Done():
	}
	n := ib.state.Load() &^ closedBit
	ib.abandonOnce.Do(func() { close(ib.abandon) })
	ib.stopBeats()
	ib.log.Error("Inbox closing before every pending mark landed; giving their leases back", ctx.Err(), watermill.LogFields{"pending": n})
	return fmt.Errorf("inbox middleware: closed with %d pending mark(s) abandoned: %w", n, ctx.Err())
}

func (ib *Inbox) stopBeats() {
	if ib.beats != nil {
		ib.beats.close()
		ib.waiters.close()
	}
}

const closedBit = int64(1) << 62

// track counts a message in flight; false once closed.
func (ib *Inbox) track() bool {
	for {
		v := ib.state.Load()
		if v&closedBit != 0 {
			return false
		}
		if ib.state.CompareAndSwap(v, v+1) {
			return true
		}
	}
}

func (ib *Inbox) untrack() {
	if ib.state.Add(-1) == closedBit {
		ib.markDrained()
	}
}

func (ib *Inbox) markDrained() { ib.drainedOnce.Do(func() { close(ib.drained) }) }

var errClosed = fmt.Errorf("inbox middleware: %w", inbox.ErrClosed)

func isClosedChan(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// leaseIDLen is the length of the middleware's lease ids.
const leaseIDLen = 32

// appendLeaseID appends 128 random bits as 32 lowercase hex digits, the form
// of [inbox.NewLeaseID]. math/rand/v2's global source is ChaCha8 seeded by
// the runtime: unpredictable, and much cheaper per message than crypto/rand.
func appendLeaseID(dst []byte) []byte {
	var b [leaseIDLen]byte
	hexNibbles(b[:16], rand.Uint64())
	hexNibbles(b[16:], rand.Uint64())
	return append(dst, b[:]...)
}

// hexNibbles writes the 16 nibbles of x into b[:16] as lowercase hex digits,
// eight at a time (SWAR), in an order of its own: every nibble is written
// once, so for random x the digits are as random as x.
func hexNibbles(b []byte, x uint64) {
	binary.LittleEndian.PutUint64(b[:8], hexDigits(spreadNibbles(uint32(x))))
	binary.LittleEndian.PutUint64(b[8:16], hexDigits(spreadNibbles(uint32(x>>32))))
}

// spreadNibbles moves each of the 8 nibbles of x into the low half of a byte
// of its own.
func spreadNibbles(x uint32) uint64 {
	v := uint64(x)
	v = (v | v<<16) & 0x0000ffff0000ffff
	v = (v | v<<8) & 0x00ff00ff00ff00ff
	return (v | v<<4) & 0x0f0f0f0f0f0f0f0f
}

// hexDigits turns 8 bytes of values 0 to 15 into their hex digits: '0' plus
// the value, plus 'a'-'0'-10 more for values of 10 and up (those whose sum
// with 6 reaches bit 4).
func hexDigits(v uint64) uint64 {
	ten := (v + 0x0606060606060606) >> 4 & 0x0101010101010101
	return v + 0x3030303030303030 + ten*('a'-'0'-10)
}

func payloadHash(p []byte) string {
	sum := sha256.Sum256(p)
	return hex.EncodeToString(sum[:])
}

func (ib *Inbox) fields(msg *message.Message, handler, key string) watermill.LogFields {
	return watermill.LogFields{"message_uuid": msg.UUID, "handler_name": handler, "inbox_key": key}
}

// bounded returns ctx bounded by StoreTimeout, unless the store bounds its
// calls itself ([inbox.BoundedCalls]).
func (ib *Inbox) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if !ib.timeouts {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, ib.cfg.StoreTimeout)
}

// detached returns a context for store calls after the handler: the message's
// values without its cancellation (subscribers cancel the message context at
// ack), bounded by StoreTimeout.
func (ib *Inbox) detached(parent context.Context) (context.Context, context.CancelFunc) {
	return ib.bounded(context.WithoutCancel(parent))
}

// storeErr wraps a store failure as inbox.ErrStoreUnavailable unless the error
// says more precisely what happened.
func storeErr(op, key string, err error) error {
	if errors.Is(err, inbox.ErrStoreUnavailable) || errors.Is(err, context.Canceled) {
		return fmt.Errorf("inbox %s %q: %w", op, key, err)
	}
	return fmt.Errorf("%w: inbox %s %q: %w", inbox.ErrStoreUnavailable, op, key, err)
}

// keyError handles a message whose key cannot be built.
func (ib *Inbox) keyError(h message.HandlerFunc, msg *message.Message, handler string, err error) ([]*message.Message, error) {
	f := watermill.LogFields{"message_uuid": msg.UUID, "handler_name": handler}
	if !errors.Is(err, inbox.ErrNoKey) {
		// A configuration problem (no alias, oversized segments): refusing
		// keeps the message for a fixed deployment.
		ib.log.Error("Cannot build the inbox key; message nacked", err, f)
		return nil, err
	}
	ib.m.Outcome(handler, OutcomeNoKey)
	if ib.cfg.MissingKey == MissingKeyReject {
		ib.log.Error("Message has no idempotency key; rejected (MissingKeyReject)", err, f)
		return nil, err
	}
	ib.log.Info("Message has no idempotency key; processing it without deduplication", f.Add(watermill.LogFields{"reason": err.Error()}))
	return h(msg)
}

// handle is the leased flow.
func (ib *Inbox) handle(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	if ib.marks != nil && ib.marks.pending() {
		ib.marks.settleDecided()
	}
	ctx := msg.Context()
	handler := message.HandlerNameFromCtx(ctx)
	// The lease, the key and the lease id are one allocation: the key and
	// the id are strings over the lease's buffer (unless the key is too long
	// for it), which is never written again.
	l := &lease{ib: ib, msg: msg, handler: handler}
	buf, _, err := ib.keys.AppendKey(l.buf[:0], msg)
	if err != nil {
		return ib.keyError(h, msg, handler, err)
	}
	n := len(buf)
	buf = appendLeaseID(buf)
	both := unsafe.String(unsafe.SliceData(buf), len(buf))
	key := both[:n]
	l.key = key
	if !ib.track() {
		return nil, errClosed
	}
	tracked := true
	defer func() {
		if tracked {
			ib.untrack()
		}
	}()

	opts := inbox.BeginOptions{Owner: ib.cfg.Owner, Lease: ib.cfg.Lease, LeaseID: both[n:]}
	if ib.cfg.PayloadHash != PayloadHashOff {
		opts.PayloadHash = payloadHash(msg.Payload)
	}
	instantAcked := isClosedChan(msg.Acked())
	if instantAcked {
		// Acked before the handler (InstantAck): subscribers cancel the
		// message context at ack, so the claim must not depend on it.
		ctx = context.WithoutCancel(ctx)
	}

	claim, sent, err := ib.claim(ctx, handler, key, opts)
	if err != nil {
		switch {
		case errors.Is(err, inbox.ErrBusy):
			return nil, err
		case ctx.Err() != nil && errors.Is(err, ctx.Err()):
			return nil, err // shutting down: the router does not log cancellations
		}
		ib.m.Outcome(handler, OutcomeStoreError)
		err = storeErr(OpTryBegin, key, err)
		if ib.cfg.FailOpen {
			ib.m.Outcome(handler, OutcomeFailOpen)
			ib.log.Error("Inbox store failed; processing WITHOUT deduplication (FailOpen)", err, ib.fields(msg, handler, key))
			return h(msg)
		}
		ib.log.Error("Inbox store failed; message nacked for redelivery", err, ib.fields(msg, handler, key))
		return nil, err
	}

	if claim.PayloadMismatch {
		ib.m.Outcome(handler, OutcomePayloadMismatch)
		ib.log.Error("Known inbox key arrived with a different payload", inbox.ErrPayloadMismatch, ib.fields(msg, handler, key))
		if ib.cfg.PayloadHash == PayloadHashReject {
			if claim.Status == inbox.Acquired {
				ib.releaseNow(ctx, handler, key, claim.LeaseID)
			}
			return nil, fmt.Errorf("%w: key %q", inbox.ErrPayloadMismatch, key)
		}
	}

	switch claim.Status {
	case inbox.Processed:
		ib.m.Outcome(handler, OutcomeDuplicate)
		ib.log.Debug("Duplicate message skipped: key already processed", ib.fields(msg, handler, key))
		return nil, nil
	case inbox.Acquired:
		tracked = false // the lease now owns the pending count
		return ib.run(h, l, claim, opts, sent, instantAcked)
	default:
		ib.m.Outcome(handler, OutcomeStoreError)
		err := storeErr(OpTryBegin, key, fmt.Errorf("store answered status %v", claim.Status))
		ib.log.Error("Inbox store gave an unexpected claim; message nacked", err, ib.fields(msg, handler, key))
		return nil, err
	}
}

// startCall returns the start time of a store call when Metrics time them.
func (ib *Inbox) startCall() time.Time {
	if ib.timed {
		return time.Now()
	}
	return time.Time{}
}

// endCall reports a store call to Metrics.
func (ib *Inbox) endCall(op string, start time.Time, err error) {
	if ib.timed {
		ib.m.StoreCall(op, time.Since(start), err)
	}
}

// tryBegin runs one TryBegin sent at sent.
func (ib *Inbox) tryBegin(ctx context.Context, key string, opts inbox.BeginOptions, sent time.Time) (inbox.Claim, error) {
	cctx, cancel := ib.bounded(ctx)
	c, err := ib.leases.TryBegin(cctx, key, opts)
	cancel()
	ib.endCall(OpTryBegin, sent, err)
	return c, err
}

// busySlack is the "little" added to a holder's remaining lease when waiting
// on a busy key, so that a lease ending on time is seen free.
const busySlack = 250 * time.Millisecond

// claim runs TryBegin and, while the key is busy, polls it with jittered
// backoff for a bounded time. sent is the local time the final TryBegin was
// sent: the lease deadline is reckoned from it on the monotonic clock.
func (ib *Inbox) claim(ctx context.Context, handler, key string, opts inbox.BeginOptions) (c inbox.Claim, sent time.Time, err error) {
	sent = time.Now()
	c, err = ib.tryBegin(ctx, key, opts, sent)
	if err != nil || c.Status != inbox.Busy {
		return c, sent, err
	}
	wait := min(c.RetryAfter+busySlack, ib.cfg.MaxBusyWait)
	deadline := sent.Add(wait)
	delay := 20 * time.Millisecond
	var timer *time.Timer
	for wait > 0 {
		remaining := time.Until(deadline)
		if remaining <= 0 {
			break
		}
		d := delay/2 + rand.N(delay/2+1) // jitter in [delay/2, delay]
		d = min(d, remaining)
		if timer == nil {
			timer = time.NewTimer(d)
			defer timer.Stop()
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return c, sent, fmt.Errorf("waiting on busy inbox key %q: %w", key, ctx.Err())
		case <-timer.C:
		}
		sent = time.Now()
		c, err = ib.tryBegin(ctx, key, opts, sent)
		if err != nil || c.Status != inbox.Busy {
			return c, sent, err
		}
		delay = min(2*delay, time.Second)
	}
	ib.m.Outcome(handler, OutcomeBusy)
	ib.log.Info("Inbox key busy: another consumer holds its lease; message nacked for redelivery", watermill.LogFields{
		"handler_name": handler, "inbox_key": key, "retry_after": c.RetryAfter.String(),
	})
	return c, sent, &inbox.BusyError{Key: key, RetryAfter: c.RetryAfter}
}

// releaseNow gives a lease back synchronously, for the paths that return an
// error to the router right after.
func (ib *Inbox) releaseNow(ctx context.Context, handler, key, leaseID string) {
	cctx, cancel := ib.detached(ctx)
	defer cancel()
	start := ib.startCall()
	err := ib.leases.Release(cctx, key, leaseID)
	ib.endCall(OpRelease, start, err)
	if err != nil {
		ib.m.Outcome(handler, OutcomeStoreError)
		ib.log.Error("Inbox release failed; the key stays claimed until its lease ends", err, watermill.LogFields{"handler_name": handler, "inbox_key": key})
		return
	}
	ib.m.Outcome(handler, OutcomeReleased)
}

// IsTransient reports whether err, returned by the middleware, means "try
// again later" rather than "this message is bad": the key was busy, the store
// was unavailable, or the middleware was closing. Use it to keep such messages
// out of a poison queue, which would ack them and lose their only copy:
//
//	poison, err := wmw.PoisonQueueWithFilter(pub, "poison", func(err error) bool {
//		return !middleware.IsTransient(err)
//	})
func IsTransient(err error) bool {
	return errors.Is(err, inbox.ErrBusy) || errors.Is(err, inbox.ErrStoreUnavailable) ||
		errors.Is(err, inbox.ErrClosed) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
