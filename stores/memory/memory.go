// Package memory is an in-process [inbox.LeaseStore]: for tests, for a single
// consumer process, and as the default that needs no server. Create one with
// [New], or by URL with [github.com/watermill-inbox/inbox/stores] (each Open
// returns a new, empty store):
//
//	memory://?retention=168h&lease=30s&max_entries=1000000
//
// The records live in the process and are lost when it exits: two processes,
// or a restarted one, do not share them. Use a server-backed store for that.
//
// One mutex guards the store, so every operation is atomic. Expiry is
// logical: every call compares deadlines on the process's monotonic clock, so
// a processed key stays processed for exactly its retention however late its
// record is swept (expired records are swept as later writes go by). A record
// whose lease is in flight is kept for the lease plus the retention. Reported
// times are the wall clock at [New] plus the monotonic time since, so a step
// of the system clock does not move them.
//
// The store keeps at most [Options.MaxEntries] records. When a new key
// arrives at the bound, the store walks its records from the least recently
// written, dropping expired ones and evicting those without a live lease
// until there is room. Evicting a processed key shortens its dedup window;
// [Stats].Evicted counts evictions, so that can be alerted on. When every
// record holds a live lease, TryBegin and MarkProcessed fail with
// [inbox.ErrStoreUnavailable]: the middleware nacks, and the broker
// redelivers later.
package memory

import (
	"container/list"
	"context"
	"fmt"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
)

// Scheme is the URL scheme this package registers with
// [github.com/watermill-inbox/inbox/stores].
const Scheme = "memory"

// DefaultMaxEntries is the bound on records when Options.MaxEntries is zero.
const DefaultMaxEntries = 1_000_000

// Options configure a [Store]. The zero value is usable: every field has a
// default.
type Options struct {
	// Retention is how long a processed key stays processed. Optional;
	// default inbox.DefaultRetention (7 days).
	Retention time.Duration

	// Lease is the lease granted when TryBegin asks for none. Optional;
	// default inbox.DefaultLease (30 s).
	Lease time.Duration

	// MaxEntries bounds the records kept. Optional; default
	// DefaultMaxEntries. Negative means no bound.
	MaxEntries int
}

func (o *Options) setDefaults() {
	if o.Retention == 0 {
		o.Retention = inbox.DefaultRetention
	}
	if o.Lease == 0 {
		o.Lease = inbox.DefaultLease
	}
	if o.MaxEntries == 0 {
		o.MaxEntries = DefaultMaxEntries
	}
}

// Validate reports whether o is usable after defaults.
func (o Options) Validate() error {
	if o.Retention < 0 {
		return fmt.Errorf("%w: memory store: Retention %s is negative", inbox.ErrInvalidArgument, o.Retention)
	}
	if o.Lease < 0 {
		return fmt.Errorf("%w: memory store: Lease %s is negative", inbox.ErrInvalidLease, o.Lease)
	}
	return nil
}

// Stats are counters of a [Store].
type Stats struct {
	// Entries is the number of records held, expired ones not yet swept
	// included.
	Entries int
	// Evicted counts records removed before their expiry to stay within
	// MaxEntries.
	Evicted uint64
}

// record is what the store knows of one key. Its deadlines are time.Now
// readings plus durations: they compare on the monotonic clock.
type record struct {
	key        string
	elem       *list.Element // the record's place in Store.order
	processed  bool
	leaseID    string        // the current or last lease; after Complete the completing one; "" after Release or MarkProcessed
	lease      time.Duration // length of the current lease, reused when its holder retries TryBegin
	leaseUntil time.Time     // zero when released or processed
	expiresAt  time.Time     // the record is gone from this time on
	attempts   int
	owner      string
	payload    string // first payload hash seen
	firstSeen  time.Time
	lastSeen   time.Time
}

func (r *record) state(now time.Time) inbox.State {
	switch {
	case r.processed:
		return inbox.StateProcessed
	case !r.leaseUntil.IsZero() && now.Before(r.leaseUntil):
		return inbox.StateInProgress
	default:
		return inbox.StateAvailable
	}
}

func (r *record) expired(now time.Time) bool { return !now.Before(r.expiresAt) }

// Store is the in-memory [inbox.LeaseStore]. It is safe for concurrent use.
type Store struct {
	opts      Options
	epoch     time.Time // time.Now at New, monotonic reading included
	epochWall time.Time // epoch without its monotonic reading

	mu      sync.Mutex
	recs    map[string]*record
	order   *list.List // of *record, least recently written at the front
	evicted uint64
	closed  bool
}

var _ inbox.LeaseStore = (*Store)(nil)

// New returns an empty store.
func New(opts Options) (*Store, error) {
	opts.setDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	epoch := time.Now()
	return &Store{
		opts: opts, epoch: epoch, epochWall: epoch.Round(0),
		recs: make(map[string]*record), order: list.New(),
	}, nil
}

// Close makes every later call fail with [inbox.ErrClosed] and drops the
// records.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed, s.recs = true, nil // every call checks closed first
	s.order.Init()
	return nil
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Entries: len(s.recs), Evicted: s.evicted}
}

// wall returns t as the store reports times: the wall clock at New plus the
// monotonic time from New to t.
func (s *Store) wall(t time.Time) time.Time { return s.epochWall.Add(t.Sub(s.epoch)) }

// lock validates key, then errs (the caller's other validations), then ctx;
// it locks the store and returns the current time and key's live record (nil
// when absent or expired). On success the caller must unlock.
func (s *Store) lock(ctx context.Context, key string, errs ...error) (time.Time, *record, error) {
	if err := inbox.ValidateKey(key); err != nil {
		return time.Time{}, nil, err
	}
	for _, err := range errs {
		if err != nil {
			return time.Time{}, nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return time.Time{}, nil, fmt.Errorf("memory store: %w", err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return time.Time{}, nil, fmt.Errorf("memory store: %w", inbox.ErrClosed)
	}
	now := time.Now()
	r := s.recs[key]
	if r != nil && r.expired(now) {
		s.remove(r)
		r = nil
	}
	return now, r, nil
}

// insert adds a record for key, first seen at now. The caller touches it.
func (s *Store) insert(key string, now time.Time) (*record, error) {
	if err := s.makeRoom(now); err != nil {
		return nil, err
	}
	r := &record{key: key, firstSeen: s.wall(now)}
	r.elem = s.order.PushBack(r)
	s.recs[key] = r
	return r, nil
}

func (s *Store) remove(r *record) {
	s.order.Remove(r.elem)
	delete(s.recs, r.key)
}

// touch records a write to r at now: it moves r to the back of the list and
// sweeps a few expired records from the front.
func (s *Store) touch(r *record, now time.Time) {
	r.lastSeen = s.wall(now)
	s.order.MoveToBack(r.elem)
	for n := 0; n < 4; n++ {
		front := s.order.Front().Value.(*record)
		if front == r || !front.expired(now) {
			break
		}
		s.remove(front)
	}
}

// makeRoom makes room for one more record within MaxEntries: walking from
// the least recently written record, it drops expired records and evicts
// those without a live lease.
func (s *Store) makeRoom(now time.Time) error {
	limit := s.opts.MaxEntries
	full := func() bool { return limit >= 0 && len(s.recs) >= limit }
	for e := s.order.Front(); e != nil && full(); {
		r, next := e.Value.(*record), e.Next()
		if r.expired(now) {
			s.remove(r)
		} else if r.state(now) != inbox.StateInProgress {
			s.remove(r)
			s.evicted++
		}
		e = next
	}
	if full() {
		return fmt.Errorf("%w: memory store full: all %d records hold a live lease (Options.MaxEntries)", inbox.ErrStoreUnavailable, len(s.recs))
	}
	return nil
}

// setLease starts a lease on r; the record is kept for the retention after it.
func (s *Store) setLease(r *record, now time.Time, lease time.Duration) {
	r.lease = lease
	r.leaseUntil = now.Add(lease)
	r.expiresAt = r.leaseUntil.Add(s.opts.Retention)
}

// endLease clears r's lease; the record is kept for the retention from now.
func (s *Store) endLease(r *record, now time.Time) {
	r.leaseUntil = time.Time{}
	r.expiresAt = now.Add(s.opts.Retention)
}

// TryBegin implements [inbox.LeaseStore].
func (s *Store) TryBegin(ctx context.Context, key string, opts inbox.BeginOptions) (inbox.Claim, error) {
	now, r, err := s.lock(ctx, key, opts.Validate())
	if err != nil {
		return inbox.Claim{}, err
	}
	defer s.mu.Unlock()
	if r == nil {
		if r, err = s.insert(key, now); err != nil {
			return inbox.Claim{}, err
		}
	}
	mismatch := opts.PayloadHash != "" && r.payload != "" && opts.PayloadHash != r.payload
	switch r.state(now) {
	case inbox.StateProcessed:
		return inbox.Claim{Status: inbox.Processed, PayloadMismatch: mismatch}, nil
	case inbox.StateInProgress:
		if opts.LeaseID == "" || opts.LeaseID != r.leaseID {
			return inbox.Claim{Status: inbox.Busy, ExpiresAt: s.wall(r.leaseUntil), RetryAfter: r.leaseUntil.Sub(now), PayloadMismatch: mismatch}, nil
		}
		// A retry by the holder: renew from now, so that the caller's own
		// reckoning of the deadline (from its retry) holds.
		s.setLease(r, now, r.lease)
	default:
		lease := opts.Lease
		if lease == 0 {
			lease = s.opts.Lease
		}
		r.leaseID = opts.LeaseID
		if r.leaseID == "" {
			r.leaseID = inbox.NewLeaseID()
		}
		s.setLease(r, now, lease)
		r.attempts++
		r.owner = opts.Owner
		if r.payload == "" {
			r.payload = opts.PayloadHash
		}
	}
	s.touch(r, now)
	return inbox.Claim{Status: inbox.Acquired, LeaseID: r.leaseID, ExpiresAt: s.wall(r.leaseUntil), Lease: r.lease, PayloadMismatch: mismatch}, nil
}

// holding validates key, leaseID and check (as lock does), then runs f on
// key's record under the lock if leaseID holds it (its lease live, or expired
// and not taken over); else it fails with ErrLeaseLost.
func (s *Store) holding(ctx context.Context, key, leaseID string, check error, f func(now time.Time, r *record) error) error {
	now, r, err := s.lock(ctx, key, inbox.ValidateLeaseID(leaseID), check)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	switch {
	case r == nil:
		return fmt.Errorf("%w: key %q has no record", inbox.ErrLeaseLost, key)
	case r.leaseID != leaseID:
		return fmt.Errorf("%w: key %q is not held by lease %q", inbox.ErrLeaseLost, key, leaseID)
	}
	return f(now, r)
}

// Complete implements [inbox.LeaseStore].
func (s *Store) Complete(ctx context.Context, key, leaseID string) error {
	return s.holding(ctx, key, leaseID, nil, func(now time.Time, r *record) error {
		if !r.processed { // else repeated by the completing lease
			r.processed = true
			s.endLease(r, now)
			s.touch(r, now)
		}
		return nil
	})
}

// Release implements [inbox.LeaseStore].
func (s *Store) Release(ctx context.Context, key, leaseID string) error {
	return s.holding(ctx, key, leaseID, nil, func(now time.Time, r *record) error {
		if r.processed {
			return fmt.Errorf("%w: key %q is already processed", inbox.ErrLeaseLost, key)
		}
		r.leaseID = ""
		s.endLease(r, now)
		s.touch(r, now)
		return nil
	})
}

// Extend implements [inbox.LeaseStore].
func (s *Store) Extend(ctx context.Context, key, leaseID string, lease time.Duration) (time.Time, error) {
	var until time.Time
	err := s.holding(ctx, key, leaseID, inbox.ValidateLease(lease), func(now time.Time, r *record) error {
		if r.processed {
			return fmt.Errorf("%w: key %q is already processed", inbox.ErrLeaseLost, key)
		}
		s.setLease(r, now, lease)
		s.touch(r, now)
		until = s.wall(r.leaseUntil)
		return nil
	})
	return until, err
}

// Get implements [inbox.LeaseStore].
func (s *Store) Get(ctx context.Context, key string) (inbox.Record, error) {
	now, r, err := s.lock(ctx, key)
	if err != nil {
		return inbox.Record{}, err
	}
	defer s.mu.Unlock()
	if r == nil {
		return inbox.Record{}, nil
	}
	rec := inbox.Record{
		State:       r.state(now),
		Attempts:    r.attempts,
		FirstSeen:   r.firstSeen,
		LastSeen:    r.lastSeen,
		Owner:       r.owner,
		PayloadHash: r.payload,
	}
	if rec.State == inbox.StateInProgress {
		rec.LeaseUntil = s.wall(r.leaseUntil)
	}
	return rec, nil
}

// IsProcessed implements [inbox.Store].
func (s *Store) IsProcessed(ctx context.Context, key string) (bool, error) {
	_, r, err := s.lock(ctx, key)
	if err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	return r != nil && r.processed, nil
}

// MarkProcessed implements [inbox.Store]. It marks key processed whatever
// lease is held on it; the holder's Complete then fails with ErrLeaseLost.
func (s *Store) MarkProcessed(ctx context.Context, key string) error {
	now, r, err := s.lock(ctx, key)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if r == nil {
		if r, err = s.insert(key, now); err != nil {
			return err
		}
	}
	r.processed = true
	r.leaseID = ""
	s.endLease(r, now)
	s.touch(r, now)
	return nil
}

func init() {
	stores.Register(Scheme, stores.OpenerFunc(openURL))
}

func openURL(_ context.Context, u *url.URL, p stores.Params) (stores.Store, error) {
	if u.Host != "" || (u.Path != "" && u.Path != "/") || u.Opaque != "" {
		return nil, fmt.Errorf("%w: memory:// takes no host or path, got %q", stores.ErrInvalidURL, stores.Redact(u))
	}
	q := u.Query()
	opts := Options{Retention: p.Retention, Lease: p.Lease}
	if v, ok, err := stores.PopString(q, "max_entries"); err != nil {
		return nil, err
	} else if ok {
		n, err := strconv.Atoi(v)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%w: parameter max_entries=%q is not a non-zero integer", stores.ErrInvalidURL, v)
		}
		opts.MaxEntries = n
	}
	if err := stores.RejectUnknown(Scheme, q, "max_entries"); err != nil {
		return nil, err
	}
	return New(opts)
}
