// Package inbox defines the store contract of watermill-inbox: consumer-side
// idempotency for Watermill routers.
//
// A message may reach a consumer more than once: the broker redelivers after a
// nack or a crash, a producer retries a publish, a consumer group rebalances.
// The inbox keeps, per message key, a record of whether the message was
// processed, so that the handler's effect is applied once. The router
// middleware in package [github.com/watermill-inbox/inbox/middleware] computes
// the key (see package [github.com/watermill-inbox/inbox/keying]) and drives a
// store through the flow below; stores live under
// [github.com/watermill-inbox/inbox/stores].
//
// # Two levels of contract
//
// [Store] is the minimal contract of the inbox ADR: [Store.IsProcessed] before
// the handler, [Store.MarkProcessed] after it succeeded. Anyone can implement it
// over anything, but two consumers that receive the same message at the same
// time can both run the handler: the check and the mark are separate steps.
//
// [LeaseStore] adds leases, the semantics of the remote inbox protocol v1, and
// is what every store of this project implements. [LeaseStore.TryBegin] is an
// atomic claim: while a lease is live, exactly one of any number of concurrent
// callers gets [Acquired]; the others get [Busy] with the lease's deadline and
// the time left, or [Processed] once the key was completed. The holder finishes
// with [LeaseStore.Complete] (mark processed) or [LeaseStore.Release] (give the
// key back without marking), and keeps a long handler's lease alive with
// [LeaseStore.Extend].
//
// # Guarantees every LeaseStore gives
//
// The conformance suite in [github.com/watermill-inbox/inbox/stores/storetest]
// checks each of these against every store this project ships:
//
//   - Mutual exclusion: while a lease is live exactly one TryBegin acquires it.
//     Others see Busy with ExpiresAt and RetryAfter (relative, so callers never
//     compare clocks).
//   - Fencing: an expired lease is free. The next TryBegin acquires the key and
//     [Record.Attempts] grows; the old holder's Complete, Release and Extend then
//     fail with [ErrLeaseLost], so a stalled consumer can never mark a key that
//     someone else owns.
//   - Idempotent calls: TryBegin repeated with the caller's own
//     [BeginOptions.LeaseID] returns Acquired again; Complete repeated with the
//     lease that completed the key succeeds again, so a lost reply never turns
//     into ErrLeaseLost.
//   - Retention: a processed key stays processed for the store's retention
//     (default [DefaultRetention], 7 days); a lease lasts its lease length
//     (default [DefaultLease], 30 s). Expiry is logical: every read compares
//     timestamps, so correctness never waits for a background deletion. A record
//     in flight keeps its history (attempts, first seen) after its lease ends.
//   - One clock: lease deadlines come from the store's own clock where it has
//     one (Redis TIME, the SQL server's clock), so consumers with skewed clocks
//     agree. A store that cannot do this says so in its package documentation.
//   - Opaque keys: a key is any valid UTF-8 string of 1 to [MaxKeyLen] bytes
//     without a NUL byte, compared byte for byte: "ABC", "abc" and "abc " are
//     three keys. The NUL byte is refused because several backends cannot
//     store it in a text column; the keying package maps ids holding one to a
//     hash, so such messages are still deduplicated.
//   - Bad input (empty or over-long key, zero or negative lease, empty lease id)
//     is an error that names the problem, wraps [ErrInvalidArgument] (and the
//     more precise [ErrInvalidKey], [ErrInvalidLease] or [ErrInvalidLeaseID]),
//     and changes nothing. A canceled context is an error and changes nothing.
//
// # What the library guarantees end to end
//
// At most one consumer runs a key's handler at a time, and a key marked
// processed is never run again within the retention. A consumer that crashes
// after the handler's side effect but before the mark leaves that effect to be
// applied again by the next delivery; only the SQL store's transactional mode,
// where the mark commits with the handler's own writes, closes that window.
//
// This package holds only the contract and uses the standard library alone.
package inbox
