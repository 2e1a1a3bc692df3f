package inbox

import (
	"context"
	"fmt"
	"time"
)

// Defaults shared by every store and by the middleware.
const (
	// DefaultLease is the lease length a store grants when
	// [BeginOptions.Lease] is zero and the store has no default of its own
	// configured. The inbox ADR asks for 30 to 120 seconds.
	DefaultLease = 30 * time.Second

	// DefaultRetention is how long a processed key stays processed unless the
	// store is configured otherwise. The inbox ADR asks for 7 to 30 days.
	DefaultRetention = 7 * 24 * time.Hour

	// MaxKeyLen is the longest key, in bytes, that every store accepts.
	MaxKeyLen = 1024

	// MaxOwnerLen is the longest [BeginOptions.Owner], in bytes.
	MaxOwnerLen = 255

	// MaxLeaseIDLen is the longest lease id, in bytes.
	MaxLeaseIDLen = 128

	// MaxPayloadHashLen is the longest [BeginOptions.PayloadHash], in bytes.
	MaxPayloadHashLen = 128

	// MaxReasonLen is the longest [FailOptions.Reason], in bytes.
	MaxReasonLen = 1024
)

// Store is the minimal inbox contract of the ADR: ask before the handler, mark
// after it succeeded. It has no leases, so two consumers that receive the same
// message at once can both see "not processed" and both run the handler; use a
// [LeaseStore] to prevent that. Implementations must be safe for concurrent
// use.
type Store interface {
	// IsProcessed reports whether key was marked processed within the store's
	// retention.
	IsProcessed(ctx context.Context, key string) (bool, error)

	// MarkProcessed marks key processed for the store's retention. Marking a
	// processed key again succeeds. On a LeaseStore it marks the key whatever
	// lease is held on it.
	MarkProcessed(ctx context.Context, key string) error
}

// LeaseStore is the leased contract of the remote inbox protocol v1, which
// every store of this project implements. Its methods say what each does;
// together they give these guarantees, which the conformance suite
// (package github.com/watermill-inbox/inbox/stores/storetest) checks
// against every store this project ships:
//
//   - Mutual exclusion: while a lease is live exactly one TryBegin acquires
//     it. Others see Busy with ExpiresAt and RetryAfter (relative, so
//     callers never compare clocks).
//   - Fencing: an expired lease is free. The next TryBegin acquires the key
//     and [Record.Attempts] grows; the old holder's Complete, Release, Fail
//     and Extend then fail with [ErrLeaseLost], so a stalled consumer can
//     never mark a key that someone else owns.
//   - Idempotent calls: TryBegin repeated with the caller's own
//     [BeginOptions.LeaseID] returns Acquired again; Complete repeated with
//     the lease that completed the key succeeds again, so a lost reply never
//     turns into ErrLeaseLost.
//   - Retention: a processed key stays processed for the store's retention
//     (default [DefaultRetention], 7 days); a lease lasts its lease length
//     (default [DefaultLease], 30 s). Expiry is logical: every read compares
//     timestamps, so correctness never waits for a background deletion. A
//     record in flight keeps its history (attempts, first seen) after its
//     lease ends.
//   - One clock: lease deadlines come from the store's own clock where it
//     has one (Redis TIME, the SQL server's clock), so consumers with skewed
//     clocks agree. A store that cannot do this says so in its package
//     documentation.
//   - Opaque keys: a key is any valid UTF-8 string of 1 to [MaxKeyLen] bytes
//     without a NUL byte, compared byte for byte: "ABC", "abc" and "abc "
//     are three keys. The NUL byte is refused because several backends
//     cannot store it in a text column; the keying package maps ids holding
//     one to a hash, so such messages are still deduplicated.
//   - Bad input (empty or over-long key, zero or negative lease, empty lease
//     id) is an error that names the problem, wraps [ErrInvalidArgument] (and
//     the more precise [ErrInvalidKey], [ErrInvalidLease] or
//     [ErrInvalidLeaseID]), and changes nothing. A canceled context is an
//     error and changes nothing.
//
// Implementations must be safe for concurrent use.
type LeaseStore interface {
	Store

	// TryBegin claims key. It returns a [Claim] whose Status is:
	//   - [Acquired]: the caller holds a lease until Claim.ExpiresAt and must
	//     finish with Complete or Release (or let the lease expire);
	//   - [Busy]: another lease is live; Claim.ExpiresAt and Claim.RetryAfter
	//     say when it ends;
	//   - [Processed]: the key was completed within the retention;
	//   - [Dead]: a failed attempt marked the key dead ([LeaseStore.Fail]
	//     with Dead); Claim.Reason says why.
	// A TryBegin that carries the LeaseID of the live lease returns Acquired
	// again, which makes a retried call idempotent. Each acquisition of a new
	// lease increments [Record.Attempts]; Claim.Attempts returns the count.
	// A key whose failed attempt set a backoff ([FailOptions.RetryAfter])
	// answers Busy until the backoff ends.
	TryBegin(ctx context.Context, key string, opts BeginOptions) (Claim, error)

	// Complete marks key processed under leaseID. It fails with
	// [ErrLeaseLost] when leaseID no longer holds the key (it expired and
	// someone else acquired it, or it was released). Repeating Complete with
	// the lease that completed the key succeeds.
	Complete(ctx context.Context, key, leaseID string) error

	// Release gives the lease back without marking the key, so the next
	// TryBegin acquires it at once. It fails with [ErrLeaseLost] when leaseID
	// no longer holds the key.
	Release(ctx context.Context, key, leaseID string) error

	// Fail ends a failed attempt under leaseID and records opts.Reason:
	// the key is given back unmarked, acquirable again once
	// opts.RetryAfter has passed (until then TryBegin answers Busy with the
	// time left), or, with opts.Dead, marked [StateDead]: every TryBegin
	// then answers [Dead] until the retention ends or an operator forgets
	// the key ([Admin.Forget]). It fails with [ErrLeaseLost] when leaseID no
	// longer holds the key.
	Fail(ctx context.Context, key, leaseID string, opts FailOptions) error

	// Extend pushes the lease's deadline to lease from now (store clock) and
	// returns the new deadline. It leaves [Record.LastSeen] as it was. It fails with [ErrLeaseLost] when leaseID no
	// longer holds the key, and with [ErrNotSupported] on a store that cannot
	// extend leases.
	Extend(ctx context.Context, key, leaseID string, lease time.Duration) (time.Time, error)

	// Get returns what the store knows of key. A key the store does not know,
	// or whose record has expired, is a Record with State [StateNotFound] and a nil
	// error.
	Get(ctx context.Context, key string) (Record, error)
}

// BeginOptions are the optional parameters of [LeaseStore.TryBegin].
type BeginOptions struct {
	// Owner names the caller (host, process, consumer) for logs and
	// [Record.Owner]. Informational only: fencing is by lease id. At most
	// [MaxOwnerLen] bytes.
	Owner string

	// Lease is how long the lease lasts. Zero means the store's default
	// ([DefaultLease] unless configured); negative is [ErrInvalidLease]. A
	// store may clamp it to the range it supports: Claim.Lease is what was
	// granted.
	Lease time.Duration

	// LeaseID is the id the caller wants for the lease: retrying TryBegin with
	// the same LeaseID returns Acquired again instead of Busy. Empty means the
	// store picks one ([NewLeaseID]). At most [MaxLeaseIDLen] bytes.
	LeaseID string

	// PayloadHash is an opaque fingerprint of the message content (the
	// middleware uses hex SHA-256). The store records the first one it sees for
	// the key and reports a different one in [Claim.PayloadMismatch]. At most
	// [MaxPayloadHashLen] bytes.
	PayloadHash string

	// OrderKey puts the message in the order of the messages that share
	// it (an aggregate's id, a Kafka record's key): while an earlier
	// message of OrderKey has failed and is not processed yet (its
	// [LeaseStore.Fail] carried the same [FailOptions.OrderKey]), TryBegin
	// answers [Behind] and the store remembers the key's place among the
	// messages waiting behind it, so that they run one at a time, in the
	// order they first arrived. Empty: no order. At most [MaxKeyLen]
	// bytes of valid UTF-8 without NUL, like a key; a store that cannot
	// keep order (see [OrderAdmin]) fails with [ErrNotSupported].
	OrderKey string

	// Retry says the key was most likely claimed before: the message is a
	// copy handed back after a failed attempt (the middleware sets it for
	// a message carrying inboxmw.MetadataAttempts). It is a hint for the
	// store's way of claiming, never for its answer: the Redis store then
	// claims with its script at once instead of trying SET NX first, one
	// round trip instead of two; the other stores ignore it.
	Retry bool
}

// Status is the outcome of [LeaseStore.TryBegin].
type Status int

// The outcomes of TryBegin. The zero value is not a valid status, so a Claim
// that was never filled in cannot pass for one.
const (
	// Acquired: the caller holds the lease.
	Acquired Status = iota + 1
	// Processed: the key was completed within the retention; skip the message.
	Processed
	// Busy: another caller holds a live lease, or a failed attempt's
	// backoff has not ended.
	Busy
	// Dead: the key was marked dead by a failed attempt; the message is not
	// to be processed until an operator forgets the key.
	Dead
	// Behind: an earlier message of the claim's [BeginOptions.OrderKey]
	// failed and is not processed yet; the key waits its turn behind it
	// (Claim.RetryAfter hints when to try again). An extension of
	// protocol v1, as Dead is.
	Behind
)

var statusNames = [...]string{Acquired: "Acquired", Processed: "Processed", Busy: "Busy", Dead: "Dead", Behind: "Behind"}

// String returns the protocol v1 name of s ("Acquired", "Processed", "Busy",
// and "Dead" and "Behind", extensions of the protocol).
func (s Status) String() string {
	if s > 0 && int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// ParseStatus is the inverse of [Status.String]. An unknown name is an error
// wrapping [ErrInvalidArgument] that quotes it.
func ParseStatus(s string) (Status, error) {
	for i, n := range statusNames {
		if n != "" && n == s {
			return Status(i), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown status %q", ErrInvalidArgument, s)
}

// Claim is the result of [LeaseStore.TryBegin].
type Claim struct {
	// Status is the outcome.
	Status Status

	// LeaseID identifies the lease when Status is Acquired; pass it to
	// Complete, Release and Extend.
	LeaseID string

	// ExpiresAt is the lease's deadline on the store's clock, when Status is
	// Acquired or Busy. Do not compare it with the local clock: use Lease or
	// RetryAfter.
	ExpiresAt time.Time

	// Lease is the lease length granted, when Status is Acquired. It can differ
	// from BeginOptions.Lease when the store clamps leases.
	Lease time.Duration

	// RetryAfter is the time the live lease or the backoff has left, when
	// Status is Busy. With Behind, the time the backoff of the message the
	// key waits behind has left, zero when that is not known (the message
	// is running, or has not come back yet).
	RetryAfter time.Duration

	// BackingOff is true, with Busy, when no lease is live and the key is
	// waiting out the backoff of a failed attempt ([FailOptions.RetryAfter]),
	// false when another caller holds a live lease. A caller may then hand
	// the message to a delay its broker holds instead of waiting.
	BackingOff bool

	// Attempts is the key's count of acquired leases ([Record.Attempts])
	// after this call: with Acquired, this acquisition included.
	Attempts int

	// Reason is the reason the key was marked dead, when Status is Dead.
	Reason string

	// PayloadMismatch is true when TryBegin carried a PayloadHash and the key
	// already has a different one on record: the same key with other content.
	PayloadMismatch bool
}

// State is what [LeaseStore.Get] knows of a key.
type State int

// The states of a record.
const (
	// StateNotFound: the store has no live record of the key.
	StateNotFound State = iota
	// StateAvailable: the key was seen but is neither leased nor processed
	// (its lease was released or expired).
	StateAvailable
	// StateInProgress: a lease is live.
	StateInProgress
	// StateProcessed: the key was completed within the retention.
	StateProcessed
	// StateDead: a failed attempt marked the key dead ([FailOptions.Dead]).
	StateDead
)

var stateNames = [...]string{StateNotFound: "NotFound", StateAvailable: "Available", StateInProgress: "InProgress", StateProcessed: "Processed", StateDead: "Dead"}

// String returns the protocol v1 name of s ("NotFound", "Available",
// "InProgress", "Processed", and "Dead", an extension of the protocol).
func (s State) String() string {
	if s >= 0 && int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// ParseState is the inverse of [State.String]. An unknown name is an error
// wrapping [ErrInvalidArgument] that quotes it.
func ParseState(s string) (State, error) {
	for i, n := range stateNames {
		if n == s {
			return State(i), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown state %q", ErrInvalidArgument, s)
}

// Record is what a store knows of one key, as returned by [LeaseStore.Get].
// Times are on the store's clock.
type Record struct {
	State State

	// Attempts counts the leases acquired on the key.
	Attempts int

	// FirstSeen and LastSeen are the times of the first and the latest
	// TryBegin, Complete, Release, Fail or MarkProcessed that changed the
	// record, or of an [Admin.ForceRelease] (FirstSeen <= LastSeen). A
	// heartbeat ([LeaseStore.Extend]) is not one of them: while State is
	// StateInProgress, LastSeen is when the current lease was acquired (or
	// renewed by a TryBegin with its LeaseID), however often it was
	// extended since, so that a lease held for long by a handler that
	// hangs while its heartbeat runs shows its age ([ListOptions.OlderThan]);
	// LeaseUntil shows the heartbeat. Zero when State is StateNotFound.
	FirstSeen time.Time
	LastSeen  time.Time

	// LeaseUntil is the deadline of the current lease when State is
	// StateInProgress, else zero.
	LeaseUntil time.Time

	// Owner is BeginOptions.Owner of the latest acquisition.
	Owner string

	// PayloadHash is the first BeginOptions.PayloadHash seen for the key.
	PayloadHash string

	// RetryAt is the end of the backoff of the latest failed attempt
	// ([FailOptions.RetryAfter]) while it lasts (State is StateAvailable and
	// TryBegin answers Busy until then), else zero.
	RetryAt time.Time

	// Reason is the [FailOptions.Reason] of the latest failed attempt: why
	// the key is dead when State is StateDead. Empty when no attempt failed
	// with a reason.
	Reason string
}

// FailOptions are the parameters of [LeaseStore.Fail].
type FailOptions struct {
	// RetryAfter is how long the key stays unacquirable after the failed
	// attempt: TryBegin answers Busy with the time left. Zero gives it back
	// at once, as Release does; negative is [ErrInvalidArgument].
	RetryAfter time.Duration

	// Dead marks the key [StateDead] instead: TryBegin answers [Dead] until
	// the retention ends or the key is forgotten. RetryAfter is then
	// ignored.
	Dead bool

	// Reason says why the attempt failed (the handler's error, never a
	// payload), for [Record.Reason] and [Claim.Reason]. At most
	// [MaxReasonLen] bytes of valid UTF-8 without NUL; see [TruncateReason].
	Reason string

	// OrderKey is the [BeginOptions.OrderKey] of the failed attempt's
	// message: from this Fail on, the later messages of OrderKey wait
	// behind the key (TryBegin answers [Behind]) until it is processed. A
	// dead key keeps them waiting until an operator lets them go
	// ([OrderAdmin.ReleaseOrder]). Empty: no order.
	OrderKey string
}

// OrderAdmin is the side of a store that keeps the order of
// [BeginOptions.OrderKey]: whether it does, what an order key waits on,
// and letting it go.
type OrderAdmin interface {
	// KeepsOrder reports whether the store keeps order. When false,
	// TryBegin and Fail with an OrderKey, Order and ReleaseOrder fail with
	// [ErrNotSupported].
	KeepsOrder() bool

	// Order returns what the store holds for orderKey: the key at the
	// head (the failed message the others wait behind, or the next one to
	// run) and the keys waiting behind it, in their order. A key nothing
	// waits on is an [OrderGate] with Head "" and a nil error.
	Order(ctx context.Context, orderKey string) (OrderGate, error)

	// ReleaseOrder lets the messages of orderKey go past head, when head is
	// still at the head (a dead key, or a message that will never come
	// back): the next waiting key runs next. It fails with
	// [ErrLeaseLost] when head is no longer the head.
	ReleaseOrder(ctx context.Context, orderKey, head string) error
}

// OrderGate is what an [OrderAdmin] holds for one order key.
type OrderGate struct {
	// Head is the key the others wait behind: processed, it lets the
	// first of Waiting run.
	Head string
	// Waiting are the keys waiting behind Head, in the order their
	// messages first arrived.
	Waiting []string
}

// Admin is the operators' side of a store, used by cmd/inboxctl: it lists
// records and ends them by key, without holding a lease. Every store of
// this project implements it.
type Admin interface {
	// List returns one page of the records that opts selects, in key order
	// (byte for byte), after opts.Cursor: the first page holds the
	// smallest keys, and each page starts after the last key of the page
	// before, so that a listing holds each record once, in key order. A
	// page may hold fewer than opts.Limit records, even none, while
	// ListPage.Next is not empty (a store that reads records to filter
	// them may end a page at the last key it examined): keep calling with
	// Next until it is empty.
	List(ctx context.Context, opts ListOptions) (ListPage, error)

	// Forget deletes key's record, whatever its state, so that the next
	// delivery of the message runs the handler as if it were new: the
	// replay path for dead keys. Forgetting an unknown key succeeds.
	Forget(ctx context.Context, key string) error

	// ForceRelease ends the live lease or the backoff of key, whoever holds
	// it, so that the next TryBegin acquires it at once (the old holder's
	// Complete, Release and Extend then fail with ErrLeaseLost). A key that
	// has neither, or is processed or dead, is left as it is.
	ForceRelease(ctx context.Context, key string) error
}

// Defaults and bounds of [ListOptions.Limit].
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// ListOptions select the records of [Admin.List].
type ListOptions struct {
	// State keeps the records in this state; StateNotFound, the zero value,
	// keeps every state.
	State State

	// Prefix keeps the keys that start with it (byte for byte).
	Prefix string

	// OlderThan keeps the records whose LastSeen is at least this long ago
	// on the store's clock: with State StateInProgress, the leases acquired
	// at least this long ago, however often their heartbeat extended them
	// (a stuck handler); with StateDead, old dead keys. Zero keeps every
	// age.
	OlderThan time.Duration

	// Limit bounds the records of a page: zero means [DefaultListLimit],
	// at most [MaxListLimit].
	Limit int

	// Cursor continues a listing: the Next of the previous page, "" to
	// start.
	Cursor string
}

// ListPage is one page of [Admin.List].
type ListPage struct {
	// Items are the records of the page, ordered by key.
	Items []ListItem
	// Next is the cursor of the next page, "" when the listing is done.
	Next string
}

// ListItem is one record of a [ListPage].
type ListItem struct {
	Key string
	Record
}
