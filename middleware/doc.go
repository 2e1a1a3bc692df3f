// Package inboxmw (import path .../inbox/middleware) is the inbox's
// Watermill router middleware: it makes a handler's effect apply once per
// message key, however often the broker or the producer delivers the
// message. Its name does not collide with Watermill's own middleware
// package, which a router's code imports too.
//
//	ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "rabbit", Group: "billing"})
//	if err != nil { ... }
//	router.AddMiddleware(ib.Middleware)
//	...
//	<-routerStopped
//	ib.Close(ctx) // drains the marks still pending
//
// # The flow
//
// middleware.go holds the path of one message, top to bottom. For an
// [inbox.LeaseStore] (every store of this project):
//
//  1. The key {bus}:{group}:{alias}:{idKey} is built by package keying (the
//     id from the IdempotencyKey metadata field, else the message UUID; the
//     alias is the handler's name), and TryBegin claims it with a lease
//     (Config.Lease, 30 s).
//  2. Processed: the message is acked without the handler. Busy: the
//     middleware polls (20 ms growing to 1 s, jittered) for at most the time
//     the other lease has left plus a little and at most Config.MaxBusyWait
//     (10 s), then returns an [inbox.BusyError] for the broker to redeliver.
//     Acquired: the handler runs under a context derived from the message's,
//     while one goroutine per lease renews the lease every
//     Config.HeartbeatInterval (Lease/3); a lease lost, or not renewed
//     before its deadline on the local monotonic clock, cancels that
//     context with a cause wrapping [inbox.ErrLeaseLost].
//  3. A handler error, panic or runtime.Goexit releases the lease before the
//     middleware returns (Kafka's subscriber redelivers in-process at once).
//     After a success the lease is kept until the router's verdict: the key
//     is completed on ack and released on nack (a failed publish), with
//     store calls detached from the message context and bounded by
//     Config.StoreTimeout; a message acked before the handler
//     ([wmw.InstantAck]) is completed at once. A failed Complete never nacks
//     the message: it is retried in the background until the lease ends.
//  4. Store errors fail closed (the message is nacked, never lost, never run
//     without a claim) unless Config.FailOpen. Config.PayloadHash sends the
//     payload's SHA-256 with the claim to detect a key reused for other
//     content. A message without an id is processed without deduplication
//     and counted (no_key), or refused with [inbox.ErrNoKey].
//
// With a plain [inbox.Store] (no leases) the ADR's flow applies: IsProcessed,
// then skip or run, then MarkProcessed once the router acks, retried as a
// Complete is; two concurrent deliveries of one message can then both run
// the handler. With a [TxStore] (the SQL transactional mode) the claim, the
// handler and the mark are one database transaction.
//
// # The guarantee
//
// At most one consumer runs a key's handler at a time, and a key marked
// processed is never run again within the store's retention. A consumer that
// crashes after the handler's side effect but before the mark leaves that
// effect to be applied again by the next delivery (after the lease expires);
// only the transactional mode, where the mark commits with the handler's own
// writes, closes that window.
//
// # Where it goes among Watermill's middlewares
//
//   - Recoverer and Retry go inside it (added after it): a panic becomes an
//     error that releases the lease, and in-process retries run while the
//     lease is held. Keep Retry's total time well under the lease, or rely
//     on the heartbeat.
//   - InstantAck, if used, goes outside it.
//   - A PoisonQueue goes outside it, and only as [wmw.PoisonQueueWithFilter]
//     with a filter that excludes [inbox.ErrBusy] and
//     [inbox.ErrStoreUnavailable] ([IsTransient] is that filter): otherwise
//     messages that were merely waiting would be poisoned and acked, losing
//     their only copy.
//
// # Errors, logs and metrics
//
// The middleware returns errors wrapping [inbox.ErrBusy],
// [inbox.ErrStoreUnavailable], [inbox.ErrNoKey], [inbox.ErrPayloadMismatch] and
// [inbox.ErrClosed]; handler errors are returned unchanged. Logs go through
// [watermill.LoggerAdapter] with snake_case fields (message_uuid,
// handler_name, inbox_key) and never hold payloads: duplicates and releases
// at debug, busy keys and background retries at info, store failures, lost
// leases and fail-open processing at error. [Metrics] counts every [Outcome]
// per handler and times every store call; package inboxmetrics
// (inbox/metrics) implements it with Prometheus.
//
// [wmw.InstantAck]: https://pkg.go.dev/github.com/ThreeDotsLabs/watermill/message/router/middleware#InstantAck
// [wmw.PoisonQueueWithFilter]: https://pkg.go.dev/github.com/ThreeDotsLabs/watermill/message/router/middleware#PoisonQueueWithFilter
package inboxmw
