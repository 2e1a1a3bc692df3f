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
// Each message's key {bus}:{group}:{alias}:{idKey} (package keying) is
// claimed with a lease: a processed key is acked without the handler; a busy
// one is waited on, then returned as an [inbox.BusyError] for the broker to
// redeliver; an acquired one runs the handler while a heartbeat renews the
// lease, whose loss cancels the handler's context. A failed handler gives
// the key back before the middleware returns, with a backoff the store
// holds. A successful one keeps the key until the router acks (the mark)
// or nacks (a release: its messages failed to publish, or a middleware
// outside the inbox turned the success into an error, and it must run
// again). The inbox starts no goroutine per message: one keeper per Inbox
// renews the leases of the handlers running and watches the router's
// verdicts, and the marks go to the store's batching or its fixed set of
// workers without waiting (keeper.go, through the store's Go method). The
// layers below may start their own per call: database/sql a goroutine per
// transaction and query, the remote store's HTTP client a timer per
// attempt, the MongoDB store a timer per claim (docs/middleware.md has the
// figures). A store of your own, or a wrapper that hides Go (a struct
// embedding inbox.LeaseStore around one of ours), has its marks and
// heartbeats made by a fixed set of the Inbox's own workers, one call each
// at a time; embed the store's own type to keep Go. With
// Config.Redelivery, a failed attempt's message waits out its backoff in
// the broker (a RabbitMQ delay queue, a Kafka retry topic) instead of in
// the consumer: the middleware hands a copy to the broker and acks the
// original (redeliver.go). Config documents every choice; middleware.go
// reads top to bottom as the path of a message.
//
// The guarantee: at most one consumer runs a key's handler at a time, and a
// key marked processed is never run again within the store's retention. A
// crash after the handler's effect but before the mark leaves the effect to
// be applied again by the next delivery; only the transactional mode
// ([TxStore]) closes that window.
//
// Across a pipeline: each message the handler returns without an
// IdempotencyKey gets one, and a UUID, derived from the input's key and its
// position ([OutputID]; Config.KeepOutputIDs opts out), so a handler that
// runs again returns messages the next stage's inbox drops; [DerivedKey]
// derives ids for what the handler sends itself. With Config.Timestamp, a
// message older than the store's retention, whose key may have expired, is
// logged and counted as stale, or refused ([StalePolicy]).
//
// Among Watermill's middlewares: Recoverer and Retry go inside it (added
// after it), InstantAck outside. A PoisonQueue goes outside it, and only
// with [IsTransient] as its filter (see there).
//
// Errors wrap [inbox.ErrBusy], [inbox.ErrStoreUnavailable], [inbox.ErrNoKey],
// [inbox.ErrPayloadMismatch], [inbox.ErrDead], [inbox.ErrAttemptFailed],
// [inbox.ErrStale] or [inbox.ErrClosed]; without Config.MaxAttempts a handler's error is returned
// as it is. Logs use snake_case fields
// (message_uuid, handler_name, inbox_key) and never hold payloads; a store
// outage logs its first failure, then at most one line every 10 s, and its
// recovery.
//
// docs/middleware.md follows one message through the middleware, and lists
// which bound limits which wait.
package inboxmw
