// Package memory is an in-process [inbox.LeaseStore] and [inbox.Admin]: for
// tests, for a single consumer process, and as the default that needs no
// server. Create one with [New], or by URL with
// [github.com/watermill-inbox/inbox/stores] (each Open returns a new, empty
// store):
//
//	memory://?retention=168h&lease=30s&max_entries=1000000
//
// What each method does and guarantees is [inbox.LeaseStore]'s contract.
// The records live in the process: they are lost when it exits and not
// shared with other processes. Deadlines are on the process's monotonic
// clock; reported times are the wall clock at [New] plus the monotonic time
// since. The repository's docs/stores.md ("Stores in depth", memory) says
// how it works and what List costs.
//
// At most [Options.MaxEntries] records are kept. A new key at the bound
// evicts records from the least recently written, skipping those with a
// live lease; evicting a processed key shortens its dedup window, and
// [Stats].Evicted counts it. When every record holds a live lease, TryBegin
// and MarkProcessed fail with [inbox.ErrStoreUnavailable].
//
// The store keeps order ([inbox.OrderAdmin]): a Fail with an OrderKey
// opens a gate for it, headed by the failed key, and a TryBegin with the
// OrderKey of another key then answers [inbox.Behind] and queues the key
// behind the head, without a record of its own. Once the head is
// processed (or an operator releases it, ReleaseOrder) the first waiting
// key is the head and runs. A gate is dropped when its last key has
// passed, or the retention plus the default lease after its last change.
package memory

import (
	"container/list"
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
	"github.com/watermill-inbox/inbox/stores/driver"
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
	// Gates is the number of order keys with a gate (keys waiting behind
	// a failed one, or a failed key that others would wait behind),
	// expired ones not yet swept included.
	Gates int
}

// record is what the store knows of one key. Its deadlines are time.Now
// readings plus durations: they compare on the monotonic clock.
type record struct {
	key        string
	elem       *list.Element // the record's place in Store.order
	processed  bool
	dead       bool
	reason     string        // of the latest Fail
	retryAt    time.Time     // the backoff of the latest Fail ends; zero when none
	leaseID    string        // the current or last lease; after Complete the completing one; "" after Release, Fail or MarkProcessed
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
	case r.dead:
		return inbox.StateDead
	case !r.leaseUntil.IsZero() && now.Before(r.leaseUntil):
		return inbox.StateInProgress
	default:
		return inbox.StateAvailable
	}
}

func (r *record) expired(now time.Time) bool { return !now.Before(r.expiresAt) }

// gate is the order of one order key: the key at its head, and the keys
// waiting behind it in the order they first arrived.
type gate struct {
	orderKey  string
	elem      *list.Element // the gate's place in mem.gateOrder
	head      string
	waiting   []string
	expiresAt time.Time // the gate is gone from this time on
}

// Store is the in-memory [inbox.LeaseStore]. It is safe for concurrent use.
// The portable layer it embeds ([driver.Store]) validates input and maps
// errors; the records live in its driver.
//
// Its methods are those of the portable layer it embeds, [driver.Store],
// with the contracts of [inbox.LeaseStore] and [inbox.Admin]:
//
//   - TryBegin(ctx, key, opts) (inbox.Claim, error): claims key with a
//     lease: Acquired, Busy (another live lease, or a failed attempt's
//     backoff), Processed or Dead; Behind when another key of
//     opts.OrderKey failed and is not processed yet.
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
//   - KeepsOrder (true), Order, ReleaseOrder: the order of order keys
//     ([inbox.OrderAdmin]).
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
	m *mem
}

var (
	_ inbox.LeaseStore = (*Store)(nil)
	_ inbox.OrderAdmin = (*Store)(nil)
)

// mem is the store's driver: the records under one mutex.
type mem struct {
	opts      Options
	epoch     time.Time // time.Now at New, monotonic reading included
	epochWall time.Time // epoch without its monotonic reading

	mu        sync.Mutex
	recs      map[string]*record
	order     *list.List // of *record, least recently written at the front
	evicted   uint64
	gates     map[string]*gate // by order key
	gateOrder *list.List       // of *gate, least recently changed at the front
}

// New returns an empty store.
func New(opts Options) (*Store, error) {
	opts.setDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	epoch := time.Now()
	m := &mem{opts: opts, epoch: epoch, epochWall: epoch.Round(0), recs: make(map[string]*record), order: list.New(),
		gates: make(map[string]*gate), gateOrder: list.New()}
	// No Timeout and no batching: a call never waits for anything but the
	// mutex.
	ds, err := driver.New(m, driver.Config{Name: "memory store", Lease: opts.Lease, Retention: opts.Retention, InProcess: true, Order: true})
	if err != nil {
		return nil, err
	}
	return &Store{Store: ds, m: m}, nil
}

// Close makes every later call fail with [inbox.ErrClosed] and drops the
// records.
func (m *mem) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs = make(map[string]*record)
	m.order.Init()
	m.gates = make(map[string]*gate)
	m.gateOrder.Init()
	return nil
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	return Stats{Entries: len(m.recs), Evicted: m.evicted, Gates: len(m.gates)}
}

// wall returns t as the store reports times: the wall clock at New plus the
// monotonic time from New to t.
func (m *mem) wall(t time.Time) time.Time { return m.epochWall.Add(t.Sub(m.epoch)) }

// find returns key's live record at now, nil when absent or expired (an
// expired record is removed). Call with mu held.
func (m *mem) find(key string, now time.Time) *record {
	r := m.recs[key]
	if r != nil && r.expired(now) {
		m.remove(r)
		r = nil
	}
	return r
}

// findOrInsert returns key's live record, adding one first seen at now
// when there is none. The caller touches it.
func (m *mem) findOrInsert(key string, now time.Time) (*record, error) {
	if r := m.find(key, now); r != nil {
		return r, nil
	}
	if err := m.makeRoom(now); err != nil {
		return nil, err
	}
	r := &record{key: key, firstSeen: m.wall(now)}
	r.elem = m.order.PushBack(r)
	m.recs[key] = r
	return r, nil
}

func (m *mem) remove(r *record) {
	m.order.Remove(r.elem)
	delete(m.recs, r.key)
}

// touch records a write to r at now: it moves r to the back of the list and
// sweeps a few expired records from the front.
func (m *mem) touch(r *record, now time.Time) {
	r.lastSeen = m.wall(now)
	m.order.MoveToBack(r.elem)
	for n := 0; n < 4; n++ {
		front := m.order.Front().Value.(*record)
		if front == r || !front.expired(now) {
			break
		}
		m.remove(front)
	}
}

// makeRoom makes room for one more record within MaxEntries: walking from
// the least recently written record, it drops expired records and evicts
// those without a live lease.
func (m *mem) makeRoom(now time.Time) error {
	limit := m.opts.MaxEntries
	full := func() bool { return limit >= 0 && len(m.recs) >= limit }
	for e := m.order.Front(); e != nil && full(); {
		r, next := e.Value.(*record), e.Next()
		if r.expired(now) {
			m.remove(r)
		} else if r.state(now) != inbox.StateInProgress {
			m.remove(r)
			m.evicted++
		}
		e = next
	}
	if full() {
		return fmt.Errorf("%w: memory store full: all %d records hold a live lease (Options.MaxEntries)", inbox.ErrStoreUnavailable, len(m.recs))
	}
	return nil
}

// setLease starts a lease on r; the record is kept for the retention after it.
func (m *mem) setLease(r *record, now time.Time, lease time.Duration) {
	r.lease = lease
	r.leaseUntil = now.Add(lease)
	r.expiresAt = r.leaseUntil.Add(m.opts.Retention)
}

// endLease clears r's lease; the record is kept for the retention from now.
func (m *mem) endLease(r *record, now time.Time) {
	r.leaseUntil = time.Time{}
	r.expiresAt = now.Add(m.opts.Retention)
}

// Apply implements [driver.Driver]: the ops one after the other under the
// mutex.
func (m *mem) Apply(_ context.Context, ops []driver.Op, res []inbox.Claim, errs []error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	for i, op := range ops {
		switch op.Kind {
		case driver.Claim:
			res[i], errs[i] = m.tryBegin(now, op)
		case driver.Complete:
			errs[i] = m.complete(now, op.Key, op.LeaseID)
		case driver.Release:
			errs[i] = m.release(now, op.Key, op.LeaseID)
		case driver.Mark:
			errs[i] = m.markProcessed(now, op.Key)
		case driver.Fail:
			errs[i] = m.fail(now, op.Key, op.LeaseID, op.Failure)
		}
	}
	return nil
}

func (m *mem) tryBegin(now time.Time, op driver.Op) (inbox.Claim, error) {
	if op.OrderKey != "" {
		if c, ok := m.behind(now, op); ok {
			return c, nil
		}
	}
	r, err := m.findOrInsert(op.Key, now)
	if err != nil {
		return inbox.Claim{}, err
	}
	mismatch := op.PayloadHash != "" && r.payload != "" && op.PayloadHash != r.payload
	c := inbox.Claim{PayloadMismatch: mismatch, Attempts: r.attempts}
	switch r.state(now) {
	case inbox.StateProcessed:
		c.Status = inbox.Processed
		return c, nil
	case inbox.StateDead:
		c.Status, c.Reason = inbox.Dead, r.reason
		return c, nil
	case inbox.StateInProgress:
		if op.LeaseID != r.leaseID {
			c.Status, c.ExpiresAt, c.RetryAfter = inbox.Busy, m.wall(r.leaseUntil), r.leaseUntil.Sub(now)
			return c, nil
		}
		// A retry by the holder: renew from now, so that the caller's own
		// reckoning of the deadline (from its retry) holds.
		m.setLease(r, now, r.lease)
	default:
		if now.Before(r.retryAt) { // a failed attempt's backoff
			c.Status, c.ExpiresAt, c.RetryAfter, c.BackingOff = inbox.Busy, m.wall(r.retryAt), r.retryAt.Sub(now), true
			return c, nil
		}
		r.leaseID = op.LeaseID
		r.retryAt = time.Time{}
		m.setLease(r, now, op.Lease)
		r.attempts++
		r.owner = op.Owner
		if r.payload == "" {
			r.payload = op.PayloadHash
		}
	}
	m.touch(r, now)
	c.Status, c.LeaseID, c.ExpiresAt, c.Lease, c.Attempts = inbox.Acquired, r.leaseID, m.wall(r.leaseUntil), r.lease, r.attempts
	return c, nil
}

// holder returns key's record if leaseID holds it (its lease live, or
// expired and not taken over), else an error wrapping ErrLeaseLost. A
// processed key is held only by a repeated Complete (completing).
func (m *mem) holder(now time.Time, key, leaseID string, completing bool) (*record, error) {
	r := m.find(key, now)
	switch {
	case r == nil:
		return nil, fmt.Errorf("%w: the key has no record", inbox.ErrLeaseLost)
	case r.leaseID != leaseID:
		return nil, fmt.Errorf("%w: the key is not held by lease %q", inbox.ErrLeaseLost, leaseID)
	case r.processed && !completing:
		return nil, fmt.Errorf("%w: the key is already processed", inbox.ErrLeaseLost)
	}
	return r, nil
}

func (m *mem) complete(now time.Time, key, leaseID string) error {
	r, err := m.holder(now, key, leaseID, true)
	if err != nil {
		return err
	}
	if !r.processed { // else repeated by the completing lease
		r.processed = true
		m.endLease(r, now)
		m.touch(r, now)
	}
	return nil
}

func (m *mem) release(now time.Time, key, leaseID string) error {
	r, err := m.holder(now, key, leaseID, false)
	if err != nil {
		return err
	}
	r.leaseID = ""
	m.endLease(r, now)
	m.touch(r, now)
	return nil
}

// fail ends a failed attempt: the key is given back after opts.RetryAfter,
// or marked dead. With opts.OrderKey, the key heads the order key's gate,
// opened if there is none (a gate headed by another key is left as it is).
func (m *mem) fail(now time.Time, key, leaseID string, opts inbox.FailOptions) error {
	r, err := m.holder(now, key, leaseID, false)
	if err != nil {
		return err
	}
	r.leaseID, r.reason, r.dead = "", opts.Reason, opts.Dead
	m.endLease(r, now)
	if !opts.Dead && opts.RetryAfter > 0 {
		r.retryAt = now.Add(opts.RetryAfter)
		r.expiresAt = r.retryAt.Add(m.opts.Retention)
	}
	m.touch(r, now)
	if opts.OrderKey != "" {
		switch g := m.advance(opts.OrderKey, now); {
		case g == nil:
			m.openGate(opts.OrderKey, key, now)
		case g.head == key:
			m.touchGate(g, now)
		}
	}
	return nil
}

// markProcessed marks key processed whatever lease is held on it.
func (m *mem) markProcessed(now time.Time, key string) error {
	r, err := m.findOrInsert(key, now)
	if err != nil {
		return err
	}
	r.processed, r.dead, r.retryAt = true, false, time.Time{}
	r.leaseID = ""
	m.endLease(r, now)
	m.touch(r, now)
	return nil
}

// findGate returns the live gate of orderKey at now, nil when there is
// none (an expired one is removed). Call with mu held.
func (m *mem) findGate(orderKey string, now time.Time) *gate {
	g := m.gates[orderKey]
	if g != nil && !now.Before(g.expiresAt) {
		m.removeGate(g)
		g = nil
	}
	return g
}

func (m *mem) removeGate(g *gate) {
	m.gateOrder.Remove(g.elem)
	delete(m.gates, g.orderKey)
}

// touchGate records a change of g at now: it lives for the retention plus
// the default lease from now, moves to the back of the list, and a few
// expired gates are swept from the front.
func (m *mem) touchGate(g *gate, now time.Time) {
	g.expiresAt = now.Add(m.opts.Retention + m.opts.Lease)
	m.gateOrder.MoveToBack(g.elem)
	for n := 0; n < 4; n++ {
		front := m.gateOrder.Front().Value.(*gate)
		if front == g || now.Before(front.expiresAt) {
			break
		}
		m.removeGate(front)
	}
}

// openGate makes head the head of a new gate of orderKey.
func (m *mem) openGate(orderKey, head string, now time.Time) {
	g := &gate{orderKey: orderKey, head: head}
	g.elem = m.gateOrder.PushBack(g)
	m.gates[orderKey] = g
	m.touchGate(g, now)
}

// pass moves g on by one key: the first waiting key is the head, or, when
// none waits, the gate is removed and pass returns nil.
func (m *mem) pass(g *gate, now time.Time) *gate {
	if len(g.waiting) == 0 {
		m.removeGate(g)
		return nil
	}
	g.head = g.waiting[0]
	g.waiting = slices.Delete(g.waiting, 0, 1)
	m.touchGate(g, now)
	return g
}

// advance returns the live gate of orderKey after moving it past the
// heads that are processed, nil when none is left.
func (m *mem) advance(orderKey string, now time.Time) *gate {
	g := m.findGate(orderKey, now)
	for g != nil {
		if r := m.find(g.head, now); r == nil || !r.processed {
			return g
		}
		g = m.pass(g, now)
	}
	return nil
}

// behind answers a claim of op.Key with op.OrderKey that waits behind
// another key (Behind, the key queued once), or reports false: the claim
// goes on as one without an order key. A processed or dead key answers as
// such, whatever its order.
func (m *mem) behind(now time.Time, op driver.Op) (inbox.Claim, bool) {
	r := m.find(op.Key, now)
	if r != nil && (r.processed || r.dead) {
		return inbox.Claim{}, false
	}
	g := m.advance(op.OrderKey, now)
	if g == nil || g.head == op.Key {
		return inbox.Claim{}, false
	}
	if !slices.Contains(g.waiting, op.Key) {
		g.waiting = append(g.waiting, op.Key)
		m.touchGate(g, now)
	}
	c := inbox.Claim{Status: inbox.Behind}
	if r != nil {
		c.Attempts, c.PayloadMismatch = r.attempts, op.PayloadHash != "" && r.payload != "" && op.PayloadHash != r.payload
	}
	if h := m.find(g.head, now); h != nil && h.state(now) == inbox.StateAvailable && now.Before(h.retryAt) {
		c.RetryAfter = h.retryAt.Sub(now)
	}
	return c, true
}

// Order implements [driver.Orderer].
func (m *mem) Order(_ context.Context, orderKey string) (inbox.OrderGate, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.advance(orderKey, time.Now())
	if g == nil {
		return inbox.OrderGate{}, nil
	}
	return inbox.OrderGate{Head: g.head, Waiting: slices.Clone(g.waiting)}, nil
}

// ReleaseOrder implements [driver.Orderer].
func (m *mem) ReleaseOrder(_ context.Context, orderKey, head string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	g := m.advance(orderKey, now)
	switch {
	case g == nil:
		return fmt.Errorf("%w: no key of the order key waits on %q", inbox.ErrLeaseLost, head)
	case g.head != head:
		return fmt.Errorf("%w: the head of the order key is %q, not %q", inbox.ErrLeaseLost, g.head, head)
	}
	m.pass(g, now)
	return nil
}

// Extend implements [driver.Driver].
func (m *mem) Extend(_ context.Context, key, leaseID string, lease time.Duration) (time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	r, err := m.holder(now, key, leaseID, false)
	if err != nil {
		return time.Time{}, err
	}
	m.setLease(r, now, lease)
	seen := r.lastSeen
	m.touch(r, now)
	r.lastSeen = seen // a heartbeat is no sighting: LastSeen stays the acquisition's (inbox.Record)
	return m.wall(r.leaseUntil), nil
}

// Get implements [driver.Driver].
func (m *mem) Get(_ context.Context, key string) (inbox.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	r := m.find(key, now)
	if r == nil {
		return inbox.Record{}, nil
	}
	return m.record(r, now), nil
}

// record returns what Get reports of r at now.
func (m *mem) record(r *record, now time.Time) inbox.Record {
	rec := inbox.Record{
		State:       r.state(now),
		Attempts:    r.attempts,
		FirstSeen:   r.firstSeen,
		LastSeen:    r.lastSeen,
		Owner:       r.owner,
		PayloadHash: r.payload,
		Reason:      r.reason,
	}
	if rec.State == inbox.StateInProgress {
		rec.LeaseUntil = m.wall(r.leaseUntil)
	}
	if rec.State == inbox.StateAvailable && now.Before(r.retryAt) {
		rec.RetryAt = m.wall(r.retryAt)
	}
	return rec
}

// List implements [driver.Driver]: the live records, filtered, sorted by
// key, from the one after the cursor (the last key of the previous page).
func (m *mem) List(_ context.Context, opts inbox.ListOptions) (inbox.ListPage, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	seenBefore := m.wall(now).Add(-opts.OlderThan)
	var keys []string
	for k, r := range m.recs {
		if k > opts.Cursor && strings.HasPrefix(k, opts.Prefix) && !r.expired(now) &&
			(opts.State == inbox.StateNotFound || r.state(now) == opts.State) && !r.lastSeen.After(seenBefore) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var p inbox.ListPage
	if len(keys) > opts.Limit {
		keys = keys[:opts.Limit]
		p.Next = keys[len(keys)-1]
	}
	for _, k := range keys {
		p.Items = append(p.Items, inbox.ListItem{Key: k, Record: m.record(m.recs[k], now)})
	}
	return p, nil
}

// Forget implements [driver.Driver].
func (m *mem) Forget(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.recs[key]; r != nil {
		m.remove(r)
	}
	return nil
}

// ForceRelease implements [driver.Driver].
func (m *mem) ForceRelease(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	r := m.find(key, now)
	if r == nil || r.processed || r.dead {
		return nil
	}
	if r.state(now) == inbox.StateInProgress || now.Before(r.retryAt) {
		r.leaseID, r.retryAt = "", time.Time{}
		m.endLease(r, now)
		m.touch(r, now)
	}
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
