// Package sqlstore is the [inbox.LeaseStore] on database/sql, for
// PostgreSQL, MySQL 8 and MariaDB, and SQLite. It imports no database
// driver: each [Dialect] is linked by a package of its own, which imports
// its database/sql driver and registers its URL schemes:
//
//	import _ "github.com/watermill-inbox/inbox/stores/sql/postgres" // or .../sql/mysql, .../sql/sqlite
//
//	store, err := stores.Open(ctx, "postgres://app:secret@db:5432/app?sslmode=disable&migrate=true")
//
// or, over a *sql.DB of your own:
//
//	db, err := sql.Open("pgx", "postgres://app:secret@db:5432/app")
//	store, err := sqlstore.New(ctx, db, sqlstore.Options{Dialect: sqlstore.Postgres, AutoMigrate: true})
//
// The table also serves the transactional mode (package
// github.com/watermill-inbox/inbox/stores/sql/txinbox), where the mark
// commits with the handler's own writes. The SQL section of docs/stores.md,
// at the repository's root, describes the statements, the batching and
// their costs in depth.
//
// # URLs
//
// Every SQL URL takes retention, lease and check (shared by all stores:
// package github.com/watermill-inbox/inbox/stores), table (default
// "inbox"), migrate (true creates the table; default false), cleanup
// (off turns the janitor off; default on), cleanup_interval (the janitor's
// interval), cleanup_batch, max_conns (the pool's size), and its driver's parameters, which the dialect's package
// lists; any other parameter is an error that names it. Durations may start
// with days (retention=7d, 1d12h). stores.Open checks the store before
// returning it: it connects, authenticates, and reads one key through the
// store's own statement, so a wrong password, a missing database or a
// missing table (without migrate=true) fails there, once, with an error
// wrapping stores.ErrMisconfigured that says how to fix it. check=false
// sends nothing at Open, and excludes migrate=true on PostgreSQL and MySQL.
// [New], which takes the caller's *sql.DB, checks less: it asks a
// MySQL-protocol server its version and, with [Options.AutoMigrate],
// creates the table. Errors never quote a password.
//
// # Schema
//
// One table per store ([Options.Table], checked by [ValidateTable]), a row
// per key. Keys compare byte for byte on every dialect (a binary column on
// MySQL and MariaDB, whose default collations fold case and trailing
// spaces). [Store.Migrate] creates the table and upgrades one of the
// earlier layout (without the column reason); [DDL] gives its statements
// to users who run their own migrations.
//
// # Statements and clocks
//
// A claim is one upsert that decides under the row lock: INSERT ... ON
// CONFLICT DO UPDATE ... RETURNING on PostgreSQL and SQLite, INSERT ... ON
// DUPLICATE KEY UPDATE ... RETURNING on MariaDB 10.5+, and on MySQL 8,
// which has no RETURNING, the upsert and a locking read in one short
// transaction. Complete, Release, Fail and Extend are UPDATEs fenced by the
// lease id. Deadlines come from the database's clock: clock_timestamp() on
// PostgreSQL, UTC_TIMESTAMP(6) on MySQL and MariaDB, julianday('now') on
// SQLite (milliseconds). testdata/postgres.sql, testdata/mysql.sql and
// testdata/sqlite.sql, in this package's directory, hold every statement
// the store sends, each named, with when it is sent and its parameters.
//
// A failed attempt's backoff is a lease that nobody holds (an empty lease
// id, lease_until its end): every TryBegin answers Busy until it ends. A
// dead key answers [inbox.Dead] until it expires or is forgotten.
//
// Statements that InnoDB rolls back to break a deadlock are run again (up
// to 8 times). Connection faults, timeouts and errors that persist wrap
// [inbox.ErrStoreUnavailable]; a canceled context wraps context.Canceled.
//
// # Order keys
//
// On PostgreSQL the store keeps the order of order keys
// ([inbox.BeginOptions.OrderKey], [inbox.OrderAdmin]): a second table,
// the store's table name and "_order", created by [Store.Migrate] and
// [DDL], holds a row per order key that has a gate (its head, the keys
// waiting behind it in their order, and when it expires: the retention
// plus the default lease after its last change; reads ignore an expired
// gate, and cleanup deletes it after the expired records). A TryBegin
// whose OrderKey has no live gate (read in one statement per batch) runs
// as one without; a TryBegin whose OrderKey has one, and a Fail with an
// OrderKey, leave the batch's waves and run alone, in a short transaction
// that holds an advisory lock of its order key; calls without one keep
// the waves and their statements. On a table made without the
// gate table (by an earlier version, with migrate off) calls with an
// OrderKey fail with an error wrapping [inbox.ErrStoreUnavailable] that
// says to migrate; the others work. MySQL, MariaDB and SQLite keep no
// order: an OrderKey fails with [inbox.ErrNotSupported].
//
// # Batching, cleanup, operators
//
// Concurrent TryBegin, Complete, Release, Fail and MarkProcessed calls share
// round trips (package github.com/watermill-inbox/inbox/stores/driver): at
// most 64 calls a batch, two batches in flight on PostgreSQL, MySQL and
// MariaDB, one on SQLite; a batch is one statement per wave on PostgreSQL
// and one transaction on the others. [Store.BatchStats] counts them.
//
// Reads ignore expired rows at once; deleting them reclaims their space.
// The store does it by default: [New] starts a janitor that deletes them
// every [Options.CleanupInterval] (by default a tenth of the retention, at
// most an hour), in statements of at most [Options.CleanupBatch] rows, until
// a statement deletes fewer; a pass that runs for its whole interval falls
// behind, and the next starts at once. After each pass the janitor counts
// the expired rows left ([Store.Backlog]); [Store.CleanupStats] has the
// counts, which package github.com/watermill-inbox/inbox/metrics exports.
// Turning the janitor off takes words: [Options.DisableCleanup], or
// cleanup=off in the URL; [Store.Cleanup] (or `inboxctl cleanup`) then
// deletes expired rows when you run it. [Store] implements
// [inbox.Admin]: List pages in key order over a range of the primary key
// (a listing of a state few rows are in reads the whole range: narrow it
// with a prefix), Forget deletes the key's row, ForceRelease ends a live
// lease or backoff.
//
// # MySQL 8
//
// This project's CI has MariaDB 10.11, not MySQL 8: the statements MySQL 8
// runs are tested against MariaDB (the "mysql8-path-on-mariadb" run), not
// on MySQL 8 itself; docs/stores.md says what differs.
package sqlstore
