package mongostore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
)

// Defaults of [Options].
const (
	// DefaultCollection is the collection used when Options.Collection is
	// empty.
	DefaultCollection = "inbox"

	// DefaultTimeout bounds each store call when Options.Timeout is zero.
	DefaultTimeout = 5 * time.Second
)

// Options configure a [Store].
type Options struct {
	// Database holds the collection. Required.
	Database string

	// Collection holds one document per key. Optional; default
	// [DefaultCollection] ("inbox").
	Collection string

	// Retention is how long a processed key stays processed. Optional;
	// default inbox.DefaultRetention (7 days).
	Retention time.Duration

	// Lease is the lease granted when TryBegin asks for none. Optional;
	// default inbox.DefaultLease (30 s).
	Lease time.Duration

	// Timeout bounds each store call, all its round trips included, on top
	// of the caller's context; a call that runs out of it fails with
	// inbox.ErrStoreUnavailable wrapping context.DeadlineExceeded.
	// Optional; default [DefaultTimeout] (5 s); negative means no bound of
	// the store's own, so only the caller's context and the client's own
	// timeouts apply.
	Timeout time.Duration

	// Logger receives the store's rare messages: the clock estimate at New
	// (debug) and a refused TTL index (error level: Watermill's logger has no
	// warning level). Optional; default watermill.NewSlogLogger(nil), which
	// logs to slog.Default().
	Logger watermill.LoggerAdapter

	// NoTTLIndex keeps [New] (and a store opened by URL, unless
	// ensure_indexes=false says the same) from creating the TTL index on
	// expiresAt ([Store.EnsureIndexes]) that lets the server delete expired
	// records. Optional; default false: the index is created with the
	// collection, so that expired records are deleted by default. Set it
	// when the application's user may not create indexes and an operator
	// creates the index once.
	NoTTLIndex bool

	// LocalClock is the local clock the store measures elapsed time with
	// between samples of the server's clock (see the package
	// documentation). Optional; default time.Now. Tests set it to simulate a
	// host whose clock is off.
	LocalClock func() time.Time
}

func (o *Options) setDefaults() {
	if o.Collection == "" {
		o.Collection = DefaultCollection
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
	if o.Logger == nil {
		o.Logger = watermill.NewSlogLogger(nil)
	}
	if o.LocalClock == nil {
		o.LocalClock = time.Now
	}
}

// Validate reports whether o is usable after defaults. Errors wrap
// inbox.ErrInvalidArgument.
func (o Options) Validate() error {
	switch {
	case o.Database == "":
		return fmt.Errorf("%w: mongo store: Options.Database is required", inbox.ErrInvalidArgument)
	case strings.ContainsAny(o.Database, "/\\. \"$*<>:|?\x00"):
		return fmt.Errorf("%w: mongo store: database name %q holds a character MongoDB refuses (/\\. \"$*<>:|? or NUL)", inbox.ErrInvalidArgument, o.Database)
	case strings.ContainsAny(o.Collection, "$\x00") || strings.HasPrefix(o.Collection, "system."):
		return fmt.Errorf("%w: mongo store: collection name %q holds $ or NUL or starts with \"system.\"", inbox.ErrInvalidArgument, o.Collection)
	case o.Retention < 0:
		return fmt.Errorf("%w: mongo store: Retention %s is negative", inbox.ErrInvalidArgument, o.Retention)
	case o.Lease < 0:
		return fmt.Errorf("%w: mongo store: Lease %s is negative", inbox.ErrInvalidLease, o.Lease)
	}
	return nil
}

// Store is the MongoDB [inbox.LeaseStore]. It is safe for concurrent use.
// The portable layer it embeds ([driver.Store]) validates input, refuses
// calls once closed, fills in the lease and the lease id, bounds each call
// by Options.Timeout and names the store, the operation and the key in
// errors; what is MongoDB's own (the documents, the claim algorithm, the
// server's clock) is in its driver.
//
// Its methods are those of the portable layer it embeds, [driver.Store],
// with the contracts of [inbox.LeaseStore] and [inbox.Admin]:
//
//   - TryBegin(ctx, key, opts) (inbox.Claim, error): claims key with a
//     lease: Acquired, Busy (another live lease, or a failed attempt's
//     backoff), Processed or Dead.
//   - Complete(ctx, key, leaseID): marks key processed under the lease;
//     repeating it after success succeeds.
//   - Release(ctx, key, leaseID): gives the lease back unmarked.
//   - Fail(ctx, key, leaseID, opts): ends a failed attempt: the key waits
//     out opts.RetryAfter, or is dead with opts.Dead.
//   - Extend(ctx, key, leaseID, lease) (time.Time, error): renews the lease.
//   - Get(ctx, key) (inbox.Record, error): what the store knows of key.
//   - IsProcessed(ctx, key), MarkProcessed(ctx, key): the minimal contract
//     ([inbox.Store]).
//   - List, Forget, ForceRelease: the operators' calls (cmd/inboxctl).
//   - KeepsOrder, Order, ReleaseOrder ([inbox.OrderAdmin]): the store
//     keeps no order; an OrderKey fails with [inbox.ErrNotSupported].
//   - Retention() time.Duration: how long a processed key stays processed
//     ([inbox.RetentionReporter], for the middleware's stale check).
//   - BatchStats: how calls were batched; Close.
//
// Complete, Release, Fail and Extend fail with [inbox.ErrLeaseLost] when
// leaseID no longer holds the key; bad input wraps
// [inbox.ErrInvalidArgument]; a backend failure wraps
// [inbox.ErrStoreUnavailable].
type Store struct {
	*driver.Store
	b *backend
}

var _ inbox.LeaseStore = (*Store)(nil)

// backend is the store's [driver.Driver]: the collection, and the estimate of
// the server's clock.
type backend struct {
	opts   Options
	client *mongo.Client
	coll   *mongo.Collection
	clock  *serverClock
	owned  bool        // Close disconnects the client (opened from a URL)
	closed atomic.Bool // for the calls the layer does not make: EnsureIndexes, the check at Open
	// lazyTTL: opened with check=false and without ensure_indexes=false:
	// the first call creates the TTL index (ttlPending until it did).
	lazyTTL    bool
	ttlPending atomic.Bool
}

// New returns a store over client, which the caller keeps owning: Close does
// not disconnect it. New reads the server's clock (see the package
// documentation), so the server must answer within Options.Timeout: that
// checks the client connects and authenticates, not that the user may use
// the database. It creates the TTL index on expiresAt, unless
// Options.NoTTLIndex (see [Store.EnsureIndexes]; a server or a user that
// may not create it is logged, not an error). The
// client's logger is the caller's to configure (options.Client().
// SetLoggerOptions); stores opened by URL route theirs to Options.Logger.
func New(ctx context.Context, client *mongo.Client, opts Options) (*Store, error) {
	s, err := newStore(client, opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel, err := s.b.bound(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	if err := s.b.clock.sync(ctx, clockSamples); err != nil {
		if errors.Is(err, errServerClock) {
			return nil, fmt.Errorf("%w: mongo store: %v", inbox.ErrNotSupported, err)
		}
		return nil, s.b.fail(ctx, "reading the server's clock", err)
	}
	s.b.logClock()
	if !opts.NoTTLIndex {
		if err := s.b.ensureTTL(ctx, false); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// logClock logs the clock estimate at debug level.
func (b *backend) logClock() {
	bound, offset := b.clock.errorBound()
	b.opts.Logger.Debug("mongo store: server clock read", watermill.LogFields{
		"database": b.opts.Database, "collection": b.opts.Collection,
		"clock_offset": offset.String(), "clock_error_bound": bound.String(),
	})
}

// newStore makes the store without contacting the server: its first call
// reads the server's clock.
func newStore(client *mongo.Client, opts Options) (*Store, error) {
	opts.setDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if client == nil {
		return nil, fmt.Errorf("%w: mongo store: client is nil", inbox.ErrInvalidArgument)
	}
	b := &backend{
		opts:   opts,
		client: client,
		coll:   client.Database(opts.Database).Collection(opts.Collection),
		clock:  &serverClock{db: client.Database("admin"), local: opts.LocalClock},
	}
	// No batching: see docs/stores.md (MongoDB, "Round trips"). A
	// negative Timeout is the layer's "no bound".
	ds, err := driver.New(b, driver.Config{Name: "mongo store", Lease: opts.Lease, Retention: opts.Retention, Timeout: opts.Timeout})
	if err != nil {
		return nil, err
	}
	return &Store{Store: ds, b: b}, nil
}

// Close implements [driver.Driver]; the layer calls it once, from
// [Store.Close], after which every call fails with inbox.ErrClosed. A store
// opened from a URL disconnects its client; a store built by [New] leaves
// the caller's client connected.
func (b *backend) Close() error {
	b.closed.Store(true)
	if !b.owned {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	defer cancel()
	if err := b.client.Disconnect(ctx); err != nil {
		return fmt.Errorf("mongo store: disconnecting: %w: %v", inbox.ErrStoreUnavailable, err)
	}
	return nil
}

// doc is the document of one key. See the package documentation.
type doc struct {
	ID          string    `bson:"_id"`
	LeaseID     string    `bson:"leaseId"`
	LeaseUntil  time.Time `bson:"leaseUntil"`
	Processed   bool      `bson:"processed"`
	Dead        bool      `bson:"dead"`
	Reason      string    `bson:"reason"`
	RetryAt     time.Time `bson:"retryAt"`
	Attempts    int64     `bson:"attempts"`
	FirstSeen   time.Time `bson:"firstSeen"`
	LastSeen    time.Time `bson:"lastSeen"`
	ExpiresAt   time.Time `bson:"expiresAt"`
	Owner       string    `bson:"owner"`
	PayloadHash string    `bson:"payloadHash"`
}

// noLease is the leaseUntil of a record without a lease (released,
// processed), and the retryAt of one without a backoff: the epoch, so
// "leaseUntil <= now" and "retryAt <= now" match it.
var noLease = time.Unix(0, 0).UTC()

func (d *doc) live(now time.Time) bool { return now.Before(d.ExpiresAt) }

func (d *doc) state(now time.Time) inbox.State {
	switch {
	case d.Processed:
		return inbox.StateProcessed
	case d.Dead:
		return inbox.StateDead
	case now.Before(d.LeaseUntil):
		return inbox.StateInProgress
	default:
		return inbox.StateAvailable
	}
}

// record is what Get and List report of d at now.
func (d *doc) record(now time.Time) inbox.Record {
	r := inbox.Record{
		State:       d.state(now),
		Attempts:    int(d.Attempts),
		FirstSeen:   d.FirstSeen.UTC(),
		LastSeen:    d.LastSeen.UTC(),
		Owner:       d.Owner,
		PayloadHash: d.PayloadHash,
		Reason:      d.Reason,
	}
	if r.State == inbox.StateInProgress {
		r.LeaseUntil = d.LeaseUntil.UTC()
	}
	if r.State == inbox.StateAvailable && now.Before(d.RetryAt) {
		r.RetryAt = d.RetryAt.UTC()
	}
	return r
}

func (d *doc) mismatch(hash string) bool {
	return hash != "" && d.PayloadHash != "" && d.PayloadHash != hash
}

// ready reads the server's clock when the store has not read it yet (opened
// with check=false), within the call's bound.
func (b *backend) ready(ctx context.Context) error {
	if b.clock.synced.Load() {
		return nil
	}
	err := b.clock.sync(ctx, clockSamples)
	if err == nil && b.lazyTTL && b.ttlPending.CompareAndSwap(true, false) {
		// Opened with check=false: the TTL index is created at the first
		// call, as the clock is read.
		if err := b.ensureTTL(ctx, false); err != nil {
			b.ttlPending.Store(true)
			return err
		}
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errServerClock):
		return fmt.Errorf("%w: %v", inbox.ErrNotSupported, err)
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return fmt.Errorf("%w: reading the server's clock: %v", inbox.ErrStoreUnavailable, err)
}

// fault is the error of a call to the driver that failed: the end of the
// call's context as it is (the layer tells a canceled caller from a
// deadline), every other fault inbox.ErrStoreUnavailable. The driver's
// error is kept as text only, so no driver type (mongo.ErrNoDocuments
// included) leaks through the contract.
func fault(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: %v", inbox.ErrStoreUnavailable, err)
}

// bound is, for the calls the layer does not make (New, EnsureIndexes, the
// check at Open), what the layer does for its own: it fails fast on a closed
// store or a done context and bounds the call by Options.Timeout. Callers
// defer cancel.
func (b *backend) bound(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if b.closed.Load() {
		return nil, nil, fmt.Errorf("mongo store: %w", inbox.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("mongo store: %w", err)
	}
	if b.opts.Timeout < 0 {
		ctx, cancel := context.WithCancel(ctx)
		return ctx, cancel, nil
	}
	ctx, cancel := context.WithTimeout(ctx, b.opts.Timeout)
	return ctx, cancel, nil
}

// fail is fault for the calls the layer does not make: a canceled context
// stays context.Canceled; a timeout and every server or network fault wrap
// inbox.ErrStoreUnavailable.
func (b *backend) fail(ctx context.Context, what string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		if errors.Is(ctxErr, context.Canceled) {
			return fmt.Errorf("mongo store: %s: %w", what, ctxErr)
		}
		return fmt.Errorf("mongo store: %s: %w: no answer in time: %w", what, inbox.ErrStoreUnavailable, ctxErr)
	}
	return fmt.Errorf("mongo store: %s: %w: %v", what, inbox.ErrStoreUnavailable, err)
}

// deadline is now+d on the millisecond grid of BSON dates.
func deadline(now time.Time, d time.Duration) time.Time {
	return now.Add(d).Truncate(time.Millisecond)
}

// claimRounds bounds how often TryBegin and MarkProcessed retry when the
// record changes between their steps.
const claimRounds = 4

func lte(t time.Time) bson.D { return bson.D{{Key: "$lte", Value: t}} }
func gt(t time.Time) bson.D  { return bson.D{{Key: "$gt", Value: t}} }

// Apply implements [driver.Driver]: the ops one after the other, each its
// own round trips (the layer sends one op per call: see docs/stores.md,
// MongoDB, "Round trips").
func (b *backend) Apply(ctx context.Context, ops []driver.Op, res []inbox.Claim, errs []error) error {
	if err := b.ready(ctx); err != nil {
		return err
	}
	driver.ApplyEach(ctx, b, ops, res, errs)
	return nil
}

// Claim is TryBegin. docs/stores.md (MongoDB, "Claims") describes the algorithm.
func (b *backend) Claim(ctx context.Context, op driver.Op) (inbox.Claim, error) {
	key, id, lease := op.Key, op.LeaseID, op.Lease
	for range claimRounds {
		now := b.clock.now(ctx)
		until := deadline(now, lease)
		acquired := inbox.Claim{Status: inbox.Acquired, LeaseID: id, ExpiresAt: until, Lease: lease}

		// Step 1: take a live record that is free (lease ended or released,
		// no backoff running, neither processed nor dead), or insert a new
		// one. Any other existing record fails the upsert with a duplicate
		// key error on _id.
		var d doc
		err := b.coll.FindOneAndUpdate(ctx,
			bson.D{
				{Key: "_id", Value: key},
				{Key: "processed", Value: false},
				{Key: "dead", Value: false},
				{Key: "leaseUntil", Value: lte(now)},
				{Key: "retryAt", Value: lte(now)},
				{Key: "expiresAt", Value: gt(now)},
			},
			bson.D{
				{Key: "$set", Value: bson.D{
					{Key: "leaseId", Value: id},
					{Key: "leaseUntil", Value: until},
					{Key: "retryAt", Value: noLease},
					{Key: "owner", Value: op.Owner},
					{Key: "lastSeen", Value: now},
					{Key: "expiresAt", Value: until.Add(b.opts.Retention)},
				}},
				{Key: "$inc", Value: bson.D{{Key: "attempts", Value: int64(1)}}},
				// processed: false and dead: false come from the filter's
				// equalities, which an upsert copies into the new document.
				{Key: "$setOnInsert", Value: bson.D{
					{Key: "firstSeen", Value: now},
					{Key: "payloadHash", Value: op.PayloadHash},
					{Key: "reason", Value: ""},
				}},
			},
			options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After),
		).Decode(&d)
		if err == nil {
			acquired.Attempts = int(d.Attempts)
			acquired.PayloadMismatch = d.mismatch(op.PayloadHash)
			if op.PayloadHash != "" && d.PayloadHash == "" {
				// The first hash given for a record seen without one. The
				// condition keeps the first writer's hash if two race.
				if _, err := b.coll.UpdateOne(ctx,
					bson.D{{Key: "_id", Value: key}, {Key: "payloadHash", Value: ""}},
					bson.D{{Key: "$set", Value: bson.D{{Key: "payloadHash", Value: op.PayloadHash}}}},
				); err != nil {
					return inbox.Claim{}, fault(ctx, err)
				}
			}
			return acquired, nil
		}
		if !mongo.IsDuplicateKeyError(err) {
			return inbox.Claim{}, fault(ctx, err)
		}

		// Step 2: the record exists and step 1 could not take it. Read it.
		err = b.coll.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&d)
		if errors.Is(err, mongo.ErrNoDocuments) {
			continue // deleted since (TTL monitor): insert again
		}
		if err != nil {
			return inbox.Claim{}, fault(ctx, err)
		}
		// Judge the record at a time taken after reading it: the holder may
		// have stamped it after this call's first reading of the clock, and a
		// Busy caller must never be told to wait longer than the lease.
		now = b.clock.now(ctx)
		until = deadline(now, lease)
		acquired.ExpiresAt = until
		switch {
		case !d.live(now):
			// Expired by retention but not deleted yet: start a fresh record,
			// unless someone else replaced it first.
			fresh := doc{
				ID: key, LeaseID: id, LeaseUntil: until, RetryAt: noLease, Attempts: 1,
				FirstSeen: now, LastSeen: now, ExpiresAt: until.Add(b.opts.Retention),
				Owner: op.Owner, PayloadHash: op.PayloadHash,
			}
			res, err := b.coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: key}, {Key: "expiresAt", Value: lte(now)}}, fresh)
			if err != nil {
				return inbox.Claim{}, fault(ctx, err)
			}
			if res.MatchedCount == 1 {
				acquired.Attempts = 1
				return acquired, nil
			}
		case d.Processed:
			return inbox.Claim{Status: inbox.Processed, Attempts: int(d.Attempts), PayloadMismatch: d.mismatch(op.PayloadHash)}, nil
		case d.Dead:
			return inbox.Claim{Status: inbox.Dead, Attempts: int(d.Attempts), Reason: d.Reason, PayloadMismatch: d.mismatch(op.PayloadHash)}, nil
		case now.Before(d.LeaseUntil):
			// The layer always gives a lease id: the caller's, or a new one
			// that no record holds.
			if d.LeaseID != id {
				return inbox.Claim{
					Status: inbox.Busy, ExpiresAt: d.LeaseUntil.UTC(), RetryAfter: d.LeaseUntil.Sub(now),
					Attempts: int(d.Attempts), PayloadMismatch: d.mismatch(op.PayloadHash),
				}, nil
			}
			// A retry by the holder: renew the lease from now, without
			// counting an attempt.
			res, err := b.coll.UpdateOne(ctx,
				bson.D{{Key: "_id", Value: key}, {Key: "leaseId", Value: id}, {Key: "processed", Value: false}, {Key: "leaseUntil", Value: gt(now)}},
				bson.D{{Key: "$set", Value: bson.D{
					{Key: "leaseUntil", Value: until},
					{Key: "lastSeen", Value: now},
					{Key: "expiresAt", Value: until.Add(b.opts.Retention)},
				}}},
			)
			if err != nil {
				return inbox.Claim{}, fault(ctx, err)
			}
			if res.MatchedCount == 1 {
				acquired.Attempts = int(d.Attempts)
				acquired.PayloadMismatch = d.mismatch(op.PayloadHash)
				return acquired, nil
			}
		case now.Before(d.RetryAt):
			// A failed attempt's backoff: Busy for every caller, the failed
			// lease's too (its leaseId was cleared).
			return inbox.Claim{
				Status: inbox.Busy, ExpiresAt: d.RetryAt.UTC(), RetryAfter: d.RetryAt.Sub(now), BackingOff: true,
				Attempts: int(d.Attempts), PayloadMismatch: d.mismatch(op.PayloadHash),
			}, nil
		}
		// The record changed between the steps (released, expired, taken,
		// replaced): look again.
	}
	return inbox.Claim{}, fmt.Errorf("%w: the record changed under each of %d attempts to claim it", inbox.ErrStoreUnavailable, claimRounds)
}

// held is the filter of a live, unprocessed record held by leaseID.
func held(key, leaseID string, now time.Time) bson.D {
	return bson.D{
		{Key: "_id", Value: key},
		{Key: "leaseId", Value: leaseID},
		{Key: "processed", Value: false},
		{Key: "expiresAt", Value: gt(now)},
	}
}

func lost(leaseID string) error {
	return fmt.Errorf("%w: the key is not held by lease %q (released, completed, taken over after expiry, or never held)", inbox.ErrLeaseLost, leaseID)
}

// Complete is [inbox.LeaseStore.Complete]. A holder whose lease ran out may still complete
// while nobody else took the key.
func (b *backend) Complete(ctx context.Context, key, leaseID string) error {
	now := b.clock.now(ctx)
	res, err := b.coll.UpdateOne(ctx, held(key, leaseID, now), bson.D{{Key: "$set", Value: bson.D{
		{Key: "processed", Value: true},
		{Key: "leaseUntil", Value: noLease},
		{Key: "lastSeen", Value: now},
		{Key: "expiresAt", Value: deadline(now, b.opts.Retention)},
	}}})
	if err != nil {
		return fault(ctx, err)
	}
	if res.MatchedCount == 1 {
		return nil
	}
	// Not held: succeed only when this lease already completed the key.
	var d doc
	err = b.coll.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&d)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return fmt.Errorf("%w: the key has no record", inbox.ErrLeaseLost)
	case err != nil:
		return fault(ctx, err)
	case d.live(now) && d.Processed && d.LeaseID == leaseID:
		return nil
	}
	return lost(leaseID)
}

// Release is [inbox.LeaseStore.Release].
func (b *backend) Release(ctx context.Context, key, leaseID string) error {
	now := b.clock.now(ctx)
	res, err := b.coll.UpdateOne(ctx, held(key, leaseID, now), bson.D{{Key: "$set", Value: bson.D{
		{Key: "leaseId", Value: ""},
		{Key: "leaseUntil", Value: noLease},
		{Key: "lastSeen", Value: now},
		{Key: "expiresAt", Value: deadline(now, b.opts.Retention)},
	}}})
	if err != nil {
		return fault(ctx, err)
	}
	if res.MatchedCount == 0 {
		return lost(leaseID)
	}
	return nil
}

// Fail is [inbox.LeaseStore.Fail]: it ends the failed attempt of leaseID, recording
// the reason, with the key available again once opts.RetryAfter has passed
// (a backoff), or dead. The record lives for the retention after the
// backoff, or after the Fail for a dead key.
func (b *backend) Fail(ctx context.Context, key, leaseID string, opts inbox.FailOptions) error {
	now := b.clock.now(ctx)
	retryAt := noLease
	expires := deadline(now, b.opts.Retention)
	if !opts.Dead && opts.RetryAfter > 0 {
		// Rounded up to the millisecond: the backoff never ends early.
		retryAt = deadline(now, opts.RetryAfter+time.Millisecond-1)
		expires = retryAt.Add(b.opts.Retention)
	}
	res, err := b.coll.UpdateOne(ctx, held(key, leaseID, now), bson.D{{Key: "$set", Value: bson.D{
		{Key: "leaseId", Value: ""},
		{Key: "leaseUntil", Value: noLease},
		{Key: "dead", Value: opts.Dead},
		{Key: "reason", Value: opts.Reason},
		{Key: "retryAt", Value: retryAt},
		{Key: "lastSeen", Value: now},
		{Key: "expiresAt", Value: expires},
	}}})
	if err != nil {
		return fault(ctx, err)
	}
	if res.MatchedCount == 0 {
		return lost(leaseID)
	}
	return nil
}

// Extend implements [driver.Driver].
func (b *backend) Extend(ctx context.Context, key, leaseID string, lease time.Duration) (time.Time, error) {
	if err := b.ready(ctx); err != nil {
		return time.Time{}, err
	}
	now := b.clock.now(ctx)
	until := deadline(now, lease)
	res, err := b.coll.UpdateOne(ctx, held(key, leaseID, now), bson.D{{Key: "$set", Value: bson.D{
		{Key: "leaseUntil", Value: until}, // lastSeen stays: a heartbeat is no sighting (inbox.Record.LastSeen)
		{Key: "expiresAt", Value: until.Add(b.opts.Retention)},
	}}})
	if err != nil {
		return time.Time{}, fault(ctx, err)
	}
	if res.MatchedCount == 0 {
		return time.Time{}, lost(leaseID)
	}
	return until, nil
}

// Get implements [driver.Driver].
func (b *backend) Get(ctx context.Context, key string) (inbox.Record, error) {
	if err := b.ready(ctx); err != nil {
		return inbox.Record{}, err
	}
	now := b.clock.now(ctx)
	var d doc
	err := b.coll.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return inbox.Record{}, nil
	}
	if err != nil {
		return inbox.Record{}, fault(ctx, err)
	}
	if !d.live(now) {
		return inbox.Record{}, nil
	}
	return d.record(now), nil
}

// Mark is MarkProcessed: it marks key processed whatever lease is held on
// it; the holder's Complete then fails with inbox.ErrLeaseLost.
func (b *backend) Mark(ctx context.Context, key string) error {
	for range claimRounds {
		now := b.clock.now(ctx)
		expires := deadline(now, b.opts.Retention)
		_, err := b.coll.UpdateOne(ctx,
			bson.D{{Key: "_id", Value: key}, {Key: "expiresAt", Value: gt(now)}},
			bson.D{
				{Key: "$set", Value: bson.D{
					{Key: "processed", Value: true},
					{Key: "dead", Value: false},
					{Key: "leaseId", Value: ""},
					{Key: "leaseUntil", Value: noLease},
					{Key: "retryAt", Value: noLease},
					{Key: "lastSeen", Value: now},
					{Key: "expiresAt", Value: expires},
				}},
				{Key: "$setOnInsert", Value: bson.D{
					{Key: "attempts", Value: int64(0)},
					{Key: "firstSeen", Value: now},
					{Key: "owner", Value: ""},
					{Key: "payloadHash", Value: ""},
					{Key: "reason", Value: ""},
				}},
			},
			options.UpdateOne().SetUpsert(true),
		)
		if err == nil {
			return nil
		}
		if !mongo.IsDuplicateKeyError(err) {
			return fault(ctx, err)
		}
		// A record expired by retention but not deleted yet: replace it.
		res, err := b.coll.ReplaceOne(ctx,
			bson.D{{Key: "_id", Value: key}, {Key: "expiresAt", Value: lte(now)}},
			doc{ID: key, LeaseUntil: noLease, RetryAt: noLease, Processed: true, FirstSeen: now, LastSeen: now, ExpiresAt: expires},
		)
		if err != nil {
			return fault(ctx, err)
		}
		if res.MatchedCount == 1 {
			return nil
		}
	}
	return fmt.Errorf("%w: the record changed under each of %d attempts to mark it", inbox.ErrStoreUnavailable, claimRounds)
}

// List implements [driver.Driver]: one find on the _id range of the prefix
// (and after the cursor, the last _id of the previous page), with the
// state and age as conditions, sorted by _id; one document more than the
// limit tells whether a next page exists.
func (b *backend) List(ctx context.Context, opts inbox.ListOptions) (inbox.ListPage, error) {
	if err := b.ready(ctx); err != nil {
		return inbox.ListPage{}, err
	}
	now := b.clock.now(ctx)
	filter := bson.D{{Key: "_id", Value: idRange(opts.Prefix, opts.Cursor)}, {Key: "expiresAt", Value: gt(now)}}
	switch opts.State {
	case inbox.StateProcessed:
		filter = append(filter, bson.E{Key: "processed", Value: true})
	case inbox.StateDead:
		filter = append(filter, bson.E{Key: "processed", Value: false}, bson.E{Key: "dead", Value: true})
	case inbox.StateInProgress:
		filter = append(filter, bson.E{Key: "processed", Value: false}, bson.E{Key: "dead", Value: false}, bson.E{Key: "leaseUntil", Value: gt(now)})
	case inbox.StateAvailable:
		filter = append(filter, bson.E{Key: "processed", Value: false}, bson.E{Key: "dead", Value: false}, bson.E{Key: "leaseUntil", Value: lte(now)})
	}
	if opts.OlderThan > 0 {
		filter = append(filter, bson.E{Key: "lastSeen", Value: lte(now.Add(-opts.OlderThan))})
	}
	cur, err := b.coll.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetLimit(int64(opts.Limit)+1))
	if err != nil {
		return inbox.ListPage{}, fault(ctx, err)
	}
	var docs []doc
	if err := cur.All(ctx, &docs); err != nil {
		return inbox.ListPage{}, fault(ctx, err)
	}
	var p inbox.ListPage
	if len(docs) > opts.Limit {
		docs = docs[:opts.Limit]
		p.Next = docs[len(docs)-1].ID
	}
	p.Items = make([]inbox.ListItem, len(docs))
	for i := range docs {
		p.Items[i] = inbox.ListItem{Key: docs[i].ID, Record: docs[i].record(now)}
	}
	return p, nil
}

// idRange is the condition on _id of a listing: the keys that start with
// prefix, after cursor. It is a range, not a regular expression, since keys
// may hold any character: strings compare byte for byte in MongoDB (without
// a collation) as in Go.
func idRange(prefix, cursor string) bson.D {
	r := bson.D{{Key: "$gte", Value: prefix}}
	if cursor >= prefix && cursor != "" {
		r = bson.D{{Key: "$gt", Value: cursor}}
	}
	if end, ok := driver.PrefixEnd(prefix); ok {
		r = append(r, bson.E{Key: "$lt", Value: end})
	}
	return r
}

// Forget implements [driver.Driver]: the document is deleted.
func (b *backend) Forget(ctx context.Context, key string) error {
	if _, err := b.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: key}}); err != nil {
		return fault(ctx, err)
	}
	return nil
}

// ForceRelease implements [driver.Driver]: a conditional update of a live,
// unprocessed, not dead record whose lease or backoff runs; any other
// record (or none) matches nothing and is left as it is.
func (b *backend) ForceRelease(ctx context.Context, key string) error {
	if err := b.ready(ctx); err != nil {
		return err
	}
	now := b.clock.now(ctx)
	_, err := b.coll.UpdateOne(ctx,
		bson.D{
			{Key: "_id", Value: key},
			{Key: "processed", Value: false},
			{Key: "dead", Value: false},
			{Key: "expiresAt", Value: gt(now)},
			{Key: "$or", Value: bson.A{
				bson.D{{Key: "leaseUntil", Value: gt(now)}},
				bson.D{{Key: "retryAt", Value: gt(now)}},
			}},
		},
		bson.D{{Key: "$set", Value: bson.D{
			{Key: "leaseId", Value: ""},
			{Key: "leaseUntil", Value: noLease},
			{Key: "retryAt", Value: noLease},
			{Key: "lastSeen", Value: now},
			{Key: "expiresAt", Value: deadline(now, b.opts.Retention)},
		}}},
	)
	if err != nil {
		return fault(ctx, err)
	}
	return nil
}
