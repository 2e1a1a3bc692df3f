// Package sqlstore is the [inbox.LeaseStore] on database/sql, with one
// dialect per database: PostgreSQL ([Postgres], through
// github.com/jackc/pgx/v5/stdlib), MySQL 8 and MariaDB ([MySQL], through
// github.com/go-sql-driver/mysql) and SQLite ([SQLite], through
// modernc.org/sqlite, pure Go: the embedded store that needs no server). Its
// table also serves the transactional mode (package
// github.com/watermill-inbox/inbox/stores/sql/txinbox), where the mark
// commits with the handler's own writes.
//
//	db, _ := sql.Open("pgx", "postgres://app@db:5432/app")
//	store, err := sqlstore.New(ctx, db, sqlstore.Options{Dialect: sqlstore.Postgres, AutoMigrate: true})
//
// or by URL through [github.com/watermill-inbox/inbox/stores]:
//
//	postgres://user:password@host:5432/db?sslmode=disable&table=inbox&migrate=true
//	mysql://user:password@host:3306/db?table=inbox&tls=true
//	sqlite:///var/lib/app/inbox.db   sqlite://relative/inbox.db   sqlite:relative.db   sqlite::memory:
//
// Parameters of every SQL URL: retention and lease (shared by all stores),
// table (default "inbox"), migrate (true creates the table; default false),
// cleanup_interval (starts the janitor), cleanup_batch, max_conns (pool
// size), and check (shared by all stores: false opens without the checks
// below). Durations take Go's units and a leading count of days
// (retention=7d, 1d12h). stores.Open checks the store before returning it:
// it connects, authenticates, and reads one key through the store's own
// statement, so a wrong password, a missing database or a missing table
// (without migrate=true) fails there, once, with an error wrapping
// stores.ErrMisconfigured that says how to fix it; [New], which takes the
// caller's *sql.DB, checks nothing beyond what AutoMigrate and the MySQL
// version query do. postgres:// also takes libpq's connection parameters (sslmode,
// connect_timeout, application_name, search_path, ...); mysql:// takes
// go-sql-driver's (tls, timeout, readTimeout, writeTimeout, charset,
// collation, interpolateParams, ...), always with parseTime=true and
// clientFoundRows=true, and with interpolateParams=true unless set (one round
// trip per statement instead of three); sqlite:// takes busy_timeout
// (default 5s). Any other parameter is an error that names it. Errors never
// quote a password. A sqlite::memory: store lives in one connection and is
// lost on Close; a file store opened by URL uses one connection (SQLite has
// one writer; the pool is a cheaper queue than SQLite's busy loop), WAL, and
// immediate transactions.
//
// # Schema
//
// One table per store, named by [Options.Table] and checked by
// [ValidateTable] (identifiers only: the name cannot inject SQL). A row per
// key: msg_key (primary key, compared byte for byte: TEXT COLLATE "C" on
// PostgreSQL, VARBINARY(1024) on MySQL and MariaDB, whose default collations
// fold case and trailing spaces, TEXT with SQLite's binary collation),
// state (0 open, 1 processed, 2 dead), lease_id, owner, lease_until (the
// end of the lease, or with an empty lease_id of a failed attempt's
// backoff: see below), attempts, first_seen, last_seen, processed_at,
// payload_hash, expires_at (when the row may be deleted) and reason (the
// latest failed attempt's [inbox.FailOptions.Reason], empty when none),
// with an index on expires_at for cleanup. Times keep microseconds on
// PostgreSQL (timestamptz) and MySQL (DATETIME(6), UTC), milliseconds on
// SQLite (integer microseconds from SQLite's millisecond clock).
//
// [Store.Migrate] creates the table when it does not exist (idempotent, safe
// from several processes at once); [Options.AutoMigrate] runs it in [New].
// [DDL] gives the same statements to users who run their own migrations. A
// store whose table is missing fails with [inbox.ErrStoreUnavailable] and an
// error that says to migrate. A table made by an earlier version of the store
// lacks reason: stores.Open reports it as such (wrapping
// stores.ErrMisconfigured, with the fix), and Migrate (migrate=true,
// inboxctl migrate) adds the column, whose default describes every row of
// such a table; DDL ends with the ALTER TABLE statement that does the same,
// as a comment. Migrate alters no table otherwise.
//
// # Statements and clocks
//
// Every statement the store sends, per dialect and for the default table,
// is in testdata/postgres.sql, testdata/mysql.sql and testdata/sqlite.sql
// in this package's directory, each named, with when it is sent and its
// parameters (golden files that the package's tests hold to the code).
//
// A claim is an upsert whose SET col = CASE ... arms decide in the
// statement, under the row lock, whether the record expired (start afresh),
// is free (open, its lease or backoff ended or released: acquire,
// Attempts+1), is held by the caller's own lease id (renew) or is
// processed, dead, held by another lease or in a backoff (unchanged); the
// row it returns (state, lease, attempts, reason) makes the answer: INSERT
// ... ON CONFLICT DO UPDATE ...
// RETURNING on PostgreSQL and SQLite, INSERT ... ON DUPLICATE KEY UPDATE
// ... RETURNING on MariaDB 10.5+. MySQL 8 has no RETURNING: there a claim is
// the same upsert followed by a locking read in one short transaction, and
// Extend an UPDATE and a read in one. Complete, Release and Fail are UPDATEs
// fenced by the lease id; MarkProcessed an upsert. MySQL and MariaDB run the
// assignments of ON DUPLICATE KEY UPDATE left to right, each seeing the ones
// before it; the statement assigns the columns its conditions read
// (lease_id, lease_until, state, expires_at) last, in an order proved in
// the source. The store tells MariaDB from MySQL with SELECT VERSION().
//
// Deadlines come from the database clock: clock_timestamp() read once per
// statement on PostgreSQL (now() would be frozen at the start of a
// transaction), UTC_TIMESTAMP(6) on MySQL and MariaDB (fixed for one
// statement), julianday('now') on SQLite (fixed for one step). A statement
// that waited for another's row lock read the clock before it waited; the
// lease it then reports as Busy cannot be longer than the holder's, because
// the store takes the holder's last write as the earliest possible now.
//
// InnoDB can deadlock concurrent upserts of one key; such statements (or
// transactions) are rolled back by the server and the store runs them again
// (up to 8 times, jittered). Connection faults, timeouts and errors that
// persist wrap [inbox.ErrStoreUnavailable]; a canceled context wraps
// context.Canceled.
//
// # Failed attempts: backoff and dead keys
//
// Fail, fenced as Release is (the lease id must hold the key, which must be
// open), empties the lease id and records the reason; attempts are kept.
// Without Dead, the backoff is a lease that nobody holds: lease_until is
// set to the database clock plus [inbox.FailOptions.RetryAfter] (NULL when
// zero), and as no caller's lease id is empty, every TryBegin, the failed
// lease's id included, answers Busy until then, with ExpiresAt its end and
// RetryAfter the time left, by the very conditions that decide for leases
// (the claim statement gains no condition for backoffs). The claim's
// answer, Get and List tell the backoff from a lease by the empty lease
// id: Busy with Claim.BackingOff (false on a live lease), StateAvailable
// with RetryAt. The row lives until the end of the backoff plus the retention.
// The acquisition after the backoff writes its own lease over it; the
// reason stays, as history, until the row is forgotten or expires. With
// Dead, Fail sets state 2 (and no backoff): every TryBegin answers
// [inbox.Dead] with the reason and the attempts, Complete, Release, Fail
// and Extend are [inbox.ErrLeaseLost] (no lease id holds the row),
// MarkProcessed marks it processed, and the row lives for the retention
// from the Fail.
//
// # Operators: List, Forget, ForceRelease
//
// [Store] implements [inbox.Admin] (the operators' side, which cmd/inboxctl
// uses). Forget is a DELETE of the key's row. ForceRelease is an UPDATE of
// an open row whose lease is live or whose backoff runs, fenced by no lease
// id: the lease id is emptied (the holder's Complete, Release and Extend
// are then lease lost), lease_until cleared, attempts kept; a processed,
// dead or unknown key is left as it is.
//
// List is one SELECT per page in key order (ORDER BY msg_key LIMIT the page
// plus one row, which tells whether a next page follows): keyset
// pagination, whose cursor is the last key of the page (a string the caller
// passes back unread): while others write, no key is listed twice, and a
// key that exists and matches throughout the listing is listed. The prefix
// is a range of the primary key, msg_key >= prefix AND msg_key < the prefix
// with its last code point incremented, not a LIKE (keys may hold % and
// _); the column compares bytes on every dialect, so the range is exactly
// the keys that start with the prefix. The state (InProgress and Available
// compare lease_until with the database clock, and a backoff's empty lease
// id makes it Available) and OlderThan (last_seen against the database
// clock) are conditions on the rows of that range. The primary key serves
// the range, the order and the paging, so a page of keys in any state, or
// in a state most rows are in, reads about one page of rows. There is no
// index on state: it would be written by every claim, Complete and Fail,
// which the common path would pay for, and it would serve only listings of
// a state few rows are in (dead keys among processed ones). Such a listing
// reads the rows of the range in key order until a page is full, all of
// them when the state is rare: about the cost of a scan of the table, or
// of the prefix's range. Narrow it with a prefix where the key scheme
// allows ({bus}:{group}:...).
//
// # Batching
//
// [Store] embeds the portable layer of package
// github.com/watermill-inbox/inbox/stores/driver, which validates input and
// maps errors for every store, and batches: a TryBegin, Complete, Release,
// Fail or MarkProcessed that finds the store idle is sent at once, alone;
// calls made while batches are in flight wait and travel together in the next
// (at most 64 calls; two batches in flight at a time on PostgreSQL, MySQL
// and MariaDB, one on SQLite, which has one writer). Extend, Get,
// IsProcessed and the operators' calls are not batched. [Store.BatchStats]
// counts the batches and their sizes.
//
// A batch of one call (all a single sequential caller ever makes) is the
// one statement of its operation, with scalar parameters (on MySQL 8 a
// claim is its short transaction). A larger batch is applied in waves in
// which each key appears once (the calls of one key take effect in the
// order they were made: a Release then a TryBegin of its key acquires it),
// and each wave, per dialect:
//
//   - PostgreSQL: one statement, whatever the mix of operations: a
//     data-modifying CTE per kind (the claims' upsert, the completes',
//     releases' and fails' fenced UPDATE ... FROM unnest(...) RETURNING
//     msg_key, the marks' upsert), each over the arrays of its rows, all
//     under one clock reading.
//   - MariaDB and MySQL: one transaction for the whole batch: multi-row
//     upserts for claims (with RETURNING on MariaDB; on MySQL 8 followed by
//     a locking read of their rows) and for marks, and for completes,
//     releases and fails a locking read of their rows, the lease check made
//     on it, and one UPDATE per kind of the rows that passed (the fails'
//     joined with a derived table of their values: reason, state, backoff).
//     InnoDB breaks a deadlock by rolling the transaction back; it is run
//     again.
//   - SQLite: one transaction for the whole batch (immediate with the DSN of
//     [SQLiteDSN]): multi-row upserts for claims and marks, UPDATE ...
//     RETURNING msg_key for completes and releases, and the single
//     statement of a Fail for each fail (they carry values of their own,
//     and SQLite runs in the process). The statements are prepared once per
//     number of rows.
//
// Within a wave the rows are sorted by key, so that concurrent batches lock
// the rows they share in the same order. Every call gets its own outcome:
// a Complete whose lease lost the key fails with [inbox.ErrLeaseLost] while
// the others of its batch succeed. An error of the database (a lost
// connection, a statement that fails) fails every call of the batch with
// [inbox.ErrStoreUnavailable]; as with any store error, a call whose outcome
// is unknown may have taken effect.
//
// # Cleanup
//
// Reads compare expires_at with the clock, so expired rows are invisible at
// once (dead rows after the retention from their Fail, rows in a backoff
// after the backoff plus the retention, as every other row after the end
// of its lease or processing plus the retention); [Store.Cleanup] deletes
// them in statements of at most
// [Options.CleanupBatch] rows until none is left, alongside claims (on
// PostgreSQL it skips rows locked by a claim; every delete checks expiry
// again, so a key claimed in the meantime stays). [Options.CleanupInterval]
// starts a janitor that [Store.Close] stops.
//
// # Transactional mode
//
// Package github.com/watermill-inbox/inbox/stores/sql/txinbox runs the
// claim, the handler and the mark in one database transaction, so a
// handler's writes to the same database and the key's mark commit together
// or not at all: a process that dies before the commit leaves neither, and
// the redelivery applies the effect once. It is a store for the inbox
// middleware (an inboxmw.TxStore), not a middleware of its own:
//
//	txs, err := txinbox.New(txinbox.Config{DB: db, Dialect: sqlstore.Postgres, Outbox: outbox})
//	ib, err := inboxmw.New(inboxmw.Config{Store: txs, Bus: "rabbit", Group: "billing"})
//	router.AddMiddleware(ib.Middleware)
//	// in the handler:
//	tx, ok := txinbox.TxFromContext(msg.Context())
//
// Its claim is [Store.BeginTxClaim]: on a pooled connection of its own, a
// transaction whose INSERT ... ON CONFLICT DO NOTHING (INSERT IGNORE on
// MySQL and MariaDB) writes the key's row already marked processed. A
// concurrent claim of the key blocks on that uncommitted row until the
// transaction commits (the key is processed), rolls back (it claims the key)
// or [TxClaimOptions.LockTimeout] passes (an [*inbox.BusyError]): PostgreSQL
// lock_timeout, InnoDB innodb_lock_wait_timeout in whole seconds, SQLite the
// wait for the one writer connection. There is no lease and no Extend in
// this mode. The package documentation of txinbox says more: the guarantee,
// SQLite, the outbox for the messages a handler returns.
//
// The transactional mode may share a table with a lease [Store] but not its
// keys: a key leased by the store is busy for the transactional mode until
// the lease ends (a key in a failed attempt's backoff until the backoff
// ends, a dead key until it expires or is forgotten), and a key the
// transactional mode marked is processed for the store.
//
// # MySQL 8
//
// This project's CI has MariaDB 10.11, not MySQL 8. The statements MySQL 8
// runs (claims as an upsert and a locking read in a transaction, alone or
// in a batch; Extend in a transaction) are tested against MariaDB by the
// conformance suite and the batch tests (the "mysql8-path-on-mariadb" run). What differs and
// is not tested here: MySQL 8.0.20+ warns that VALUES() in ON DUPLICATE KEY
// UPDATE is deprecated (the statements still run); MySQL's default
// transaction isolation and deadlock behaviour for INSERT IGNORE of a
// duplicate key are the same as MariaDB's, but have only been exercised on
// MariaDB.
//
// # Benchmarks
//
// BenchmarkClaimCompleteInterleaved runs, within each iteration, a new key's
// TryBegin plus Complete through the store by one caller (batches of one
// call), the statements of those batches run directly through database/sql,
// and a plain INSERT then UPDATE of the same row (the floor), so that load
// weighs on all three alike; BenchmarkClaimComplete runs them as separate
// sub-benchmarks and adds the MySQL 8 path on MariaDB.
// BenchmarkConcurrentClaimComplete runs TryBegin plus Complete of new keys
// from 1 and from 16 goroutines, where batching shows. What they measured
// is in BENCHMARKS.md at the repository root.
package sqlstore
