// Package driver is the layer every store of this project sits behind, and
// the narrow interface a backend implements under it, in the manner of
// gocloud.dev's blob.Bucket over driver.Bucket.
//
// A backend implements [Driver]: it applies batches of claims, completes,
// releases and marks ([Driver.Apply]), and extends and reads one key at a
// time. [New] puts the portable [Store] over it, which implements
// [inbox.LeaseStore] and does, once for every store, what each would
// otherwise repeat in every method:
//
//   - input validation: keys, lease ids, owners, payload hashes and lease
//     lengths, before anything is sent ([inbox.ErrInvalidArgument]);
//   - the closed check ([inbox.ErrClosed]) and a context that has already
//     ended;
//   - the lease default ([Config.Lease]) and the lease id a caller did not
//     choose ([inbox.NewLeaseID]);
//   - the bound on each call ([Config.Timeout]);
//   - error mapping: what the driver returns wraps an inbox sentinel, or
//     becomes [inbox.ErrStoreUnavailable]; a deadline wraps both
//     ErrStoreUnavailable and context.DeadlineExceeded; a canceled caller
//     gets context.Canceled; every message names the store, the operation
//     and the key;
//   - batching ([Config.Batch]) and its statistics ([Store.BatchStats]);
//   - order keys ([inbox.BeginOptions.OrderKey]): validated, and refused
//     with [inbox.ErrNotSupported] unless the driver keeps order
//     ([Config.Order], [Orderer]).
//
// # Batching
//
// Batching is group commit without timers. A call that finds fewer than
// [Batch.MaxInFlight] round trips in flight is sent at once, alone, so a
// single sequential caller never waits for company. Calls that arrive while
// round trips are in flight wait in a bounded queue and travel together in
// the next one: at most [Batch.MaxBatch] calls, in the order they were
// made, as one [Driver.Apply]. A caller whose context ends while its call
// is queued gets its context's error and the call is never sent. The
// driver sets a result and an error per call; an error it returns instead
// (a broken connection, a failed transaction) fails every call of the
// batch with [inbox.ErrStoreUnavailable]. A batch of several calls runs
// under a context detached from the callers' cancellation, with the latest
// of their deadlines, so that a caller who gives up does not cut the round
// trip of the others.
package driver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/batch"
)

// Kind is the kind of an [Op].
type Kind uint8

// The kinds of operations a batch carries.
const (
	// Claim is [inbox.LeaseStore.TryBegin].
	Claim Kind = iota + 1
	// Complete is [inbox.LeaseStore.Complete].
	Complete
	// Release is [inbox.LeaseStore.Release].
	Release
	// Mark is [inbox.Store.MarkProcessed].
	Mark
	// Fail is [inbox.LeaseStore.Fail].
	Fail
	// Extend is [inbox.LeaseStore.Extend]: its result is a Claim whose
	// ExpiresAt is the new deadline. A driver's Apply gets Extend ops only
	// with [Config.BatchExtend].
	Extend
)

var kindNames = [...]string{Claim: "TryBegin", Complete: "Complete", Release: "Release", Mark: "MarkProcessed", Fail: "Fail", Extend: "Extend"}

// String returns the name of the store method k stands for ("TryBegin",
// "Complete", "Release", "MarkProcessed", "Fail", "Extend").
func (k Kind) String() string {
	if k > 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Op is one call carried by a batch. The layer has validated every field.
type Op struct {
	Kind Kind
	Key  string

	// LeaseID is, for a Claim, the id of the lease to grant, never empty
	// (the layer picks one when the caller did not), and for Complete,
	// Release and Fail the holder's.
	LeaseID string

	// Lease is the length of a Claim's lease: positive, the default
	// (Config.Lease) applied; zero only when Config.Lease is zero, for a
	// backend that picks its own default. For an Extend, the new length,
	// positive.
	Lease time.Duration

	// Owner, PayloadHash, OrderKey and Retry are the Claim's
	// [inbox.BeginOptions] fields. OrderKey is empty unless the driver
	// keeps order ([Config.Order]).
	Owner       string
	PayloadHash string
	OrderKey    string
	Retry       bool

	// Failure holds a Fail's options; its OrderKey is empty unless the
	// driver keeps order.
	Failure inbox.FailOptions

	// ExpiresAt is, for a Complete whose caller knows it, the ExpiresAt of
	// the claim that acquired the lease, with Lease its granted length and
	// Owner and PayloadHash its options: what the claim wrote, so that a
	// driver may complete the key without reading its record first. Zero
	// otherwise (the Complete method has none).
	ExpiresAt time.Time
}

// Driver is what a backend implements. Its methods are called only with
// validated arguments, on a store that was not closed, under a context that
// bounds the call. Errors that are the outcome of one call wrap a sentinel
// of package inbox: [inbox.ErrLeaseLost] for a Complete, Release or Fail
// whose lease no longer holds the key, [inbox.ErrNotSupported],
// [inbox.ErrStoreUnavailable] (a backend error whose cause is known, such
// as a full store); a closed client wraps [inbox.ErrClosed]. Any other
// error is taken for a failure of the backend and reported as
// [inbox.ErrStoreUnavailable]. Backend sentinels (redis.Nil,
// sql.ErrNoRows, mongo.ErrNoDocuments) must not be returned.
type Driver interface {
	// Apply runs ops, in one round trip where the backend allows, and sets
	// res[i] (Claims only) and errs[i] for ops[i]; len(res) and len(errs)
	// are len(ops). A Busy claim sets [inbox.Claim.BackingOff] when it met
	// a failed attempt's backoff rather than a live lease; the layer
	// passes every field of a claim on as it is. Ops on the same key take effect in slice order (a
	// Release followed by a Claim of its key acquires it; several Claims of
	// one key give exactly one Acquired while the lease is live); ops on
	// different keys may be applied in any order. A non-nil return fails
	// every op of the batch. Apply must not keep the slices after it
	// returns: the layer reuses them.
	Apply(ctx context.Context, ops []Op, res []inbox.Claim, errs []error) error

	// Extend is [inbox.LeaseStore.Extend].
	Extend(ctx context.Context, key, leaseID string, lease time.Duration) (time.Time, error)

	// Get is [inbox.LeaseStore.Get].
	Get(ctx context.Context, key string) (inbox.Record, error)

	// List, Forget and ForceRelease are [inbox.Admin]'s. List gets options
	// with the Limit default applied.
	List(ctx context.Context, opts inbox.ListOptions) (inbox.ListPage, error)
	Forget(ctx context.Context, key string) error
	ForceRelease(ctx context.Context, key string) error

	// Close releases what the driver holds. The layer calls it once, from
	// [Store.Close].
	Close() error
}

// Orderer is what a [Driver] that keeps order ([Config.Order]) implements
// besides: the operators' side of [inbox.OrderAdmin]. Its Apply then
// answers a Claim with an OrderKey [inbox.Behind] while another key of the
// order key is at its head, and a Fail with an OrderKey puts the key at
// the head when nothing is.
type Orderer interface {
	// Order is [inbox.OrderAdmin.Order].
	Order(ctx context.Context, orderKey string) (inbox.OrderGate, error)
	// ReleaseOrder is [inbox.OrderAdmin.ReleaseOrder].
	ReleaseOrder(ctx context.Context, orderKey, head string) error
}

// Config configures [New].
type Config struct {
	// Name names the store in errors, e.g. "redis store". Required.
	Name string

	// Lease is the lease granted when TryBegin asks for none. Optional:
	// zero passes Op.Lease zero on to the driver, for a backend that picks
	// its default itself (a remote service).
	Lease time.Duration

	// Retention is how long the backend keeps a processed key, reported
	// by [Store.Retention] ([inbox.RetentionReporter]). Optional; zero
	// means not known. The layer does not enforce it: the driver does.
	Retention time.Duration

	// MaxLease is the longest lease TryBegin and Extend accept; longer ones
	// fail with [inbox.ErrInvalidLease]. Optional; zero means no bound.
	MaxLease time.Duration

	// Timeout bounds each call, the time it waits in a batch's queue
	// included, unless the caller's context ends sooner. Optional; zero or
	// negative means no bound of the store's own (a store whose calls never
	// block, such as the memory store).
	Timeout time.Duration

	// Batch bounds the batching of Apply. Optional; the zero value sends
	// every call alone, at once.
	Batch Batch

	// BatchExtend says that the driver's Apply takes Extend ops, so that
	// heartbeats that fall due together share a round trip. Without it the
	// layer makes each Extend op of a batch a call of Driver.Extend.
	BatchExtend bool

	// Order says that the driver keeps the order of order keys
	// ([inbox.BeginOptions.OrderKey]) and implements [Orderer]. Without
	// it, the layer refuses TryBegin and Fail with an OrderKey, Order and
	// ReleaseOrder with [inbox.ErrNotSupported], and [Store.KeepsOrder]
	// is false.
	Order bool

	// InProcess says that the driver keeps its records in this process and
	// that its calls never wait on I/O (the memory store): [Store.Go] then
	// applies an op in the calling goroutine.
	InProcess bool

	// Workers is how many goroutines of the store's own make the calls of
	// [Store.Go] when it neither batches ([Batch.MaxBatch] of zero or one)
	// nor runs in process: a fixed set, started on first use and stopped
	// by Close, each making one call at a time; calls beyond them wait in
	// a queue of [Batch.MaxQueue] calls. Optional; default
	// [DefaultWorkers].
	Workers int
}

// DefaultWorkers is the default of [Config.Workers].
const DefaultWorkers = 16

// Batch configures the group commit of [Driver.Apply]; see "Batching" in
// the package documentation.
type Batch struct {
	// MaxBatch bounds the calls of one Apply. Zero or one turns batching
	// off: every call is an Apply of its own, made at once, however many
	// are in flight.
	MaxBatch int
	// MaxQueue bounds the calls waiting for a round trip; callers beyond it
	// wait for room, honouring their context. Default 1024.
	MaxQueue int
	// MaxInFlight is how many round trips may be in flight at once; a call
	// that finds fewer goes out at once. Default 1.
	MaxInFlight int
}

// Store is the portable layer over a [Driver]: an [inbox.LeaseStore] that
// validates input, refuses calls once closed, bounds each call, maps
// errors to the inbox sentinels and batches Apply. It is safe for
// concurrent use. Stores embed it and add what is their own (options,
// statistics, maintenance).
type Store struct {
	d      Driver
	cfg    Config
	b      *batch.Batcher[Op, inbox.Claim] // nil without batching
	pool   *batch.Batcher[Op, inbox.Claim] // Go's workers (batches of one); nil with b or InProcess
	ord    Orderer                         // nil without Config.Order
	closed atomic.Bool
	stats  BatchCounter
}

var (
	_ inbox.LeaseStore        = (*Store)(nil)
	_ inbox.Admin             = (*Store)(nil)
	_ inbox.RetentionReporter = (*Store)(nil)
	_ inbox.OrderAdmin        = (*Store)(nil)
)

// New returns the portable store over d.
func New(d Driver, cfg Config) (*Store, error) {
	switch {
	case d == nil:
		return nil, fmt.Errorf("%w: driver is nil", inbox.ErrInvalidArgument)
	case cfg.Name == "":
		return nil, fmt.Errorf("%w: driver.Config.Name is required", inbox.ErrInvalidArgument)
	case cfg.Lease < 0:
		return nil, fmt.Errorf("%w: %s: default lease %s is negative", inbox.ErrInvalidLease, cfg.Name, cfg.Lease)
	case cfg.Retention < 0:
		return nil, fmt.Errorf("%w: %s: retention %s is negative", inbox.ErrInvalidArgument, cfg.Name, cfg.Retention)
	case cfg.MaxLease < 0 || (cfg.MaxLease > 0 && cfg.Lease > cfg.MaxLease):
		return nil, fmt.Errorf("%w: %s: default lease %s is outside (0, %s]", inbox.ErrInvalidLease, cfg.Name, cfg.Lease, cfg.MaxLease)
	}
	s := &Store{d: d, cfg: cfg}
	if cfg.Order {
		ord, ok := d.(Orderer)
		if !ok {
			return nil, fmt.Errorf("%w: %s: Config.Order is set but the driver (%T) is no driver.Orderer", inbox.ErrInvalidArgument, cfg.Name, d)
		}
		s.ord = ord
	}
	switch {
	case cfg.Workers < 0:
		return nil, fmt.Errorf("%w: %s: %d workers", inbox.ErrInvalidArgument, cfg.Name, cfg.Workers)
	case cfg.Batch.MaxBatch > 1:
		s.b = batch.New(s.apply, batch.Options{MaxBatch: cfg.Batch.MaxBatch, MaxQueue: cfg.Batch.MaxQueue, MaxInFlight: cfg.Batch.MaxInFlight, Timeout: cfg.Timeout})
	case !cfg.InProcess:
		// A batcher whose batches hold one call each is a fixed set of
		// workers with a bounded queue, and one timer for Timeout.
		s.pool = batch.New(s.apply, batch.Options{MaxBatch: 1, MaxQueue: cfg.Batch.MaxQueue, MaxInFlight: cmp.Or(cfg.Workers, DefaultWorkers), Timeout: cfg.Timeout})
	}
	return s, nil
}

// Retention implements [inbox.RetentionReporter]: [Config.Retention], zero
// when the driver did not say.
func (s *Store) Retention() time.Duration { return s.cfg.Retention }

// Close makes every later call fail with [inbox.ErrClosed] and closes the
// driver. Calls in flight finish or fail as the driver's Close leaves them.
// Closing twice is a no-op.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	if s.b != nil {
		s.b.Close()
	}
	if s.pool != nil {
		s.pool.Close()
	}
	return s.d.Close()
}

// TryBegin implements [inbox.LeaseStore].
func (s *Store) TryBegin(ctx context.Context, key string, opts inbox.BeginOptions) (inbox.Claim, error) {
	return s.do(ctx, Op{Kind: Claim, Key: key, LeaseID: opts.LeaseID, Lease: opts.Lease, Owner: opts.Owner, PayloadHash: opts.PayloadHash, OrderKey: opts.OrderKey, Retry: opts.Retry})
}

// Complete implements [inbox.LeaseStore].
func (s *Store) Complete(ctx context.Context, key, leaseID string) error {
	_, err := s.do(ctx, Op{Kind: Complete, Key: key, LeaseID: leaseID})
	return err
}

// Release implements [inbox.LeaseStore].
func (s *Store) Release(ctx context.Context, key, leaseID string) error {
	_, err := s.do(ctx, Op{Kind: Release, Key: key, LeaseID: leaseID})
	return err
}

// Fail implements [inbox.LeaseStore].
func (s *Store) Fail(ctx context.Context, key, leaseID string, opts inbox.FailOptions) error {
	_, err := s.do(ctx, Op{Kind: Fail, Key: key, LeaseID: leaseID, Failure: opts})
	return err
}

// MarkProcessed implements [inbox.Store]. It marks key processed whatever
// lease is held on it; the holder's Complete then fails with
// [inbox.ErrLeaseLost].
func (s *Store) MarkProcessed(ctx context.Context, key string) error {
	_, err := s.do(ctx, Op{Kind: Mark, Key: key})
	return err
}

// Extend implements [inbox.LeaseStore].
func (s *Store) Extend(ctx context.Context, key, leaseID string, lease time.Duration) (time.Time, error) {
	c, err := s.do(ctx, Op{Kind: Extend, Key: key, LeaseID: leaseID, Lease: lease})
	return c.ExpiresAt, err
}

// Go makes op as the method of its kind does (a TryBegin, Complete,
// Release, Fail, MarkProcessed or Extend, validated and answered alike),
// without waiting for its result: then gets the result, once. A store that
// batches queues op with the calls in flight, or hands it to a goroutine
// of its batcher, so that the caller never waits for a round trip; then
// runs in the goroutine that ends the round trip. An in-process store
// ([Config.InProcess]) applies op at once, in the calling goroutine; any
// other store hands op to one of its workers ([Config.Workers]), waiting
// only while their queue is full. No store starts a goroutine per call.
// then must be quick and must not block: other calls' results wait for
// it. The middleware marks keys this way, without a goroutine per message.
func (s *Store) Go(ctx context.Context, op Op, then func(inbox.Claim, error)) {
	if err := s.check(ctx, &op); err != nil {
		then(inbox.Claim{}, err)
		return
	}
	switch {
	case s.cfg.InProcess && s.b == nil:
		then(s.one(ctx, op))
	default:
		b := cmp.Or(s.b, s.pool)
		b.Go(ctx, op, func(c inbox.Claim, err error) { then(s.answer(ctx, op, c, err)) })
	}
}

// Get implements [inbox.LeaseStore].
func (s *Store) Get(ctx context.Context, key string) (inbox.Record, error) {
	return s.get(ctx, "Get", key)
}

// IsProcessed implements [inbox.Store]: a Get whose state is
// [inbox.StateProcessed].
func (s *Store) IsProcessed(ctx context.Context, key string) (bool, error) {
	r, err := s.get(ctx, "IsProcessed", key)
	return r.State == inbox.StateProcessed, err
}

func (s *Store) get(ctx context.Context, op, key string) (inbox.Record, error) {
	if err := inbox.ValidateKey(key); err != nil {
		return inbox.Record{}, err
	}
	return call(s, ctx, op, key, func(ctx context.Context) (inbox.Record, error) { return s.d.Get(ctx, key) })
}

// List implements [inbox.Admin].
func (s *Store) List(ctx context.Context, opts inbox.ListOptions) (inbox.ListPage, error) {
	if err := opts.Validate(); err != nil {
		return inbox.ListPage{}, err
	}
	if opts.Limit == 0 {
		opts.Limit = inbox.DefaultListLimit
	}
	return call(s, ctx, "List", opts.Prefix, func(ctx context.Context) (inbox.ListPage, error) { return s.d.List(ctx, opts) })
}

// Forget implements [inbox.Admin].
func (s *Store) Forget(ctx context.Context, key string) error {
	return s.byKey(ctx, "Forget", key, s.d.Forget)
}

// ForceRelease implements [inbox.Admin].
func (s *Store) ForceRelease(ctx context.Context, key string) error {
	return s.byKey(ctx, "ForceRelease", key, s.d.ForceRelease)
}

// KeepsOrder implements [inbox.OrderAdmin]: [Config.Order].
func (s *Store) KeepsOrder() bool { return s.cfg.Order }

// Order implements [inbox.OrderAdmin].
func (s *Store) Order(ctx context.Context, orderKey string) (inbox.OrderGate, error) {
	if err := s.checkOrder("Order", orderKey, orderKey); err != nil {
		return inbox.OrderGate{}, err
	}
	return call(s, ctx, "Order", orderKey, func(ctx context.Context) (inbox.OrderGate, error) { return s.ord.Order(ctx, orderKey) })
}

// ReleaseOrder implements [inbox.OrderAdmin].
func (s *Store) ReleaseOrder(ctx context.Context, orderKey, head string) error {
	if err := inbox.ValidateKey(head); err != nil {
		return err
	}
	if err := s.checkOrder("ReleaseOrder", orderKey, orderKey); err != nil {
		return err
	}
	_, err := call(s, ctx, "ReleaseOrder", orderKey, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, s.ord.ReleaseOrder(ctx, orderKey, head)
	})
	return err
}

// checkOrder refuses orderKey, the OrderKey of the call op on key, when it
// is not a valid key or the store does not keep order.
func (s *Store) checkOrder(op, key, orderKey string) error {
	if err := validateOrderKey(orderKey); err != nil {
		return err
	}
	if !s.cfg.Order {
		return fmt.Errorf("%s: %s %q: %w: the store keeps no order (OrderKey %q)", s.cfg.Name, op, key, inbox.ErrNotSupported, orderKey)
	}
	return nil
}

// validateOrderKey checks an OrderKey as [inbox.ValidateKey] checks a
// key, naming the field.
func validateOrderKey(k string) error {
	switch {
	case k == "":
		return fmt.Errorf("%w: OrderKey is empty", inbox.ErrInvalidKey)
	case len(k) > inbox.MaxKeyLen:
		return fmt.Errorf("%w: OrderKey is %d bytes, longer than the limit of %d (OrderKey starts %q)", inbox.ErrInvalidKey, len(k), inbox.MaxKeyLen, k[:32])
	case !utf8.ValidString(k):
		return fmt.Errorf("%w: OrderKey %q is not valid UTF-8", inbox.ErrInvalidKey, k)
	case strings.IndexByte(k, 0) >= 0:
		return fmt.Errorf("%w: OrderKey %q holds a NUL byte", inbox.ErrInvalidKey, k)
	}
	return nil
}

func (s *Store) byKey(ctx context.Context, op, key string, f func(context.Context, string) error) error {
	if err := inbox.ValidateKey(key); err != nil {
		return err
	}
	_, err := call(s, ctx, op, key, func(ctx context.Context) (struct{}, error) { return struct{}{}, f(ctx, key) })
	return err
}

// call makes f, a driver call that is not batched, bounded by
// Config.Timeout, and maps its error.
func call[T any](s *Store, ctx context.Context, op, key string, f func(context.Context) (T, error)) (T, error) {
	var zero T
	if s.closed.Load() {
		return zero, fmt.Errorf("%s: %s %q: %w", s.cfg.Name, op, key, inbox.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return zero, s.ctxError(op, key, err, err)
	}
	cctx, cancel := s.bound(ctx)
	defer cancel()
	v, err := f(cctx)
	if err != nil {
		return zero, s.fail(cctx, op, key, err)
	}
	return v, nil
}

// checkLease refuses a lease longer than Config.MaxLease.
func (s *Store) checkLease(d time.Duration) error {
	if s.cfg.MaxLease > 0 && d > s.cfg.MaxLease {
		return fmt.Errorf("%w: lease %s is longer than the %s's limit of %s", inbox.ErrInvalidLease, d, s.cfg.Name, s.cfg.MaxLease)
	}
	return nil
}

// check validates op as the method of its kind does, applies the
// defaults of a claim, and checks that the store is open and ctx live.
func (s *Store) check(ctx context.Context, op *Op) error {
	var err error
	switch op.Kind {
	case Claim:
		err = inbox.ValidateKey(op.Key)
		if err == nil {
			err = inbox.BeginOptions{Owner: op.Owner, Lease: op.Lease, LeaseID: op.LeaseID, PayloadHash: op.PayloadHash}.Validate()
		}
		if err == nil {
			err = s.checkLease(op.Lease)
		}
		if err == nil && op.OrderKey != "" {
			err = s.checkOrder(op.Kind.String(), op.Key, op.OrderKey)
		}
		if op.Lease == 0 {
			op.Lease = s.cfg.Lease
		}
		if op.LeaseID == "" {
			op.LeaseID = inbox.NewLeaseID()
		}
	case Mark:
		err = inbox.ValidateKey(op.Key)
	case Complete, Release:
		err = inbox.ValidateHolder(op.Key, op.LeaseID)
	case Fail:
		err = inbox.ValidateHolder(op.Key, op.LeaseID)
		if err == nil {
			err = op.Failure.Validate()
		}
		if err == nil && op.Failure.OrderKey != "" {
			err = s.checkOrder(op.Kind.String(), op.Key, op.Failure.OrderKey)
		}
		if op.Failure.Dead {
			op.Failure.RetryAfter = 0
		}
	case Extend:
		err = inbox.ValidateHolder(op.Key, op.LeaseID)
		if err == nil {
			err = inbox.ValidateLease(op.Lease)
		}
		if err == nil {
			err = s.checkLease(op.Lease)
		}
	default:
		err = fmt.Errorf("%w: operation %v", inbox.ErrNotSupported, op.Kind)
	}
	if err != nil {
		return err
	}
	if s.closed.Load() {
		return fmt.Errorf("%s: %s %q: %w", s.cfg.Name, op.Kind, op.Key, inbox.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return s.ctxError(op.Kind.String(), op.Key, err, err)
	}
	return nil
}

// do makes op and waits for its result: through the batcher, which bounds
// it by Config.Timeout, when batching is on; else alone, at once.
func (s *Store) do(ctx context.Context, op Op) (inbox.Claim, error) {
	if err := s.check(ctx, &op); err != nil {
		return inbox.Claim{}, err
	}
	if s.b == nil {
		return s.one(ctx, op)
	}
	c, err := s.b.Do(ctx, op)
	return s.answer(ctx, op, c, err)
}

// one applies op alone, bounded by Config.Timeout.
func (s *Store) one(ctx context.Context, op Op) (inbox.Claim, error) {
	cctx, cancel := s.bound(ctx)
	defer cancel()
	o := ones.Get().(*one)
	o.ops[0] = op
	err := s.apply(cctx, o.ops[:], o.res[:], o.errs[:])
	c := o.res[0]
	if err == nil {
		err = o.errs[0]
	}
	*o = one{}
	ones.Put(o)
	return s.answer(cctx, op, c, err)
}

// answer maps the error of op, made under callCtx, and checks the
// driver's claim.
func (s *Store) answer(callCtx context.Context, op Op, c inbox.Claim, err error) (inbox.Claim, error) {
	if err != nil {
		return inbox.Claim{}, s.fail(callCtx, op.Kind.String(), op.Key, err)
	}
	if op.Kind == Claim && !validClaim(op, c) {
		return inbox.Claim{}, s.fail(callCtx, op.Kind.String(), op.Key, fmt.Errorf("%w: the driver answered %+v", inbox.ErrStoreUnavailable, c))
	}
	return c, nil
}

// validClaim reports whether c is an answer the driver may give to op, a
// Claim: Behind only to a claim with an OrderKey.
func validClaim(op Op, c inbox.Claim) bool {
	switch c.Status {
	case inbox.Acquired:
		return c.LeaseID != ""
	case inbox.Processed, inbox.Busy, inbox.Dead:
		return true
	case inbox.Behind:
		return op.OrderKey != ""
	}
	return false
}

// one holds the arguments of an unbatched Apply, reused through ones.
type one struct {
	ops  [1]Op
	res  [1]inbox.Claim
	errs [1]error
}

var ones = sync.Pool{New: func() any { return new(one) }}

// apply is one round trip: the driver's Apply, counted. Without
// Config.BatchExtend, the batch's Extend ops are calls of Driver.Extend,
// made first, and Apply gets the others.
func (s *Store) apply(ctx context.Context, ops []Op, res []inbox.Claim, errs []error) error {
	s.stats.Add(len(ops))
	if s.cfg.BatchExtend || !slices.ContainsFunc(ops, func(op Op) bool { return op.Kind == Extend }) {
		return s.d.Apply(ctx, ops, res, errs)
	}
	var idx []int
	for i, op := range ops {
		if op.Kind == Extend {
			res[i].ExpiresAt, errs[i] = s.d.Extend(ctx, op.Key, op.LeaseID, op.Lease)
		} else {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return nil
	}
	rest, rres, rerrs := make([]Op, len(idx)), make([]inbox.Claim, len(idx)), make([]error, len(idx))
	for j, i := range idx {
		rest[j] = ops[i]
	}
	if err := s.d.Apply(ctx, rest, rres, rerrs); err != nil {
		return err
	}
	for j, i := range idx {
		res[i], errs[i] = rres[j], rerrs[j]
	}
	return nil
}

// bound returns the context of one call that is not batched: ctx,
// bounded by Config.Timeout unless it ends sooner. (A batched call is
// bounded by the batcher, without a timer of its own.)
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.cfg.Timeout <= 0 {
		return ctx, noCancel
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= s.cfg.Timeout {
		return ctx, noCancel
	}
	return context.WithTimeout(ctx, s.cfg.Timeout)
}

func noCancel() {}

// fail maps err, the error of a call made under callCtx, to the contract:
// the driver's inbox sentinels are kept; the end of the call's context is
// context.Canceled for a caller that went away, and a store that did not
// answer in time (ErrStoreUnavailable and DeadlineExceeded) for a
// deadline; anything else is ErrStoreUnavailable.
func (s *Store) fail(callCtx context.Context, op, key string, err error) error {
	switch {
	case errors.Is(err, inbox.ErrLeaseLost), errors.Is(err, inbox.ErrInvalidArgument),
		errors.Is(err, inbox.ErrNotSupported), errors.Is(err, inbox.ErrClosed):
		return fmt.Errorf("%s: %s %q: %w", s.cfg.Name, op, key, err)
	case callCtx.Err() != nil:
		return s.ctxError(op, key, callCtx.Err(), err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		ctxErr := context.Canceled
		if errors.Is(err, context.DeadlineExceeded) {
			ctxErr = context.DeadlineExceeded
		}
		return s.ctxError(op, key, ctxErr, err)
	case errors.Is(err, inbox.ErrStoreUnavailable):
		return fmt.Errorf("%s: %s %q: %w", s.cfg.Name, op, key, err)
	}
	return fmt.Errorf("%s: %s %q: %w: %w", s.cfg.Name, op, key, inbox.ErrStoreUnavailable, err)
}

// ctxError wraps err for a call ended by its context (ctxErr): a canceled
// caller gets context.Canceled; a deadline (the caller's or Timeout) means
// the store did not answer in time, so it wraps both
// inbox.ErrStoreUnavailable and context.DeadlineExceeded.
func (s *Store) ctxError(op, key string, ctxErr, err error) error {
	wrapped := ctxErr
	if errors.Is(ctxErr, context.DeadlineExceeded) {
		wrapped = fmt.Errorf("%w: %w", inbox.ErrStoreUnavailable, ctxErr)
	}
	if err == nil || err == ctxErr {
		return fmt.Errorf("%s: %s %q: %w", s.cfg.Name, op, key, wrapped)
	}
	return fmt.Errorf("%s: %s %q: %w (%w)", s.cfg.Name, op, key, wrapped, err)
}

// OneByOne is a backend that applies one operation at a time (it has no
// batch form, as protocol v1 or a document store's conditional updates):
// [ApplyEach] makes its [Driver.Apply]. Each method has the semantics of
// the Op of its name.
type OneByOne interface {
	Claim(ctx context.Context, op Op) (inbox.Claim, error)
	Complete(ctx context.Context, key, leaseID string) error
	Release(ctx context.Context, key, leaseID string) error
	Mark(ctx context.Context, key string) error
	Fail(ctx context.Context, key, leaseID string, opts inbox.FailOptions) error
}

// ApplyEach is [Driver.Apply] for a [OneByOne] backend: the ops one after
// the other, in order, each with its own result and error.
func ApplyEach(ctx context.Context, d OneByOne, ops []Op, res []inbox.Claim, errs []error) {
	for i, op := range ops {
		switch op.Kind {
		case Claim:
			res[i], errs[i] = d.Claim(ctx, op)
		case Complete:
			errs[i] = d.Complete(ctx, op.Key, op.LeaseID)
		case Release:
			errs[i] = d.Release(ctx, op.Key, op.LeaseID)
		case Mark:
			errs[i] = d.Mark(ctx, op.Key)
		case Fail:
			errs[i] = d.Fail(ctx, op.Key, op.LeaseID, op.Failure)
		default:
			errs[i] = fmt.Errorf("%w: operation %v", inbox.ErrNotSupported, op.Kind)
		}
	}
}
