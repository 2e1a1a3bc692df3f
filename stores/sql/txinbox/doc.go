// Package txinbox is the SQL transactional mode of the inbox: the claim of a
// message's key, the handler's writes and the key's mark run in one database
// transaction, so they commit together or not at all.
//
// It is a store, an [inboxmw.TxStore], that the inbox middleware
// (package github.com/watermill-inbox/inbox/middleware) drives with its usual
// flow: keys, missing keys, outcomes, logs and metrics are configured there.
//
//	txs, err := txinbox.New(txinbox.Config{DB: db, Dialect: sqlstore.Postgres, Outbox: outbox})
//	if err != nil { ... }
//	ib, err := inboxmw.New(inboxmw.Config{Store: txs, Bus: "rabbit", Group: "billing"})
//	if err != nil { ... }
//	router.AddMiddleware(ib.Middleware)
//
// and in the handler:
//
//	tx, ok := txinbox.TxFromContext(msg.Context())
//	_, err := tx.ExecContext(msg.Context(), "UPDATE accounts SET ...", ...)
//
// The inbox table is the SQL store's (package
// github.com/watermill-inbox/inbox/stores/sql): create it with sqlstore.DDL,
// sqlstore.Store.Migrate or sqlstore.Options.AutoMigrate. The program
// imports the dialect's package, as for the SQL store
// (github.com/watermill-inbox/inbox/stores/sql/postgres, .../mysql or
// .../sqlite), which links its database/sql driver; [New] refuses a dialect
// whose package is not linked. [New] does no I/O.
//
// # What happens to a message
//
// [Store.BeginTx] takes a pooled connection, begins a transaction bound to
// the message's context and inserts the key's row, already marked processed
// (INSERT ... ON CONFLICT DO NOTHING; INSERT IGNORE on MySQL and MariaDB).
// The handler runs with the transaction in its message context
// ([TxFromContext]) and writes through it. A successful handler commits its
// writes, the messages it returned (see the outbox, below) and the mark at
// once; a failing or panicking one rolls all of them back, and the broker
// redelivers. A key whose mark committed is a duplicate: the middleware
// acks it without running the handler, for [Config.Retention] (7 days by
// default).
//
// # The guarantee
//
// Effects that are writes to the same database through the transaction are
// applied exactly once per key within the retention. A process that dies
// after the handler's writes but before the commit leaves neither the
// writes nor the mark: the database rolls the transaction back when it sees
// the connection gone, and the redelivery applies the effect once. Effects
// outside the database (an HTTP call, a file) get what the leased stores
// give: they may be repeated when the commit does not happen.
//
// # Concurrent deliveries and lock timeouts
//
// A concurrent delivery of the same key blocks on the uncommitted row: it
// sees the key processed when the first transaction commits, claims the key
// when it rolls back, and after [Config.LockTimeout] (default 10 s) fails
// with an error wrapping [inbox.ErrBusy], so the broker redelivers later.
// There is no lease, no heartbeat and no Extend in this mode: the
// middleware's Lease and HeartbeatInterval do not apply, nor does its
// StoreTimeout ([Store.BeginTx] runs under the message's context, as the
// transaction lives on in the handler, and the commit takes no context).
// Its MaxBusyWait does not bound the wait on a concurrent claim (the lock
// timeout does), only the retries of a BeginTx that fails (the database
// down): they are paced, for at most MaxBusyWait, then the message is
// nacked with an error wrapping [inbox.ErrStoreUnavailable]. Its FailOpen,
// PayloadHash and MaxAttempts are refused (the handler needs the
// transaction; the claim records no fingerprint and counts no attempts).
// The lock timeout per database:
//
//   - PostgreSQL: the transaction's lock_timeout (set_config, local to the
//     transaction). It also bounds the lock waits of the handler's own
//     statements, which fail with SQLSTATE 55P03 when it passes.
//   - MySQL and MariaDB: innodb_lock_wait_timeout, in whole seconds rounded
//     up, set on the transaction's connection before it begins and reset to
//     the server's default when the connection goes back to the pool (a
//     connection whose reset fails is discarded). It also bounds the
//     handler's row lock waits. InnoDB deadlocks between waiting duplicates
//     are retried before the handler runs.
//   - SQLite: the wait for the pool's one connection (below).
//
// Each message in flight holds one pooled connection from its claim to its
// commit: size the pool (db.SetMaxOpenConns) for the router's concurrency,
// or the claims wait for connections, on every database for at most
// [Config.LockTimeout]; then BeginTx fails with an error wrapping
// [inbox.ErrStoreUnavailable] ([inbox.ErrBusy] on SQLite, whose one
// connection is its writer).
//
// # SQLite
//
// SQLite has one writer at a time. Open the database with a busy timeout
// (sqlitedialect.DSN, package stores/sql/sqlite, does) and limit the pool
// to one connection (db.SetMaxOpenConns(1)): messages then take turns on that connection, a
// delivery waiting for it for at most [Config.LockTimeout] before failing
// with [inbox.ErrBusy]. The handler must not use the *sql.DB outside the
// transaction: its one connection is the transaction's, so such a call waits
// forever, or until the message's context ends.
//
// # Returned messages: the outbox
//
// Messages the handler returns would be published by the router after the
// commit; if that publish failed, the redelivered message would be a
// duplicate, acked without running the handler, and the messages would be
// lost. So they are never handed to the router: with [Config.Outbox] they are
// stored in the same transaction (for example with Watermill's SQL publisher
// built on the transaction, relayed to the broker by a forwarder; see
// [OutboxFunc]), and without one the transaction rolls back and the
// middleware returns an error wrapping [ErrMessagesReturned], on the first
// message, so the mistake shows at once. The messages reach the outbox with
// the ids the middleware derives from the input's key (inboxmw.OutputID,
// unless inboxmw.Config.KeepOutputIDs): a forwarder that relays one twice
// (a crash between its publish and its ack) sends the same id twice, which
// the next stage's inbox drops.
//
// # Messages without a key
//
// Under the middleware's MissingKeyProcess (its default) a message for which
// no id source yields an id still runs in a transaction of its own, without
// a claim or a mark, so [TxFromContext] works; its writes commit when the
// handler succeeds, on every delivery. MissingKeyReject refuses it without a
// transaction.
//
// # Cleanup
//
// Expired rows are deleted by default, as the SQL store deletes them: the
// store's first call starts a janitor (the SQL store's, on the same table)
// that deletes them in batches every [Config.CleanupInterval] (a tenth of
// the retention, at most an hour) until [Store.Close]; [Store.CleanupStats]
// says what it deleted and what was left. [Config.DisableCleanup] turns it
// off, in so many words. On SQLite the janitor's statements take the
// pool's one connection between transactions.
//
// # Sharing a table with the lease store
//
// The transactional mode may use the table of a lease store
// (sqlstore.Store) but should not serve its keys: a key leased by the store
// is busy for this mode until the lease ends (the error carries the lease's
// RetryAfter), and a key this mode marked is processed for the store.
// [Store.IsProcessed] and [Store.MarkProcessed] are the SQL store's on the
// same table.
package txinbox
