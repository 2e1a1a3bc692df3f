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
// [LeaseStore] states the guarantees that every store gives; the
// conformance suite in [github.com/watermill-inbox/inbox/stores/storetest]
// checks each of them against every store this project ships, and each
// store's package says what is its own (its URL, its layout, where it was
// verified).
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
