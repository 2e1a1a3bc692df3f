// Package inboxmw (import path .../inbox/middleware) is the inbox's Watermill router middleware: it makes a
// handler's effect apply once per message key, however often the broker or
// the producer delivers the message.
//
//	ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "rabbit", Group: "billing"})
//	if err != nil { ... }
//	router.AddMiddleware(ib.Middleware)
//	...
//	<-routerStopped
//	ib.Close(ctx) // drains the marks still pending
//
// # The flow, for an inbox.LeaseStore
//
//  1. The key {bus}:{group}:{alias}:{idKey} is built by package keying: the
//     id from the IdempotencyKey metadata field, else the message UUID (both
//     configurable); the alias is the handler's name unless configured.
//  2. TryBegin claims the key with a lease (Config.Lease, default 30 s).
//     - Processed: the handler is not called; the message is acked as a
//     duplicate.
//     - Busy: another consumer holds the lease. The middleware polls (20 ms
//     growing to 1 s, jittered), honouring the message context, for at most
//     the time that lease has left plus a little and at most
//     Config.MaxBusyWait (10 s). It ends as Processed (acked as a duplicate)
//     or acquires the key; else it returns an [inbox.BusyError] (ErrBusy) and
//     the message is nacked, for the broker to redeliver later.
//     - Acquired: the handler runs under a context that a heartbeat keeps
//     alive: the lease is extended every Config.HeartbeatInterval (Lease/3).
//     If the lease is lost (another consumer took it over) or cannot be
//     renewed before its deadline, measured on the local monotonic clock,
//     the handler's context is canceled with a cause wrapping
//     [inbox.ErrLeaseLost] (see [context.Cause]). It carries the message
//     context's values and deadline, and ends with it: a deadline (a timeout
//     set outside the middleware) at once, with context.DeadlineExceeded; a
//     cancellation (a subscriber closing) with the message context's cause,
//     within 10 ms of the handler's start, or at once if the message context
//     was done before. A handler context registers with the message's only
//     once the handler has run 10 ms, which spares that work for the many
//     handlers that end sooner.
//  3. After the handler:
//     - It returned an error or panicked: the lease is released before the
//     middleware returns (Kafka's subscriber redelivers in-process at
//     once), then the error is returned or the panic re-raised. Retries stay
//     the broker's job.
//     - It succeeded: the router still publishes the messages the handler
//     returned, then acks. The lease is kept (and renewed) through that: the
//     key is completed when the router acks, released when it nacks (a failed
//     publish), so produced messages are never lost. These store calls use a
//     context detached from the message's, since subscribers cancel it at ack.
//     A message acked before the handler ran ([wmw.InstantAck]) is completed
//     right away. On a store whose calls never block (the memory store; see
//     [inbox.BoundedCalls]) the mark is made on the goroutine of the next
//     message the middleware handles, or by a timer within 10 ms
//     when none comes, rather than by a goroutine waiting for each ack.
//     - A Complete that fails after a successful handler never nacks the
//     message (that would run the handler again): it is retried in the
//     background until the lease ends, then logged and counted
//     (complete_failed).
//  4. Store errors fail closed: the message is nacked and redelivered, never
//     lost, never run without a claim. Config.FailOpen runs it without
//     deduplication instead, and says so in logs and metrics (fail_open).
//  5. With Config.PayloadHash, the SHA-256 of the payload travels with the
//     claim: a known key arriving with different content is logged and
//     counted, or refused with [inbox.ErrPayloadMismatch].
//  6. A message with no id is never dropped in silence: by default it is
//     processed without deduplication, logged and counted (no_key);
//     MissingKeyReject returns [inbox.ErrNoKey] instead, for a poison queue.
//
// With a plain [inbox.Store] (no leases) the ADR's flow applies: IsProcessed,
// then skip or run, then MarkProcessed once the router acks. Two concurrent
// deliveries of one message can then both run the handler: use a LeaseStore
// (every store of this project is one) to prevent that.
//
// # The guarantee
//
// At most one consumer runs a key's handler at a time, and a key marked
// processed is never run again within the store's retention. A consumer that
// crashes after the handler's side effect but before the mark leaves that
// effect to be applied again by the next delivery (after the lease expires);
// only the SQL store's transactional mode, where the mark commits with the
// handler's own writes, closes that window.
//
// # Where it goes among Watermill's middlewares
//
//   - Recoverer and Retry go inside it (added after it): a panic becomes an
//     error that releases the lease, and in-process retries run while the
//     lease is held, so no other consumer starts the same message meanwhile.
//     Keep Retry's total time well under the lease, or rely on the heartbeat.
//   - InstantAck, if used, goes outside it; the middleware detects the early
//     ack and completes the key right away.
//   - A PoisonQueue goes outside it, and only as
//     [wmw.PoisonQueueWithFilter] with a filter that excludes
//     [inbox.ErrBusy] and [inbox.ErrStoreUnavailable] ([IsTransient] is that
//     filter): otherwise messages that were merely waiting for another
//     consumer or for the store would be poisoned and acked, losing their
//     only copy.
//
// # Errors
//
// The middleware returns errors wrapping [inbox.ErrBusy],
// [inbox.ErrStoreUnavailable], [inbox.ErrNoKey], [inbox.ErrPayloadMismatch] and
// [inbox.ErrClosed], so they can be routed with errors.Is; handler errors are
// returned unchanged.
//
// # Logs and metrics
//
// Logs go through [watermill.LoggerAdapter] with snake_case fields
// (message_uuid, handler_name, inbox_key); they never hold payloads.
// Duplicates and releases log at debug, busy keys and background retries at
// info, store failures, lost leases and fail-open processing at error.
// [Metrics] counts every [Outcome] per handler and times every store call;
// package [github.com/watermill-inbox/inbox/metrics] implements it with
// Prometheus.
//
// [wmw.InstantAck]: https://pkg.go.dev/github.com/ThreeDotsLabs/watermill/message/router/middleware#InstantAck
// [wmw.PoisonQueueWithFilter]: https://pkg.go.dev/github.com/ThreeDotsLabs/watermill/message/router/middleware#PoisonQueueWithFilter
package inboxmw
