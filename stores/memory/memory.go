// Package memory is an in-process [inbox.LeaseStore]: for tests, for a single
// consumer process, and as the default that needs no server.
//
// Records live in a map guarded by one mutex, so every operation is atomic.
// Expiry is logical: every call compares deadlines on the process's monotonic
// clock, so a processed key is processed for exactly its retention. Expired
// records are swept as writes go by, oldest first.
//
// The store keeps at most [Options.MaxEntries] records. When a new key arrives
// at the bound, expired records go first; then the least recently written
// records that hold no live lease are evicted, which shortens the dedup window
// for those keys (counted in [Stats].Evicted, so it can be alerted on). When
// every record holds a live lease, TryBegin fails with
// [inbox.ErrStoreUnavailable]: the middleware then nacks and the broker
// redelivers later.
//
// The state is lost when the process exits: two processes, or a restarted one,
// do not share it. Use a server-backed store for that.
//
// URL form, with [github.com/watermill-inbox/inbox/stores]:
//
//	memory://?retention=168h&lease=30s&max_entries=1000000
//
// Each Open returns a new, empty store.
package memory

import (
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

// entry is one key's record. Entries form a list ordered by last write, the
// oldest at the front, so sweeping and eviction start there.
type entry struct {
	key         string
	leaseID     string    // live or expired lease; after Complete, the completing lease; "" after Release
	leaseUntil  time.Time // zero when released or processed
	expiresAt   time.Time // the record is gone at this time
	firstSeen   time.Time
	lastSeen    time.Time
	lease       time.Duration // length of the current lease
	attempts    int
	processed   bool
	owner       string
	payloadHash string
	prev, next  *entry
}

func (e *entry) state(now time.Time) inbox.State {
	switch {
	case e.processed:
		return inbox.StateProcessed
	case !e.leaseUntil.IsZero() && now.Before(e.leaseUntil):
		return inbox.StateInProgress
	default:
		return inbox.StateAvailable
	}
}

// Store is the in-memory [inbox.LeaseStore]. It is safe for concurrent use.
type Store struct {
	opts Options

	mu         sync.Mutex
	m          map[string]*entry
	head, tail *entry // oldest and newest write
	evicted    uint64
	closed     bool
}

var (
	_ inbox.LeaseStore   = (*Store)(nil)
	_ inbox.BoundedCalls = (*Store)(nil)
)

// New returns an empty store.
func New(opts Options) (*Store, error) {
	opts.setDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	return &Store{opts: opts, m: make(map[string]*entry)}, nil
}

// Close makes every later call fail with [inbox.ErrClosed] and drops the
// records.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.m = nil
	s.head, s.tail = nil, nil
	return nil
}

// CallTimeout implements [inbox.BoundedCalls]: calls never block, so callers
// need no timeout around them.
func (s *Store) CallTimeout() time.Duration { return 0 }

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Entries: len(s.m), Evicted: s.evicted}
}

func wall(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.Round(0)
}

// lock checks the context, locks the store and returns the current time and
// the live entry of key (nil when absent or expired). Callers must unlock.
func (s *Store) lock(ctx context.Context, key string) (time.Time, *entry, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, nil, fmt.Errorf("memory store: %w", err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return time.Time{}, nil, fmt.Errorf("memory store: %w", inbox.ErrClosed)
	}
	now := time.Now()
	e := s.m[key]
	if e != nil && !now.Before(e.expiresAt) {
		s.remove(e)
		e = nil
	}
	return now, e, nil
}

// touch records a write to e at now: it moves e to the back of the list and
// sweeps a few expired records from the front.
func (s *Store) touch(e *entry, now time.Time) {
	e.lastSeen = now
	if s.tail != e {
		s.unlink(e)
		s.pushBack(e)
	}
	for i := 0; i < 4 && s.head != nil && s.head != e && !now.Before(s.head.expiresAt); i++ {
		s.remove(s.head)
	}
}

func (s *Store) pushBack(e *entry) {
	e.prev, e.next = s.tail, nil
	if s.tail != nil {
		s.tail.next = e
	} else {
		s.head = e
	}
	s.tail = e
}

func (s *Store) unlink(e *entry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else if s.head == e {
		s.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else if s.tail == e {
		s.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

func (s *Store) remove(e *entry) {
	s.unlink(e)
	delete(s.m, e.key)
}

// makeRoom keeps len(m) < MaxEntries before an insert.
func (s *Store) makeRoom(now time.Time) error {
	if s.opts.MaxEntries < 0 || len(s.m) < s.opts.MaxEntries {
		return nil
	}
	for s.head != nil && !now.Before(s.head.expiresAt) {
		s.remove(s.head)
	}
	for e := s.head; e != nil && len(s.m) >= s.opts.MaxEntries; {
		next := e.next
		if e.state(now) != inbox.StateInProgress {
			s.remove(e)
			s.evicted++
		}
		e = next
	}
	if len(s.m) >= s.opts.MaxEntries {
		return fmt.Errorf("%w: memory store full: all %d records hold a live lease (Options.MaxEntries)", inbox.ErrStoreUnavailable, len(s.m))
	}
	return nil
}

func (s *Store) leaseFor(d time.Duration) time.Duration {
	if d == 0 {
		return s.opts.Lease
	}
	return d
}

// acquire gives e a new lease.
func (s *Store) acquire(e *entry, now time.Time, opts inbox.BeginOptions) inbox.Claim {
	lease := s.leaseFor(opts.Lease)
	e.leaseID = opts.LeaseID
	if e.leaseID == "" {
		e.leaseID = inbox.NewLeaseID()
	}
	e.lease = lease
	e.leaseUntil = now.Add(lease)
	e.expiresAt = e.leaseUntil.Add(s.opts.Retention)
	e.attempts++
	e.owner = opts.Owner
	if e.payloadHash == "" {
		e.payloadHash = opts.PayloadHash
	}
	s.touch(e, now)
	return inbox.Claim{Status: inbox.Acquired, LeaseID: e.leaseID, ExpiresAt: wall(e.leaseUntil), Lease: lease}
}

// TryBegin implements [inbox.LeaseStore].
func (s *Store) TryBegin(ctx context.Context, key string, opts inbox.BeginOptions) (inbox.Claim, error) {
	if err := inbox.ValidateKey(key); err != nil {
		return inbox.Claim{}, err
	}
	if err := opts.Validate(); err != nil {
		return inbox.Claim{}, err
	}
	now, e, err := s.lock(ctx, key)
	if err != nil {
		return inbox.Claim{}, err
	}
	defer s.mu.Unlock()

	if e == nil {
		if err := s.makeRoom(now); err != nil {
			return inbox.Claim{}, err
		}
		e = &entry{key: key, firstSeen: now}
		s.m[key] = e
		s.pushBack(e)
		return s.acquire(e, now, opts), nil
	}
	mismatch := opts.PayloadHash != "" && e.payloadHash != "" && opts.PayloadHash != e.payloadHash
	switch e.state(now) {
	case inbox.StateProcessed:
		return inbox.Claim{Status: inbox.Processed, PayloadMismatch: mismatch}, nil
	case inbox.StateInProgress:
		if opts.LeaseID != "" && opts.LeaseID == e.leaseID {
			// A retry by the holder: renew from now, so the caller's own
			// reckoning of the deadline (from its retry) holds.
			e.leaseUntil = now.Add(e.lease)
			e.expiresAt = e.leaseUntil.Add(s.opts.Retention)
			s.touch(e, now)
			return inbox.Claim{Status: inbox.Acquired, LeaseID: e.leaseID, ExpiresAt: wall(e.leaseUntil), Lease: e.lease, PayloadMismatch: mismatch}, nil
		}
		return inbox.Claim{Status: inbox.Busy, ExpiresAt: wall(e.leaseUntil), RetryAfter: e.leaseUntil.Sub(now), PayloadMismatch: mismatch}, nil
	default:
		c := s.acquire(e, now, opts)
		c.PayloadMismatch = mismatch
		return c, nil
	}
}

// holder returns e when leaseID holds it (live, or expired and not taken
// over), else an ErrLeaseLost error.
func holder(e *entry, key, leaseID string) error {
	switch {
	case e == nil:
		return fmt.Errorf("%w: key %q has no record", inbox.ErrLeaseLost, key)
	case e.leaseID != leaseID:
		return fmt.Errorf("%w: key %q is not held by lease %q", inbox.ErrLeaseLost, key, leaseID)
	}
	return nil
}

func validateHolderArgs(key, leaseID string) error {
	if err := inbox.ValidateKey(key); err != nil {
		return err
	}
	return inbox.ValidateLeaseID(leaseID)
}

// Complete implements [inbox.LeaseStore].
func (s *Store) Complete(ctx context.Context, key, leaseID string) error {
	if err := validateHolderArgs(key, leaseID); err != nil {
		return err
	}
	now, e, err := s.lock(ctx, key)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if err := holder(e, key, leaseID); err != nil {
		return err
	}
	if e.processed {
		return nil // repeated by the completing lease
	}
	e.processed = true
	e.leaseUntil = time.Time{}
	e.expiresAt = now.Add(s.opts.Retention)
	s.touch(e, now)
	return nil
}

// Release implements [inbox.LeaseStore].
func (s *Store) Release(ctx context.Context, key, leaseID string) error {
	if err := validateHolderArgs(key, leaseID); err != nil {
		return err
	}
	now, e, err := s.lock(ctx, key)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if err := holder(e, key, leaseID); err != nil {
		return err
	}
	if e.processed {
		return fmt.Errorf("%w: key %q is already processed", inbox.ErrLeaseLost, key)
	}
	e.leaseID = ""
	e.leaseUntil = time.Time{}
	e.expiresAt = now.Add(s.opts.Retention)
	s.touch(e, now)
	return nil
}

// Extend implements [inbox.LeaseStore].
func (s *Store) Extend(ctx context.Context, key, leaseID string, lease time.Duration) (time.Time, error) {
	if err := validateHolderArgs(key, leaseID); err != nil {
		return time.Time{}, err
	}
	if err := inbox.ValidateLease(lease); err != nil {
		return time.Time{}, err
	}
	now, e, err := s.lock(ctx, key)
	if err != nil {
		return time.Time{}, err
	}
	defer s.mu.Unlock()
	if err := holder(e, key, leaseID); err != nil {
		return time.Time{}, err
	}
	if e.processed {
		return time.Time{}, fmt.Errorf("%w: key %q is already processed", inbox.ErrLeaseLost, key)
	}
	e.lease = lease
	e.leaseUntil = now.Add(lease)
	e.expiresAt = e.leaseUntil.Add(s.opts.Retention)
	s.touch(e, now)
	return wall(e.leaseUntil), nil
}

// Get implements [inbox.LeaseStore].
func (s *Store) Get(ctx context.Context, key string) (inbox.Record, error) {
	if err := inbox.ValidateKey(key); err != nil {
		return inbox.Record{}, err
	}
	now, e, err := s.lock(ctx, key)
	if err != nil {
		return inbox.Record{}, err
	}
	defer s.mu.Unlock()
	if e == nil {
		return inbox.Record{}, nil
	}
	r := inbox.Record{
		State:       e.state(now),
		Attempts:    e.attempts,
		FirstSeen:   wall(e.firstSeen),
		LastSeen:    wall(e.lastSeen),
		Owner:       e.owner,
		PayloadHash: e.payloadHash,
	}
	if r.State == inbox.StateInProgress {
		r.LeaseUntil = wall(e.leaseUntil)
	}
	return r, nil
}

// IsProcessed implements [inbox.Store].
func (s *Store) IsProcessed(ctx context.Context, key string) (bool, error) {
	if err := inbox.ValidateKey(key); err != nil {
		return false, err
	}
	_, e, err := s.lock(ctx, key)
	if err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	return e != nil && e.processed, nil
}

// MarkProcessed implements [inbox.Store]. It marks key processed whatever
// lease is held on it; the holder's Complete then fails with ErrLeaseLost.
func (s *Store) MarkProcessed(ctx context.Context, key string) error {
	if err := inbox.ValidateKey(key); err != nil {
		return err
	}
	now, e, err := s.lock(ctx, key)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if e == nil {
		if err := s.makeRoom(now); err != nil {
			return err
		}
		e = &entry{key: key, firstSeen: now}
		s.m[key] = e
		s.pushBack(e)
	}
	e.processed = true
	e.leaseID = ""
	e.leaseUntil = time.Time{}
	e.expiresAt = now.Add(s.opts.Retention)
	s.touch(e, now)
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
