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
// The key {bus}:{group}:{alias}:{idKey} comes from package keying. With an
// [inbox.LeaseStore] (every store of this project) the key is claimed with
// a lease: a processed key is acked without the handler; a busy key is
// waited on, then returned as an [inbox.BusyError] for the broker to
// redeliver; an acquired key runs the handler while a heartbeat renews the
// lease, whose loss cancels the handler's context. A failed handler
// releases the lease before the middleware returns; a successful one keeps
// it until the router acks (Complete) or nacks (Release). Store errors fail
// closed after in-process retries, or open with Config.FailOpen. A plain
// [inbox.Store] gets the ADR's check-then-mark flow, a [TxStore] runs the
// handler in the transaction that commits its mark. middleware.go reads
// top to bottom as that path; Config documents every knob.
//
// The guarantee: at most one consumer runs a key's handler at a time, and a
// key marked processed is never run again within the store's retention. A
// crash after the handler's effect but before the mark leaves the effect to
// be applied again by the next delivery; only the transactional mode closes
// that window.
//
// Among Watermill's middlewares: Recoverer and Retry go inside it (added
// after it); InstantAck, if used, outside. A PoisonQueue goes outside it,
// and only as wmw.PoisonQueueWithFilter with [IsTransient] as the filter:
// otherwise messages that were merely waiting for another consumer or for
// the store would be poisoned and acked, losing their only copy.
//
// Errors wrap [inbox.ErrBusy], [inbox.ErrStoreUnavailable], [inbox.ErrNoKey],
// [inbox.ErrPayloadMismatch] or [inbox.ErrClosed]; handler errors are
// returned unchanged. Logs go through [watermill.LoggerAdapter] with
// snake_case fields (message_uuid, handler_name, inbox_key) and never hold
// payloads; a store outage logs its first failure, then at most one line
// every 10 s, and its recovery. [Metrics] counts outcomes, times store
// calls and in-process waits; package inboxmetrics implements it with
// Prometheus.
package inboxmw
