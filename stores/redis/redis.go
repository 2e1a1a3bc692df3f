package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/batch"
)

// Defaults of [Options].
const (
	// DefaultPrefix is the key prefix when Options.Prefix is empty.
	DefaultPrefix = "inbox:"

	// DefaultTimeout bounds each call when Options.Timeout is zero.
	DefaultTimeout = 5 * time.Second

	// MaxDuration is the longest lease or retention the store accepts: 100
	// years. Times are kept as microseconds in Lua numbers (doubles), exact
	// up to 2^53 µs (about 285 years after 1970).
	MaxDuration = 100 * 365 * 24 * time.Hour

	// MaxPrefixLen is the longest Options.Prefix, in bytes.
	MaxPrefixLen = 256
)

// Options configure a [Store]. The zero value is usable: every field has a
// default.
type Options struct {
	// Prefix is prepended to every inbox key to make its Redis key, so one
	// Redis can hold several inboxes and other data. The store owns every
	// key under it. Optional; default [DefaultPrefix] ("inbox:"); at most
	// [MaxPrefixLen] bytes.
	Prefix string

	// Retention is how long a processed key stays processed, and how long
	// any record lives after its last lease ended. Optional; default
	// inbox.DefaultRetention (7 days); at least a millisecond, at most
	// [MaxDuration].
	Retention time.Duration

	// Lease is the lease granted when TryBegin asks for none. Optional;
	// default inbox.DefaultLease (30 s); at most [MaxDuration].
	Lease time.Duration

	// Timeout bounds each call to Redis (its round trips, including
	// go-redis's own retries: one, or two for a TryBegin of a key that
	// exists, and the time it waits queued behind a round trip in flight,
	// see "Batched round trips" in the package documentation) unless the
	// caller's context ends sooner. Optional; default
	// [DefaultTimeout] (5 s); negative means no bound of the store's own, so
	// only the caller's context and the client's timeouts apply. The bound
	// reaches the socket only when the client was built with
	// ContextTimeoutEnabled (clients made from a URL are); otherwise the
	// client's ReadTimeout and WriteTimeout apply to each attempt.
	//
	// The bound costs a timer per call (BENCHMARKS.md at the repository
	// root has what it was measured to cost); a call whose context already
	// ends within Timeout adds none.
	Timeout time.Duration

	// CompleteDelay, when positive, pipelines marks (opt-in): Complete does
	// not send its script at once but waits, at most CompleteDelay, to
	// travel in one round trip with the next TryBegin of this Store (or with
	// other Completes when the delay ends or 128 are waiting), then returns
	// its own result as usual. A consumer that handles one message at a time
	// then makes one round trip per message instead of two: the mark of one
	// message rides with the claim of the next. What it trades, for at most
	// CompleteDelay: a key is marked processed later, so its lease is held
	// longer (a duplicate arriving meanwhile waits, see the middleware's
	// busy wait) and a crash in that window leaves the key unmarked (a later
	// duplicate runs again once the lease ends, as after a crash between
	// the ack and the mark, whose window this widens); and a TryBegin that
	// carries marks waits for Redis to run their scripts first. Each call
	// can then take up to Timeout + CompleteDelay.
	// Optional; default 0: Completes go through the batcher like the other
	// calls (see "Batched round trips"); at most
	// [MaxCompleteDelay]. See "Pipelined marks" in the package documentation.
	CompleteDelay time.Duration
}

func (o *Options) setDefaults() {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.Retention == 0 {
		o.Retention = inbox.DefaultRetention
	}
	if o.Lease == 0 {
		o.Lease = inbox.DefaultLease
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
}

// Validate reports whether o is usable once defaults are applied (zero
// fields are valid: they take their default). Errors wrap
// [inbox.ErrInvalidArgument] and name the field and its value.
func (o Options) Validate() error {
	if len(o.Prefix) > MaxPrefixLen {
		return fmt.Errorf("%w: redis store: Prefix is %d bytes, longer than the limit of %d", inbox.ErrInvalidArgument, len(o.Prefix), MaxPrefixLen)
	}
	if o.Retention != 0 && (o.Retention < time.Millisecond || o.Retention > MaxDuration) {
		return fmt.Errorf("%w: redis store: Retention %s is outside [1ms, %s]", inbox.ErrInvalidArgument, o.Retention, MaxDuration)
	}
	if o.Lease < 0 || o.Lease > MaxDuration {
		return fmt.Errorf("%w: redis store: Lease %s is outside (0, %s]", inbox.ErrInvalidLease, o.Lease, MaxDuration)
	}
	if o.CompleteDelay < 0 || o.CompleteDelay > MaxCompleteDelay {
		return fmt.Errorf("%w: redis store: CompleteDelay %s is outside [0, %s]", inbox.ErrInvalidArgument, o.CompleteDelay, MaxCompleteDelay)
	}
	return nil
}

// Store is the Redis [inbox.LeaseStore]. It is safe for concurrent use.
type Store struct {
	client     redis.UniversalClient
	opts       Options
	retention  any // Options.Retention in microseconds, boxed once as a script argument
	lease      any // Options.Lease likewise
	leaseUS    int64
	leaseTTL   any   // ttlMillis(Options.Lease + Options.Retention), boxed once
	leaseTTLMS int64 // the same as a number
	retTTL     any   // ttlMillis(Options.Retention), boxed once
	owns       bool  // Close closes client
	closed     atomic.Bool
	marks      *marks // Completes waiting to be sent; nil unless Options.CompleteDelay
	batch      *batch.Batcher[*request, any]
}

var _ inbox.LeaseStore = (*Store)(nil)

// New returns a store over client, which may be a standalone, Sentinel
// (failover) or Cluster client: every operation touches one key. The store
// does not close client. New checks its options only: it does not contact
// Redis, so a Redis that is down, a wrong password or a missing right make
// calls fail with [inbox.ErrStoreUnavailable] (until it is back, or the
// mistake is fixed). Ping the client before if need be; [stores.Open]
// checks the server (see "Checks at Open" in the package documentation).
func New(client redis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: redis store: client is nil", inbox.ErrInvalidArgument)
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	s := &Store{
		client:     client,
		opts:       opts,
		retention:  strconv.FormatInt(micros(opts.Retention), 10),
		lease:      strconv.FormatInt(micros(opts.Lease), 10),
		leaseUS:    micros(opts.Lease),
		leaseTTL:   ttlMillis(micros(opts.Lease) + micros(opts.Retention)),
		leaseTTLMS: ttlMS(micros(opts.Lease) + micros(opts.Retention)),
		retTTL:     ttlMillis(micros(opts.Retention)),
	}
	s.batch = newBatcher(s)
	if opts.CompleteDelay > 0 {
		s.marks = &marks{timer: time.AfterFunc(time.Hour, s.flushMarks)}
		s.marks.timer.Stop()
	}
	return s, nil
}

// Close makes every later call fail with [inbox.ErrClosed]. With
// Options.CompleteDelay, it first sends the marks still waiting. It closes
// the client only when the store made it (opened from a URL).
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.flushMarks()
	if !s.owns {
		return nil
	}
	return s.client.Close()
}

// micros converts d to whole microseconds, rounding up.
func micros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

func fromMicros(us int64) time.Time { return time.UnixMicro(us) }

// ttlMillis is the physical TTL, as a PEXPIRE argument, of a record whose
// logical expiry is us microseconds away: rounded up to the next
// millisecond, plus one, so that Redis never drops a record before the
// scripts stop seeing it. (The scripts compute it themselves where the
// duration comes from the record.)
func ttlMillis(us int64) string {
	return strconv.FormatInt(ttlMS(us), 10)
}

// ttlMS is ttlMillis as a number.
func ttlMS(us int64) int64 { return (us+999)/1000 + 1 }

// begin checks that the store is open and the context live, and returns the
// context for one call with the store's timeout.
func (s *Store) begin(ctx context.Context, op, key string) (context.Context, context.CancelFunc, error) {
	if s.closed.Load() {
		return nil, nil, closedError(op, key)
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, ctxError(op, key, err, err)
	}
	if s.opts.Timeout < 0 {
		return ctx, func() {}, nil
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= s.opts.Timeout {
		return ctx, func() {}, nil
	}
	cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	return cctx, cancel, nil
}

func closedError(op, key string) error {
	return fmt.Errorf("redis store: %s %q: %w", op, key, inbox.ErrClosed)
}

// ctxError wraps err for a call ended by its context: a canceled caller
// gets context.Canceled; a deadline (the caller's or the store's Timeout)
// means Redis did not answer in time, so it wraps both
// inbox.ErrStoreUnavailable and context.DeadlineExceeded.
func ctxError(op, key string, ctxErr, err error) error {
	if errors.Is(ctxErr, context.DeadlineExceeded) {
		if err == ctxErr {
			return fmt.Errorf("redis store: %s %q: %w: %w", op, key, inbox.ErrStoreUnavailable, err)
		}
		return fmt.Errorf("redis store: %s %q: %w: %w (%w)", op, key, inbox.ErrStoreUnavailable, ctxErr, err)
	}
	if err == ctxErr {
		return fmt.Errorf("redis store: %s %q: %w", op, key, err)
	}
	return fmt.Errorf("redis store: %s %q: %w (%w)", op, key, ctxErr, err)
}

// fail maps an error of go-redis to the store's contract. callCtx is the
// context the call ran under.
func (s *Store) fail(callCtx context.Context, op, key string, err error) error {
	switch {
	case errors.Is(err, redis.ErrClosed):
		return fmt.Errorf("redis store: %s %q: %w: %w", op, key, inbox.ErrClosed, err)
	case callCtx.Err() != nil:
		return ctxError(op, key, callCtx.Err(), err)
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return ctxError(op, key, err, err)
	case errors.Is(err, redis.Nil):
		// The scripts never return nil; go-redis's sentinel must not leak.
		return fmt.Errorf("redis store: %s %q: %w: unexpected nil reply", op, key, inbox.ErrStoreUnavailable)
	}
	return fmt.Errorf("redis store: %s %q: %w: %w", op, key, inbox.ErrStoreUnavailable, err)
}

// badReply is the error for a script reply of the wrong shape.
func badReply(op, key string, v any) error {
	return fmt.Errorf("redis store: %s %q: %w: unexpected script reply %#v", op, key, inbox.ErrStoreUnavailable, v)
}

func (s *Store) run(ctx context.Context, op, key string, sc *redis.Script, args ...any) (any, error) {
	cctx, cancel, err := s.begin(ctx, op, key)
	if err != nil {
		return nil, err
	}
	defer cancel()
	v, err := sc.Run(cctx, s.client, []string{s.opts.Prefix + key}, args...).Result()
	if err != nil {
		return nil, s.fail(cctx, op, key, err)
	}
	return v, nil
}

// ints decodes a reply that must be an array of len(dst) integers into dst.
func ints(op, key string, v any, dst []int64) error {
	a, ok := v.([]any)
	if !ok || len(a) != len(dst) {
		return badReply(op, key, v)
	}
	for i, e := range a {
		x, ok := e.(int64)
		if !ok {
			return badReply(op, key, v)
		}
		dst[i] = x
	}
	return nil
}

// TryBegin implements [inbox.LeaseStore]. A lease is kept in whole
// microseconds (rounded up); Claim.Lease is what was granted.
func (s *Store) TryBegin(ctx context.Context, key string, opts inbox.BeginOptions) (inbox.Claim, error) {
	const op = "TryBegin"
	if err := inbox.ValidateKey(key); err != nil {
		return inbox.Claim{}, err
	}
	if err := opts.Validate(); err != nil {
		return inbox.Claim{}, err
	}
	leaseUS, lease, ttl, ttlN := s.leaseUS, s.lease, s.leaseTTL, s.leaseTTLMS
	if opts.Lease > MaxDuration {
		return inbox.Claim{}, fmt.Errorf("%w: lease %s is longer than the redis store's limit of %s", inbox.ErrInvalidLease, opts.Lease, MaxDuration)
	} else if opts.Lease > 0 && micros(opts.Lease) != leaseUS {
		leaseUS = micros(opts.Lease)
		ttlN = ttlMS(leaseUS + micros(s.opts.Retention))
		lease, ttl = strconv.FormatInt(leaseUS, 10), strconv.FormatInt(ttlN, 10)
	}
	id := opts.LeaseID
	if id == "" {
		id = inbox.NewLeaseID()
	}
	fc := &fastClaim{key: key, rec: freshRecord(id, opts.Owner, opts.PayloadHash, leaseUS, ttlN), ttlMS: ttlN}
	// One Timeout bounds the call, both round trips when the key exists.
	cctx, cancel, err := s.begin(ctx, op, key)
	if err != nil {
		return inbox.Claim{}, err
	}
	defer cancel()
	if batch := s.takeMarks(); len(batch) > 0 {
		err = s.tryBeginWith(cctx, batch, fc)
	} else if _, err = s.batch.Do(cctx, &request{kind: reqClaim, key: key, fc: fc}); err != nil {
		err = s.fail(cctx, op, key, err)
	}
	if err != nil {
		return inbox.Claim{}, err
	}
	if fc.expiry >= 0 {
		// SET NX wrote the fresh record: acquired, at the time of the SET
		// rounded down to the millisecond (see scripts.go).
		until := (fc.expiry-ttlN)*1000 + leaseUS
		return inbox.Claim{Status: inbox.Acquired, LeaseID: id, ExpiresAt: fromMicros(until), Lease: time.Duration(leaseUS) * time.Microsecond}, nil
	}
	// The key exists (or its expiry was not read): the script decides.
	v, err := tryBeginScript.Run(cctx, s.client, []string{s.opts.Prefix + key}, id, lease, s.retention, opts.Owner, opts.PayloadHash, ttl).Result()
	if err != nil {
		return inbox.Claim{}, s.fail(cctx, op, key, err)
	}
	if until, ok := v.(int64); ok {
		// The short reply: acquired with the lease asked for, no mismatch.
		if until <= 0 {
			return inbox.Claim{}, badReply(op, key, v)
		}
		return inbox.Claim{Status: inbox.Acquired, LeaseID: id, ExpiresAt: fromMicros(until), Lease: time.Duration(leaseUS) * time.Microsecond}, nil
	}
	var r [5]int64
	if err := ints(op, key, v, r[:]); err != nil {
		return inbox.Claim{}, err
	}
	until, granted, now, mismatch := r[1], r[2], r[3], r[4]
	if mismatch != 0 && mismatch != 1 {
		return inbox.Claim{}, badReply(op, key, v)
	}
	c := inbox.Claim{PayloadMismatch: mismatch == 1}
	switch r[0] {
	case 1:
		c.Status, c.LeaseID, c.ExpiresAt, c.Lease = inbox.Acquired, id, fromMicros(until), time.Duration(granted)*time.Microsecond
	case 2:
		c.Status = inbox.Processed
	case 3:
		c.Status, c.ExpiresAt, c.RetryAfter = inbox.Busy, fromMicros(until), time.Duration(until-now)*time.Microsecond
	default:
		return inbox.Claim{}, badReply(op, key, v)
	}
	return c, nil
}

// holderError maps the negative codes of Complete, Release and Extend.
func holderError(op, key, leaseID string, code int64, v any) error {
	switch code {
	case -1:
		return fmt.Errorf("redis store: %s %q: %w: the key has no record", op, key, inbox.ErrLeaseLost)
	case -2:
		return fmt.Errorf("redis store: %s %q: %w: the key is not held by lease %q", op, key, inbox.ErrLeaseLost, leaseID)
	case -3:
		return fmt.Errorf("redis store: %s %q: %w: the key is already processed", op, key, inbox.ErrLeaseLost)
	}
	return badReply(op, key, v)
}

// Complete implements [inbox.LeaseStore].
func (s *Store) Complete(ctx context.Context, key, leaseID string) error {
	const op = "Complete"
	if err := inbox.ValidateHolder(key, leaseID); err != nil {
		return err
	}
	if s.marks != nil {
		return s.completeLater(ctx, key, leaseID)
	}
	v, err := s.batched(ctx, op, reqComplete, key, leaseID)
	if err != nil {
		return err
	}
	return completeReply(key, leaseID, v)
}

// Release implements [inbox.LeaseStore]. If the reply to a Release that
// Redis applied is lost and go-redis retries it, the retry fails with
// [inbox.ErrLeaseLost] although the lease was released.
func (s *Store) Release(ctx context.Context, key, leaseID string) error {
	const op = "Release"
	if err := inbox.ValidateHolder(key, leaseID); err != nil {
		return err
	}
	v, err := s.batched(ctx, op, reqRelease, key, leaseID)
	if err != nil {
		return err
	}
	if code, ok := v.(int64); !ok || code != 1 {
		return holderError(op, key, leaseID, code, v)
	}
	return nil
}

// Extend implements [inbox.LeaseStore].
func (s *Store) Extend(ctx context.Context, key, leaseID string, lease time.Duration) (time.Time, error) {
	const op = "Extend"
	if err := inbox.ValidateHolder(key, leaseID); err != nil {
		return time.Time{}, err
	}
	if err := inbox.ValidateLease(lease); err != nil {
		return time.Time{}, err
	}
	if lease > MaxDuration {
		return time.Time{}, fmt.Errorf("%w: lease %s is longer than the redis store's limit of %s", inbox.ErrInvalidLease, lease, MaxDuration)
	}
	v, err := s.run(ctx, op, key, extendScript, leaseID, micros(lease), s.retention)
	if err != nil {
		return time.Time{}, err
	}
	until, ok := v.(int64)
	if !ok || until <= 0 {
		return time.Time{}, holderError(op, key, leaseID, until, v)
	}
	return fromMicros(until), nil
}

// Get implements [inbox.LeaseStore].
func (s *Store) Get(ctx context.Context, key string) (inbox.Record, error) {
	const op = "Get"
	if err := inbox.ValidateKey(key); err != nil {
		return inbox.Record{}, err
	}
	v, err := s.run(ctx, op, key, getScript)
	if err != nil {
		return inbox.Record{}, err
	}
	a, ok := v.([]any)
	if !ok || len(a) == 0 {
		return inbox.Record{}, badReply(op, key, v)
	}
	if len(a) == 1 && a[0] == int64(0) {
		return inbox.Record{}, nil
	}
	if len(a) != 9 {
		return inbox.Record{}, badReply(op, key, v)
	}
	var n [7]int64
	if err := ints(op, key, a[:7], n[:]); err != nil {
		return inbox.Record{}, badReply(op, key, v)
	}
	owner, ok1 := a[7].(string)
	hash, ok2 := a[8].(string)
	now, processed, until, attempts, first, last := n[1], n[2], n[3], n[4], n[5], n[6]
	if n[0] != 1 || !ok1 || !ok2 || (processed != 0 && processed != 1) || until < 0 || attempts < 0 || first < 0 || last < 0 {
		return inbox.Record{}, badReply(op, key, v)
	}
	r := inbox.Record{
		Attempts:    int(attempts),
		FirstSeen:   fromMicros(first),
		LastSeen:    fromMicros(last),
		Owner:       owner,
		PayloadHash: hash,
	}
	switch {
	case processed == 1:
		r.State = inbox.StateProcessed
	case until > now:
		r.State, r.LeaseUntil = inbox.StateInProgress, fromMicros(until)
	default:
		r.State = inbox.StateAvailable
	}
	return r, nil
}

// IsProcessed implements [inbox.Store].
func (s *Store) IsProcessed(ctx context.Context, key string) (bool, error) {
	const op = "IsProcessed"
	if err := inbox.ValidateKey(key); err != nil {
		return false, err
	}
	v, err := s.run(ctx, op, key, isProcessedScript)
	if err != nil {
		return false, err
	}
	switch v {
	case int64(1):
		return true, nil
	case int64(0):
		return false, nil
	}
	return false, badReply(op, key, v)
}

// MarkProcessed implements [inbox.Store]. It marks key processed whatever
// lease is held on it; the holder's Complete then fails with
// [inbox.ErrLeaseLost].
func (s *Store) MarkProcessed(ctx context.Context, key string) error {
	const op = "MarkProcessed"
	if err := inbox.ValidateKey(key); err != nil {
		return err
	}
	v, err := s.run(ctx, op, key, markProcessedScript, s.retention, s.retTTL)
	if err != nil {
		return err
	}
	if v != int64(1) {
		return badReply(op, key, v)
	}
	return nil
}
