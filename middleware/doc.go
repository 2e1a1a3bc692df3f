// Package inboxmw (import path .../inbox/middleware) is the inbox's
// Watermill router middleware: it makes a handler's effect apply once per
// message key, however often the broker or the producer delivers the
// message. Its name does not collide with Watermill's middleware package.
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
// middleware.go holds the path of one message, top to bottom. The key
// {bus}:{group}:{alias}:{idKey} is built by package keying, then, for an
// [inbox.LeaseStore] (every store of this project), TryBegin claims it with
// a lease:
//
//   - Processed: the message is acked without the handler.
//   - Busy: the middleware polls for at most the time the other lease has
//     left and at most Config.MaxBusyWait, then returns an
//     [inbox.BusyError] for the broker to redeliver.
//   - Acquired: the handler runs under a context derived from the
//     message's, while one goroutine per lease renews the lease every
//     Config.HeartbeatInterval. A lease lost, or not renewed before its
//     deadline on the local monotonic clock, cancels that context with a
//     cause wrapping [inbox.ErrLeaseLost]. A handler error, panic or
//     runtime.Goexit releases the lease before the middleware returns (Kafka
//     redelivers in-process at once). After a success the lease is kept
//     until the router's verdict: completed on ack, released on nack (a
//     failed publish), so produced messages are never lost. A failed
//     Complete never nacks the message: it is retried until the lease ends.
//
// Store errors fail closed: the claim is retried in-process with backoff
// for at most MaxBusyWait, then the message is nacked, never lost and never
// run without a claim; Config.FailOpen runs it without deduplication
// instead. A message without an id is processed without deduplication and
// counted (no_key), or refused with [inbox.ErrNoKey]. With a plain
// [inbox.Store] the ADR's flow applies (IsProcessed, run, MarkProcessed on
// ack), under which two concurrent deliveries can both run the handler;
// with a [TxStore] the claim, the handler and the mark are one database
// transaction.
//
// The guarantee: at most one consumer runs a key's handler at a time, and a
// key marked processed is never run again within the store's retention. A
// crash after the handler's effect but before the mark leaves the effect to
// be applied again by the next delivery; only the transactional mode closes
// that window.
//
// # Among Watermill's middlewares
//
// Recoverer and Retry go inside it (added after it); InstantAck, if used,
// outside. A PoisonQueue goes outside it, and only as
// wmw.PoisonQueueWithFilter with [IsTransient] as the filter: otherwise
// messages that were merely waiting for another consumer or for the store
// would be poisoned and acked, losing their only copy.
//
// # Errors, logs and metrics
//
// Errors wrap [inbox.ErrBusy], [inbox.ErrStoreUnavailable], [inbox.ErrNoKey],
// [inbox.ErrPayloadMismatch] or [inbox.ErrClosed]; handler errors are
// returned unchanged. Logs go through [watermill.LoggerAdapter] with
// snake_case fields (message_uuid, handler_name, inbox_key) and never hold
// payloads; a store outage logs its first failure with the cause, then at
// most one line every 10 s with a count, and its recovery. [Metrics] counts
// every [Outcome], times store calls and in-process waits; package
// inboxmetrics (inbox/metrics) implements it with Prometheus.
package inboxmw
