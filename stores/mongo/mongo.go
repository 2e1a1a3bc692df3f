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
type Store struct {
	opts   Options
	client *mongo.Client
	coll   *mongo.Collection
	clock  *serverClock
	owned  bool // Close disconnects the client (opened from a URL)
	closed atomic.Bool
}

var _ inbox.LeaseStore = (*Store)(nil)

// New returns a store over client, which the caller keeps owning: Close does
// not disconnect it. New reads the server's clock (see the package
// documentation), so the server must answer within Options.Timeout: that
// checks the client connects and authenticates, not that the user may use
// the database. It creates no index (see [Store.EnsureIndexes]). The
// client's logger is the caller's to configure (options.Client().
// SetLoggerOptions); stores opened by URL route theirs to Options.Logger.
func New(ctx context.Context, client *mongo.Client, opts Options) (*Store, error) {
	s, err := newStore(client, opts)
	if err != nil {
		return nil, err
	}
	_, cancel, err := s.call(ctx) // reads the server's clock: the store has none yet
	if err != nil {
		return nil, err
	}
	cancel()
	s.logClock()
	return s, nil
}

// logClock logs the clock estimate at debug level.
func (s *Store) logClock() {
	bound, offset := s.clock.errorBound()
	s.opts.Logger.Debug("mongo store: server clock read", watermill.LogFields{
		"database": s.opts.Database, "collection": s.opts.Collection,
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
	return &Store{
		opts:   opts,
		client: client,
		coll:   client.Database(opts.Database).Collection(opts.Collection),
		clock:  &serverClock{db: client.Database("admin"), local: opts.LocalClock},
	}, nil
}

// Close makes every later call fail with inbox.ErrClosed. A store opened from
// a URL disconnects its client; a store built by [New] leaves the caller's
// client connected.
func (s *Store) Close() error {
	if s.closed.Swap(true) || !s.owned {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	defer cancel()
	if err := s.client.Disconnect(ctx); err != nil {
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
	Attempts    int64     `bson:"attempts"`
	FirstSeen   time.Time `bson:"firstSeen"`
	LastSeen    time.Time `bson:"lastSeen"`
	ExpiresAt   time.Time `bson:"expiresAt"`
	Owner       string    `bson:"owner"`
	PayloadHash string    `bson:"payloadHash"`
}

// noLease is the leaseUntil of a record without a lease (released,
// processed): the epoch, so "leaseUntil <= now" matches it.
var noLease = time.Unix(0, 0).UTC()

func (d *doc) live(now time.Time) bool { return now.Before(d.ExpiresAt) }

func (d *doc) state(now time.Time) inbox.State {
	switch {
	case d.Processed:
		return inbox.StateProcessed
	case now.Before(d.LeaseUntil):
		return inbox.StateInProgress
	default:
		return inbox.StateAvailable
	}
}

func (d *doc) mismatch(hash string) bool {
	return hash != "" && d.PayloadHash != "" && d.PayloadHash != hash
}

// call fails fast on a closed store or a done context and bounds the call by
// Options.Timeout. A store that has not read the server's clock yet (opened
// with check=false) reads it first, within that bound. Callers defer
// cancel.
func (s *Store) call(ctx context.Context) (context.Context, context.CancelFunc, error) {
	ctx, cancel, err := s.bound(ctx)
	if err != nil {
		return nil, nil, err
	}
	if !s.clock.synced.Load() {
		if err := s.clock.sync(ctx, clockSamples); err != nil {
			defer cancel()
			if errors.Is(err, errServerClock) {
				return nil, nil, fmt.Errorf("%w: mongo store: %v", inbox.ErrNotSupported, err)
			}
			return nil, nil, s.fail(ctx, "reading the server's clock", err)
		}
	}
	return ctx, cancel, nil
}

// bound is call without the clock.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if s.closed.Load() {
		return nil, nil, fmt.Errorf("mongo store: %w", inbox.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("mongo store: %w", err)
	}
	if s.opts.Timeout < 0 {
		ctx, cancel := context.WithCancel(ctx)
		return ctx, cancel, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	return ctx, cancel, nil
}

// fail maps a driver error to the store's errors: a canceled context stays
// context.Canceled; a timeout and every server or network fault wrap
// inbox.ErrStoreUnavailable. The driver's error is kept as text only, so no
// driver type (mongo.ErrNoDocuments included) leaks through the contract.
func (s *Store) fail(ctx context.Context, what string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		if errors.Is(ctxErr, context.Canceled) {
			return fmt.Errorf("mongo store: %s: %w", what, ctxErr)
		}
		return fmt.Errorf("mongo store: %s: %w: no answer in time: %w", what, inbox.ErrStoreUnavailable, ctxErr)
	}
	return fmt.Errorf("mongo store: %s: %w: %v", what, inbox.ErrStoreUnavailable, err)
}

func (s *Store) leaseFor(d time.Duration) time.Duration {
	if d == 0 {
		return s.opts.Lease
	}
	return d
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

// TryBegin implements [inbox.LeaseStore]. See the package documentation for
// the claim algorithm.
func (s *Store) TryBegin(ctx context.Context, key string, opts inbox.BeginOptions) (inbox.Claim, error) {
	if err := inbox.ValidateKey(key); err != nil {
		return inbox.Claim{}, err
	}
	if err := opts.Validate(); err != nil {
		return inbox.Claim{}, err
	}
	ctx, cancel, err := s.call(ctx)
	if err != nil {
		return inbox.Claim{}, err
	}
	defer cancel()
	lease := s.leaseFor(opts.Lease)
	id := opts.LeaseID
	if id == "" {
		id = inbox.NewLeaseID()
	}
	what := fmt.Sprintf("TryBegin %q", key)

	for range claimRounds {
		now := s.clock.now(ctx)
		until := deadline(now, lease)
		acquired := inbox.Claim{Status: inbox.Acquired, LeaseID: id, ExpiresAt: until, Lease: lease}

		// Step 1: take a live record that is free (lease ended or released),
		// or insert a new one. Any other existing record fails the upsert
		// with a duplicate key error on _id.
		var d doc
		err := s.coll.FindOneAndUpdate(ctx,
			bson.D{
				{Key: "_id", Value: key},
				{Key: "processed", Value: false},
				{Key: "leaseUntil", Value: lte(now)},
				{Key: "expiresAt", Value: gt(now)},
			},
			bson.D{
				{Key: "$set", Value: bson.D{
					{Key: "leaseId", Value: id},
					{Key: "leaseUntil", Value: until},
					{Key: "owner", Value: opts.Owner},
					{Key: "lastSeen", Value: now},
					{Key: "expiresAt", Value: until.Add(s.opts.Retention)},
				}},
				{Key: "$inc", Value: bson.D{{Key: "attempts", Value: int64(1)}}},
				// processed: false comes from the filter's equality, which
				// an upsert copies into the new document.
				{Key: "$setOnInsert", Value: bson.D{
					{Key: "firstSeen", Value: now},
					{Key: "payloadHash", Value: opts.PayloadHash},
				}},
			},
			options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After),
		).Decode(&d)
		if err == nil {
			acquired.PayloadMismatch = d.mismatch(opts.PayloadHash)
			if opts.PayloadHash != "" && d.PayloadHash == "" {
				// The first hash given for a record seen without one. The
				// condition keeps the first writer's hash if two race.
				if _, err := s.coll.UpdateOne(ctx,
					bson.D{{Key: "_id", Value: key}, {Key: "payloadHash", Value: ""}},
					bson.D{{Key: "$set", Value: bson.D{{Key: "payloadHash", Value: opts.PayloadHash}}}},
				); err != nil {
					return inbox.Claim{}, s.fail(ctx, what, err)
				}
			}
			return acquired, nil
		}
		if !mongo.IsDuplicateKeyError(err) {
			return inbox.Claim{}, s.fail(ctx, what, err)
		}

		// Step 2: the record exists and step 1 could not take it. Read it.
		err = s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&d)
		if errors.Is(err, mongo.ErrNoDocuments) {
			continue // deleted since (TTL monitor): insert again
		}
		if err != nil {
			return inbox.Claim{}, s.fail(ctx, what, err)
		}
		// Judge the record at a time taken after reading it: the holder may
		// have stamped it after this call's first reading of the clock, and a
		// Busy caller must never be told to wait longer than the lease.
		now = s.clock.now(ctx)
		until = deadline(now, lease)
		acquired.ExpiresAt = until
		switch {
		case !d.live(now):
			// Expired by retention but not deleted yet: start a fresh record,
			// unless someone else replaced it first.
			fresh := doc{
				ID: key, LeaseID: id, LeaseUntil: until, Attempts: 1,
				FirstSeen: now, LastSeen: now, ExpiresAt: until.Add(s.opts.Retention),
				Owner: opts.Owner, PayloadHash: opts.PayloadHash,
			}
			res, err := s.coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: key}, {Key: "expiresAt", Value: lte(now)}}, fresh)
			if err != nil {
				return inbox.Claim{}, s.fail(ctx, what, err)
			}
			if res.MatchedCount == 1 {
				return acquired, nil
			}
		case d.Processed:
			return inbox.Claim{Status: inbox.Processed, PayloadMismatch: d.mismatch(opts.PayloadHash)}, nil
		case now.Before(d.LeaseUntil):
			if opts.LeaseID == "" || d.LeaseID != opts.LeaseID {
				return inbox.Claim{
					Status: inbox.Busy, ExpiresAt: d.LeaseUntil.UTC(), RetryAfter: d.LeaseUntil.Sub(now),
					PayloadMismatch: d.mismatch(opts.PayloadHash),
				}, nil
			}
			// A retry by the holder: renew the lease from now, without
			// counting an attempt.
			res, err := s.coll.UpdateOne(ctx,
				bson.D{{Key: "_id", Value: key}, {Key: "leaseId", Value: id}, {Key: "processed", Value: false}, {Key: "leaseUntil", Value: gt(now)}},
				bson.D{{Key: "$set", Value: bson.D{
					{Key: "leaseUntil", Value: until},
					{Key: "lastSeen", Value: now},
					{Key: "expiresAt", Value: until.Add(s.opts.Retention)},
				}}},
			)
			if err != nil {
				return inbox.Claim{}, s.fail(ctx, what, err)
			}
			if res.MatchedCount == 1 {
				acquired.PayloadMismatch = d.mismatch(opts.PayloadHash)
				return acquired, nil
			}
		}
		// The record changed between the steps (released, expired, taken,
		// replaced): look again.
	}
	return inbox.Claim{}, fmt.Errorf("mongo store: %s: %w: the record changed under each of %d attempts to claim it", what, inbox.ErrStoreUnavailable, claimRounds)
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

func lost(key, leaseID string) error {
	return fmt.Errorf("%w: key %q is not held by lease %q (released, completed, taken over after expiry, or never held)", inbox.ErrLeaseLost, key, leaseID)
}

// Complete implements [inbox.LeaseStore]. A holder whose lease ran out may
// still complete while nobody else took the key.
func (s *Store) Complete(ctx context.Context, key, leaseID string) error {
	if err := inbox.ValidateHolder(key, leaseID); err != nil {
		return err
	}
	ctx, cancel, err := s.call(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	what := fmt.Sprintf("Complete %q", key)
	now := s.clock.now(ctx)
	res, err := s.coll.UpdateOne(ctx, held(key, leaseID, now), bson.D{{Key: "$set", Value: bson.D{
		{Key: "processed", Value: true},
		{Key: "leaseUntil", Value: noLease},
		{Key: "lastSeen", Value: now},
		{Key: "expiresAt", Value: deadline(now, s.opts.Retention)},
	}}})
	if err != nil {
		return s.fail(ctx, what, err)
	}
	if res.MatchedCount == 1 {
		return nil
	}
	// Not held: succeed only when this lease already completed the key.
	var d doc
	err = s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&d)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return fmt.Errorf("%w: key %q has no record", inbox.ErrLeaseLost, key)
	case err != nil:
		return s.fail(ctx, what, err)
	case d.live(now) && d.Processed && d.LeaseID == leaseID:
		return nil
	}
	return lost(key, leaseID)
}

// Release implements [inbox.LeaseStore].
func (s *Store) Release(ctx context.Context, key, leaseID string) error {
	if err := inbox.ValidateHolder(key, leaseID); err != nil {
		return err
	}
	ctx, cancel, err := s.call(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	now := s.clock.now(ctx)
	res, err := s.coll.UpdateOne(ctx, held(key, leaseID, now), bson.D{{Key: "$set", Value: bson.D{
		{Key: "leaseId", Value: ""},
		{Key: "leaseUntil", Value: noLease},
		{Key: "lastSeen", Value: now},
		{Key: "expiresAt", Value: deadline(now, s.opts.Retention)},
	}}})
	if err != nil {
		return s.fail(ctx, fmt.Sprintf("Release %q", key), err)
	}
	if res.MatchedCount == 0 {
		return lost(key, leaseID)
	}
	return nil
}

// Extend implements [inbox.LeaseStore].
func (s *Store) Extend(ctx context.Context, key, leaseID string, lease time.Duration) (time.Time, error) {
	if err := inbox.ValidateHolder(key, leaseID); err != nil {
		return time.Time{}, err
	}
	if err := inbox.ValidateLease(lease); err != nil {
		return time.Time{}, err
	}
	ctx, cancel, err := s.call(ctx)
	if err != nil {
		return time.Time{}, err
	}
	defer cancel()
	now := s.clock.now(ctx)
	until := deadline(now, lease)
	res, err := s.coll.UpdateOne(ctx, held(key, leaseID, now), bson.D{{Key: "$set", Value: bson.D{
		{Key: "leaseUntil", Value: until},
		{Key: "lastSeen", Value: now},
		{Key: "expiresAt", Value: until.Add(s.opts.Retention)},
	}}})
	if err != nil {
		return time.Time{}, s.fail(ctx, fmt.Sprintf("Extend %q", key), err)
	}
	if res.MatchedCount == 0 {
		return time.Time{}, lost(key, leaseID)
	}
	return until, nil
}

// Get implements [inbox.LeaseStore].
func (s *Store) Get(ctx context.Context, key string) (inbox.Record, error) {
	if err := inbox.ValidateKey(key); err != nil {
		return inbox.Record{}, err
	}
	ctx, cancel, err := s.call(ctx)
	if err != nil {
		return inbox.Record{}, err
	}
	defer cancel()
	now := s.clock.now(ctx)
	var d doc
	err = s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return inbox.Record{}, nil
	}
	if err != nil {
		return inbox.Record{}, s.fail(ctx, fmt.Sprintf("Get %q", key), err)
	}
	if !d.live(now) {
		return inbox.Record{}, nil
	}
	r := inbox.Record{
		State:       d.state(now),
		Attempts:    int(d.Attempts),
		FirstSeen:   d.FirstSeen.UTC(),
		LastSeen:    d.LastSeen.UTC(),
		Owner:       d.Owner,
		PayloadHash: d.PayloadHash,
	}
	if r.State == inbox.StateInProgress {
		r.LeaseUntil = d.LeaseUntil.UTC()
	}
	return r, nil
}

// IsProcessed implements [inbox.Store].
func (s *Store) IsProcessed(ctx context.Context, key string) (bool, error) {
	if err := inbox.ValidateKey(key); err != nil {
		return false, err
	}
	ctx, cancel, err := s.call(ctx)
	if err != nil {
		return false, err
	}
	defer cancel()
	now := s.clock.now(ctx)
	err = s.coll.FindOne(ctx,
		bson.D{{Key: "_id", Value: key}, {Key: "processed", Value: true}, {Key: "expiresAt", Value: gt(now)}},
		options.FindOne().SetProjection(bson.D{{Key: "_id", Value: 1}}),
	).Err()
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return false, nil
	case err != nil:
		return false, s.fail(ctx, fmt.Sprintf("IsProcessed %q", key), err)
	}
	return true, nil
}

// MarkProcessed implements [inbox.Store]. It marks key processed whatever
// lease is held on it; the holder's Complete then fails with
// inbox.ErrLeaseLost.
func (s *Store) MarkProcessed(ctx context.Context, key string) error {
	if err := inbox.ValidateKey(key); err != nil {
		return err
	}
	ctx, cancel, err := s.call(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	what := fmt.Sprintf("MarkProcessed %q", key)
	for range claimRounds {
		now := s.clock.now(ctx)
		expires := deadline(now, s.opts.Retention)
		_, err := s.coll.UpdateOne(ctx,
			bson.D{{Key: "_id", Value: key}, {Key: "expiresAt", Value: gt(now)}},
			bson.D{
				{Key: "$set", Value: bson.D{
					{Key: "processed", Value: true},
					{Key: "leaseId", Value: ""},
					{Key: "leaseUntil", Value: noLease},
					{Key: "lastSeen", Value: now},
					{Key: "expiresAt", Value: expires},
				}},
				{Key: "$setOnInsert", Value: bson.D{
					{Key: "attempts", Value: int64(0)},
					{Key: "firstSeen", Value: now},
					{Key: "owner", Value: ""},
					{Key: "payloadHash", Value: ""},
				}},
			},
			options.UpdateOne().SetUpsert(true),
		)
		if err == nil {
			return nil
		}
		if !mongo.IsDuplicateKeyError(err) {
			return s.fail(ctx, what, err)
		}
		// A record expired by retention but not deleted yet: replace it.
		res, err := s.coll.ReplaceOne(ctx,
			bson.D{{Key: "_id", Value: key}, {Key: "expiresAt", Value: lte(now)}},
			doc{ID: key, LeaseUntil: noLease, Processed: true, FirstSeen: now, LastSeen: now, ExpiresAt: expires},
		)
		if err != nil {
			return s.fail(ctx, what, err)
		}
		if res.MatchedCount == 1 {
			return nil
		}
	}
	return fmt.Errorf("mongo store: %s: %w: the record changed under each of %d attempts to mark it", what, inbox.ErrStoreUnavailable, claimRounds)
}
