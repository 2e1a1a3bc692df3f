// Package memory is an in-process [inbox.LeaseStore]: for tests, for a single
// consumer process, and as the default that needs no server.
//
// Records live in a table guarded by one mutex, so every operation is
// atomic. Expiry is logical: every call compares deadlines on the process's
// monotonic clock, so a processed key is processed for exactly its retention.
// Expired records are swept as writes go by, oldest first. The times the
// store reports (first and last seen, lease deadlines) are the wall clock at
// [New] plus the monotonic time since, so one clock reading serves both; a
// later step of the system clock does not move them.
//
// The store keeps at most [Options.MaxEntries] records. When a new key arrives
// at the bound, expired records go first; then the least recently written
// records that hold no live lease are evicted, which shortens the dedup window
// for those keys (counted in [Stats].Evicted, so it can be alerted on). When
// every record holds a live lease, TryBegin fails with
// [inbox.ErrStoreUnavailable]: the middleware then nacks and the broker
// redelivers later.
//
// Records, their keys (up to 104 bytes) and lease ids (up to 32 bytes)
// included, are kept in chunks of slots that hold no pointers, indexed by a
// table from a seeded hash of the key to a slot, which holds none either: the
// garbage collector does not walk the store, however many records it holds.
// The slot of a removed record is reused for the next new key; the chunks are
// not given back before Close, so the store's memory stays at its high-water
// mark (about 230 bytes a record).
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
	"hash/maphash"
	"math"
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

// entry is one key's record. Records live in fixed-size chunks (Store.recs)
// and hold no pointers, so the garbage collector never scans them: the store
// holds up to a million records, and the collector would otherwise walk every
// one of them again on every cycle. The strings that do not fit in the record
// (long keys and lease ids, owners beyond the first maxOwners, payload
// hashes) are in Store.text, at the same index. Chunks, rather than one
// growing slice, so that growing never copies the records (nor makes garbage
// the size of the store). The records form a list ordered by last write, the
// oldest at the front, so sweeping and eviction start there; prev and next
// are indexes (none: -1), and next also chains the free slots.
//
// Times are int64 nanoseconds, not time.Time (which carries a *Location):
// deadlines on the store's monotonic clock (since Store.epoch), reported
// times as wall-clock Unix nanoseconds.
type entry struct {
	leaseUntil int64         // monotonic; 0 when released or processed
	leaseWall  int64         // leaseUntil on the wall clock, as reported
	expiresAt  int64         // monotonic: the record is gone at this time
	firstSeen  int64         // wall clock
	lastSeen   int64         // wall clock
	lease      time.Duration // length of the current lease
	hash       uint64        // Store.hash of the key
	attempts   int
	prev, next int32
	processed  bool
	// The lease id, when it is at most 32 bytes (inbox.NewLeaseID's and the
	// middleware's are 32): kept here rather than as a string the collector
	// would have to mark. Longer ids are in text, with idLen longID.
	idLen uint8
	// owner is 1 + the index of the owner in Store.owners, or 0 when the
	// owner is text.owner.
	owner uint8
	// The key, when it is at most inlineKey bytes; longer keys are in text,
	// with keyLen longKey.
	keyLen  uint16
	leaseID [32]byte
	key     [inlineKey]byte
}

const (
	longID    = 0xff
	longKey   = 0xffff
	inlineKey = 104 // the record is 224 bytes
)

// text is a record's strings that do not fit in its entry. A chunk of them
// is allocated only once a record of that chunk needs one.
type text struct {
	key         string // when longer than inlineKey
	leaseID     string // live or expired lease longer than the entry holds; after Complete, the completing lease; "" after Release
	owner       string // when not in Store.owners
	payloadHash string
}

// noText is what txt returns for a record whose chunk has no text: read only.
var noText text

const none = int32(-1)

const (
	recentBits = 8
	recentLen  = 1 << recentBits
)

// Records are allocated chunkLen at a time; a slot is recs[i>>chunkBits][i&chunkMask].
const (
	chunkBits = 10
	chunkLen  = 1 << chunkBits
	chunkMask = chunkLen - 1
)

// clock is one reading of the store's clock.
type clock struct {
	mono int64 // nanoseconds since Store.epoch, monotonic
	wall int64 // Unix nanoseconds: Store.epoch's wall clock plus mono
}

func (e *entry) state(now clock) inbox.State {
	switch {
	case e.processed:
		return inbox.StateProcessed
	case e.leaseUntil != 0 && now.mono < e.leaseUntil:
		return inbox.StateInProgress
	default:
		return inbox.StateAvailable
	}
}

// Store is the in-memory [inbox.LeaseStore]. It is safe for concurrent use.
type Store struct {
	opts      Options
	epoch     time.Time // origin of the monotonic times of entries
	epochWall int64     // epoch as Unix nanoseconds
	seed      maphash.Seed

	mu         sync.Mutex
	index      table // hash of a key to the slots of its record; index.n records held
	recs       []*[chunkLen]entry
	text       []*[chunkLen]text // nil chunks where no record needs text
	slots      int32             // slots ever used: recs and text hold at least this many
	head, tail int32             // oldest and newest write
	free       int32             // first free slot of recs, chained by next
	// owners are the first maxOwners owners seen: a record refers to its
	// owner by index, so that the collector has no owner string to visit
	// per record (consumers are few, and each names itself the same way on
	// every claim). Later owners are kept as strings in the records.
	owners  []string
	evicted uint64
	closed  bool
	// recent holds 1 + the slot of records recently acquired, at a hash of
	// their lease id (0: none), so that the Complete or Release of a fresh
	// claim finds its record without a lookup in index. Entries are hints,
	// checked against the record.
	recent [recentLen]int32

	testHash func(string) uint64 // replaces the seeded hash in tests, to make keys collide
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
	epoch := time.Now()
	return &Store{
		opts: opts, epoch: epoch, epochWall: epoch.UnixNano(), seed: maphash.MakeSeed(),
		head: none, tail: none, free: none,
	}, nil
}

// Close makes every later call fail with [inbox.ErrClosed] and drops the
// records.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.index, s.recs, s.text, s.slots, s.owners = table{}, nil, nil, 0, nil
	s.head, s.tail, s.free = none, none, none
	return nil
}

// CallTimeout implements [inbox.BoundedCalls]: calls never block, so callers
// need no timeout around them.
func (s *Store) CallTimeout() time.Duration { return 0 }

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Entries: s.index.n, Evicted: s.evicted}
}

// wallTime turns Unix nanoseconds into a time.Time without a monotonic
// reading, as the store reports times.
func wallTime(ns int64) time.Time { return time.Unix(0, ns) }

// now reads the store's clock: the monotonic one only (time.Since reads no
// wall clock), the wall time derived from it.
func (s *Store) now() clock {
	mono := int64(time.Since(s.epoch))
	return clock{mono: mono, wall: s.epochWall + mono}
}

// rec returns record i.
func (s *Store) rec(i int32) *entry { return &s.recs[i>>chunkBits][i&chunkMask] }

// txt returns the strings of record i, for reading: noText when its chunk
// has none.
func (s *Store) txt(i int32) *text {
	if c := s.text[i>>chunkBits]; c != nil {
		return &c[i&chunkMask]
	}
	return &noText
}

// txtw returns the strings of record i, for writing.
func (s *Store) txtw(i int32) *text {
	c := s.text[i>>chunkBits]
	if c == nil {
		c = new([chunkLen]text)
		s.text[i>>chunkBits] = c
	}
	return &c[i&chunkMask]
}

// hash returns the index hash of key.
func (s *Store) hash(key string) uint64 {
	if s.testHash != nil {
		return s.testHash(key)
	}
	return maphash.String(s.seed, key)
}

// find returns the index of key's record (none when absent), given its hash.
func (s *Store) find(key string, h uint64) int32 {
	t := s.index.w
	if len(t) == 0 {
		return none
	}
	m, lo := len(t)-1, uint32(h)
	for p := int(lo) & m; t[p] != 0; p = (p + 1) & m {
		if x := t[p]; uint32(x>>32) == lo {
			if i := int32(uint32(x)) - 1; s.rec(i).hash == h && s.keyIs(i, key) {
				return i
			}
		}
	}
	return none
}

// keyIs reports whether record i is key's.
func (s *Store) keyIs(i int32, key string) bool {
	e := s.rec(i)
	if e.keyLen != longKey {
		return int(e.keyLen) == len(key) && string(e.key[:e.keyLen]) == key
	}
	return s.txt(i).key == key
}

// lock checks the context, locks the store and returns the current time and
// the index of key's live record (none when absent or expired). Callers must
// unlock.
func (s *Store) lock(ctx context.Context, key string) (clock, int32, error) {
	return s.lockHashed(ctx, key, s.hash(key))
}

// lockHashed is lock for a key whose hash h the caller has, to insert the
// key if it is absent.
func (s *Store) lockHashed(ctx context.Context, key string, h uint64) (clock, int32, error) {
	if err := ctx.Err(); err != nil {
		return clock{}, none, fmt.Errorf("memory store: %w", err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return clock{}, none, fmt.Errorf("memory store: %w", inbox.ErrClosed)
	}
	now := s.now()
	i := s.find(key, h)
	if i == none {
		return now, none, nil
	}
	if now.mono >= s.rec(i).expiresAt {
		s.remove(i)
		return now, none, nil
	}
	return now, i, nil
}

// insert adds a record for key, whose hash is h, first seen at now, at the
// back of the list. Call makeRoom first.
func (s *Store) insert(key string, h uint64, now clock) int32 {
	i := s.free
	if i != none {
		s.free = s.rec(i).next
	} else {
		i = s.slots
		s.slots++
		if int(i>>chunkBits) == len(s.recs) {
			s.recs = append(s.recs, new([chunkLen]entry))
			s.text = append(s.text, nil)
		}
	}
	e := s.rec(i)
	*e = entry{firstSeen: now.wall, prev: none, next: none, hash: h}
	if len(key) <= inlineKey {
		e.keyLen = uint16(copy(e.key[:], key))
	} else {
		e.keyLen = longKey
		s.txtw(i).key = key
	}
	s.index.insert(word(h, i))
	s.pushBack(i)
	return i
}

// touch records a write to record i at now: it moves i to the back of the
// list and sweeps a few expired records from the front.
func (s *Store) touch(i int32, now clock) {
	s.rec(i).lastSeen = now.wall
	if s.tail != i {
		s.unlink(i)
		s.pushBack(i)
	}
	for n := 0; n < 4 && s.head != none && s.head != i && now.mono >= s.rec(s.head).expiresAt; n++ {
		s.remove(s.head)
	}
}

func (s *Store) pushBack(i int32) {
	e := s.rec(i)
	e.prev, e.next = s.tail, none
	if s.tail != none {
		s.rec(s.tail).next = i
	} else {
		s.head = i
	}
	s.tail = i
}

func (s *Store) unlink(i int32) {
	e := s.rec(i)
	if e.prev != none {
		s.rec(e.prev).next = e.next
	} else if s.head == i {
		s.head = e.next
	}
	if e.next != none {
		s.rec(e.next).prev = e.prev
	} else if s.tail == i {
		s.tail = e.prev
	}
	e.prev, e.next = none, none
}

// remove deletes record i and frees its slot.
func (s *Store) remove(i int32) {
	s.unlink(i)
	e := s.rec(i)
	s.index.remove(word(e.hash, i))
	if c := s.text[i>>chunkBits]; c != nil {
		c[i&chunkMask] = text{}
	}
	*e = entry{prev: none, next: s.free}
	s.free = i
}

// makeRoom keeps len(m) < MaxEntries before an insert.
func (s *Store) makeRoom(now clock) error {
	if s.free == none && s.slots == math.MaxInt32 {
		return fmt.Errorf("%w: memory store full: %d records", inbox.ErrStoreUnavailable, s.index.n)
	}
	if s.opts.MaxEntries < 0 || s.index.n < s.opts.MaxEntries {
		return nil
	}
	for s.head != none && now.mono >= s.rec(s.head).expiresAt {
		s.remove(s.head)
	}
	for i := s.head; i != none && s.index.n >= s.opts.MaxEntries; {
		next := s.rec(i).next
		if s.rec(i).state(now) != inbox.StateInProgress {
			s.remove(i)
			s.evicted++
		}
		i = next
	}
	if s.index.n >= s.opts.MaxEntries {
		return fmt.Errorf("%w: memory store full: all %d records hold a live lease (Options.MaxEntries)", inbox.ErrStoreUnavailable, s.index.n)
	}
	return nil
}

func (s *Store) leaseFor(d time.Duration) time.Duration {
	if d == 0 {
		return s.opts.Lease
	}
	return d
}

// acquire gives record i a new lease.
func (s *Store) acquire(i int32, now clock, opts inbox.BeginOptions) inbox.Claim {
	e := s.rec(i)
	lease := s.leaseFor(opts.Lease)
	id := opts.LeaseID
	if id == "" {
		id = inbox.NewLeaseID()
	}
	s.setLeaseID(i, id)
	s.recent[s.recentAt(id)] = i + 1
	e.lease = lease
	s.setLease(e, now, lease)
	e.attempts++
	s.setOwner(i, opts.Owner)
	if opts.PayloadHash != "" && s.txt(i).payloadHash == "" {
		s.txtw(i).payloadHash = opts.PayloadHash
	}
	s.touch(i, now)
	return inbox.Claim{Status: inbox.Acquired, LeaseID: id, ExpiresAt: wallTime(e.leaseWall), Lease: lease}
}

// setLease makes e's lease end lease after now, and the record retention
// after that.
func (s *Store) setLease(e *entry, now clock, lease time.Duration) {
	e.leaseUntil = add(now.mono, lease)
	e.leaseWall = add(now.wall, lease)
	e.expiresAt = add(e.leaseUntil, s.opts.Retention)
}

// endLease clears e's lease; the record lives for the retention from now.
func (s *Store) endLease(e *entry, now clock) {
	e.leaseUntil, e.leaseWall = 0, 0
	e.expiresAt = add(now.mono, s.opts.Retention)
}

// add returns t+d, saturating: a lease or retention of centuries ends at the
// largest time the store can hold (year 2262) instead of wrapping around.
func add(t int64, d time.Duration) int64 {
	if d > 0 && t > math.MaxInt64-int64(d) {
		return math.MaxInt64
	}
	return t + int64(d)
}

// TryBegin implements [inbox.LeaseStore].
func (s *Store) TryBegin(ctx context.Context, key string, opts inbox.BeginOptions) (inbox.Claim, error) {
	if err := inbox.ValidateKey(key); err != nil {
		return inbox.Claim{}, err
	}
	if err := opts.Validate(); err != nil {
		return inbox.Claim{}, err
	}
	h := s.hash(key)
	now, i, err := s.lockHashed(ctx, key, h)
	if err != nil {
		return inbox.Claim{}, err
	}
	defer s.mu.Unlock()

	if i == none {
		if err := s.makeRoom(now); err != nil {
			return inbox.Claim{}, err
		}
		return s.acquire(s.insert(key, h, now), now, opts), nil
	}
	e, t := s.rec(i), s.txt(i)
	mismatch := opts.PayloadHash != "" && t.payloadHash != "" && opts.PayloadHash != t.payloadHash
	switch e.state(now) {
	case inbox.StateProcessed:
		return inbox.Claim{Status: inbox.Processed, PayloadMismatch: mismatch}, nil
	case inbox.StateInProgress:
		if opts.LeaseID != "" && s.heldBy(i, opts.LeaseID) {
			// A retry by the holder: renew from now, so the caller's own
			// reckoning of the deadline (from its retry) holds.
			s.setLease(e, now, e.lease)
			s.touch(i, now)
			return inbox.Claim{Status: inbox.Acquired, LeaseID: opts.LeaseID, ExpiresAt: wallTime(e.leaseWall), Lease: e.lease, PayloadMismatch: mismatch}, nil
		}
		return inbox.Claim{Status: inbox.Busy, ExpiresAt: wallTime(e.leaseWall), RetryAfter: time.Duration(e.leaseUntil - now.mono), PayloadMismatch: mismatch}, nil
	default:
		c := s.acquire(i, now, opts)
		c.PayloadMismatch = mismatch
		return c, nil
	}
}

const maxOwners = 16

// setOwner records owner as record i's owner.
func (s *Store) setOwner(i int32, owner string) {
	e := s.rec(i)
	if t := s.txt(i); t.owner != "" {
		t.owner = ""
	}
	for n, o := range s.owners {
		if o == owner {
			e.owner = uint8(n + 1)
			return
		}
	}
	if len(s.owners) < maxOwners {
		s.owners = append(s.owners, owner)
		e.owner = uint8(len(s.owners))
		return
	}
	e.owner = 0
	s.txtw(i).owner = owner
}

// ownerOf returns record i's owner.
func (s *Store) ownerOf(i int32) string {
	if n := s.rec(i).owner; n != 0 {
		return s.owners[n-1]
	}
	return s.txt(i).owner
}

// setLeaseID records id as record i's lease id ("": none).
func (s *Store) setLeaseID(i int32, id string) {
	e := s.rec(i)
	if len(id) <= len(e.leaseID) {
		e.idLen = uint8(len(id))
		copy(e.leaseID[:], id)
		if t := s.txt(i); t.leaseID != "" {
			t.leaseID = ""
		}
	} else {
		e.idLen = longID
		s.txtw(i).leaseID = id
	}
}

// heldBy reports whether id is record i's lease id.
func (s *Store) heldBy(i int32, id string) bool {
	if e := s.rec(i); e.idLen != longID {
		return int(e.idLen) == len(id) && string(e.leaseID[:e.idLen]) == id
	}
	return s.txt(i).leaseID == id
}

// recentAt returns the index in Store.recent of lease id.
// Lease ids are random (the middleware's and inbox.NewLeaseID's), so
// their last eight bytes, mixed by a multiplication, spread well enough; ids
// that are not random only make hints collide, which costs a lookup in
// index, never a wrong answer.
func (s *Store) recentAt(id string) int {
	var x uint64
	if n := len(id); n >= 8 {
		t := id[n-8:]
		x = uint64(t[0]) | uint64(t[1])<<8 | uint64(t[2])<<16 | uint64(t[3])<<24 |
			uint64(t[4])<<32 | uint64(t[5])<<40 | uint64(t[6])<<48 | uint64(t[7])<<56
	} else {
		for i := range n {
			x = x<<8 | uint64(id[i])
		}
	}
	return int((x * 0x9e3779b97f4a7c15) >> (64 - recentBits))
}

// lockHolder validates key and leaseID, locks the store and returns the
// current time and the index of key's live record, which leaseID holds. On
// error the store is unlocked. A pair that a TryBegin recently acquired is
// found through Store.recent, without hashing the key, looking it up or
// validating the arguments: equal to the key and lease id of a record, they
// are as valid as when they were stored.
func (s *Store) lockHolder(ctx context.Context, key, leaseID string) (clock, int32, error) {
	if key != "" && leaseID != "" && ctx.Err() == nil {
		s.mu.Lock()
		if r := s.recent[s.recentAt(leaseID)]; r != 0 && !s.closed {
			if i := r - 1; s.heldBy(i, leaseID) && s.keyIs(i, key) {
				if now := s.now(); now.mono < s.rec(i).expiresAt {
					return now, i, nil
				}
			}
		}
		s.mu.Unlock()
	}
	if err := inbox.ValidateHolder(key, leaseID); err != nil {
		return clock{}, none, err
	}
	now, i, err := s.lock(ctx, key)
	if err != nil {
		return clock{}, none, err
	}
	if err := s.holder(i, key, leaseID); err != nil {
		s.mu.Unlock()
		return clock{}, none, err
	}
	return now, i, nil
}

// holder returns nil when leaseID holds record i (live, or expired and not
// taken over), else an ErrLeaseLost error.
func (s *Store) holder(i int32, key, leaseID string) error {
	switch {
	case i == none:
		return fmt.Errorf("%w: key %q has no record", inbox.ErrLeaseLost, key)
	case !s.heldBy(i, leaseID):
		return fmt.Errorf("%w: key %q is not held by lease %q", inbox.ErrLeaseLost, key, leaseID)
	}
	return nil
}

// Complete implements [inbox.LeaseStore].
func (s *Store) Complete(ctx context.Context, key, leaseID string) error {
	now, i, err := s.lockHolder(ctx, key, leaseID)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	e := s.rec(i)
	if e.processed {
		return nil // repeated by the completing lease
	}
	e.processed = true
	s.endLease(e, now)
	s.touch(i, now)
	return nil
}

// Release implements [inbox.LeaseStore].
func (s *Store) Release(ctx context.Context, key, leaseID string) error {
	now, i, err := s.lockHolder(ctx, key, leaseID)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	e := s.rec(i)
	if e.processed {
		return fmt.Errorf("%w: key %q is already processed", inbox.ErrLeaseLost, key)
	}
	s.setLeaseID(i, "")
	s.endLease(e, now)
	s.touch(i, now)
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
	now, i, err := s.lock(ctx, key)
	if err != nil {
		return time.Time{}, err
	}
	defer s.mu.Unlock()
	if err := s.holder(i, key, leaseID); err != nil {
		return time.Time{}, err
	}
	e := s.rec(i)
	if e.processed {
		return time.Time{}, fmt.Errorf("%w: key %q is already processed", inbox.ErrLeaseLost, key)
	}
	e.lease = lease
	s.setLease(e, now, lease)
	s.touch(i, now)
	return wallTime(e.leaseWall), nil
}

// Get implements [inbox.LeaseStore].
func (s *Store) Get(ctx context.Context, key string) (inbox.Record, error) {
	if err := inbox.ValidateKey(key); err != nil {
		return inbox.Record{}, err
	}
	now, i, err := s.lock(ctx, key)
	if err != nil {
		return inbox.Record{}, err
	}
	defer s.mu.Unlock()
	if i == none {
		return inbox.Record{}, nil
	}
	e, t := s.rec(i), s.txt(i)
	r := inbox.Record{
		State:       e.state(now),
		Attempts:    e.attempts,
		FirstSeen:   wallTime(e.firstSeen),
		LastSeen:    wallTime(e.lastSeen),
		Owner:       s.ownerOf(i),
		PayloadHash: t.payloadHash,
	}
	if r.State == inbox.StateInProgress {
		r.LeaseUntil = wallTime(e.leaseWall)
	}
	return r, nil
}

// IsProcessed implements [inbox.Store].
func (s *Store) IsProcessed(ctx context.Context, key string) (bool, error) {
	if err := inbox.ValidateKey(key); err != nil {
		return false, err
	}
	_, i, err := s.lock(ctx, key)
	if err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	return i != none && s.rec(i).processed, nil
}

// MarkProcessed implements [inbox.Store]. It marks key processed whatever
// lease is held on it; the holder's Complete then fails with ErrLeaseLost.
func (s *Store) MarkProcessed(ctx context.Context, key string) error {
	if err := inbox.ValidateKey(key); err != nil {
		return err
	}
	h := s.hash(key)
	now, i, err := s.lockHashed(ctx, key, h)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if i == none {
		if err := s.makeRoom(now); err != nil {
			return err
		}
		i = s.insert(key, h, now)
	}
	e := s.rec(i)
	e.processed = true
	s.setLeaseID(i, "")
	s.endLease(e, now)
	s.touch(i, now)
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
