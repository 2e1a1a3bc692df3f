// Package mongostore is an [inbox.LeaseStore] on MongoDB, through the
// official driver go.mongodb.org/mongo-driver/v2.
//
//	client, err := mongo.Connect(options.Client().ApplyURI("mongodb://db1:27017"))
//	...
//	store, err := mongostore.New(ctx, client, mongostore.Options{Database: "app"}) // creates the TTL index
//
// # Documents
//
// One document per key, in Options.Database and Options.Collection (default
// "inbox"), with the key as _id (a string, compared byte for byte):
//
//	{
//	  _id:         <key>,
//	  leaseId:     <id of the current or last lease; "" once released, failed, forcibly
//	                released or marked by MarkProcessed>,
//	  leaseUntil:  <date: the lease's deadline; the epoch when there is no lease>,
//	  processed:   <bool>,
//	  dead:        <bool: a failed attempt marked the key dead (Fail with Dead)>,
//	  reason:      <string: the reason of the latest Fail; "" when none>,
//	  retryAt:     <date: the end of the latest Fail's backoff; the epoch when none; an
//	                acquisition, MarkProcessed and ForceRelease reset it>,
//	  attempts:    <int64: leases acquired>,
//	  firstSeen:   <date>, lastSeen: <date>,
//	  expiresAt:   <date: the record is gone after this: lease deadline + retention while
//	                leased, completion + retention once processed, release + retention,
//	                backoff end + retention after a Fail, Fail + retention once dead>,
//	  owner:       <string>, payloadHash: <string: the first non-empty hash seen>
//	}
//
// The layout is that of this version; records written by an earlier one
// (without dead, reason and retryAt) are not read correctly: start with an
// empty collection.
//
// Expiry is logical: every query compares expiresAt (and leaseUntil) with the
// current time itself, so a record past its retention is NotFound at once,
// whether or not the server has deleted it. The store deletes them by
// default: [New], and a store opened by URL, create a TTL index on
// expiresAt with the collection ([Store.EnsureIndexes]), so that mongod
// deletes such records (its TTL monitor runs about once a minute).
// Options.NoTTLIndex, or ensure_indexes=false in the URL, says you do not
// want it. A server that refuses TTL indexes, FerretDB 1.x (it answers
// NotImplemented), or a user that may not create indexes, is logged at
// error level through Options.Logger, naming the index, and the store
// works on: expired records then only take space until a job of yours
// deletes them.
//
// What each method does and guarantees is [inbox.LeaseStore]'s contract;
// this page has what is MongoDB's own. How each operation runs (the claim's
// conditional upsert and its duplicate key fallback, the fenced updates,
// List's range of _id), why calls are not batched, and how the server's
// clock is estimated are in the repository's docs/stores.md ("Stores in
// depth", MongoDB).
//
// # Claims, and the clock
//
// Every write is a single-document operation whose filter states the
// condition under which it applies (a conditional upsert for TryBegin,
// races resolved by the duplicate-key error on _id), so on mongod, where
// single-document writes are atomic, concurrent callers cannot both
// succeed. No pipeline update, $$NOW or transaction is used, because
// FerretDB runs none of them. For the same reason the store cannot read the
// server's "now" in a write: deadlines are on the server's clock as the
// client estimates it, from the hello command's localTime (read at New,
// then once a minute, advanced meanwhile by the local monotonic clock), so
// consumers with skewed clocks agree to within a few milliseconds on a LAN;
// keep leases far longer than that (the default 30 s is). Times are kept in
// milliseconds, as BSON dates are. List needs no index of its own: the _id
// index serves its prefix range and order. No call is batched: each makes
// its own round trips.
//
// # Guarantees, and where they were verified
//
// The conformance suite [github.com/watermill-inbox/inbox/stores/storetest]
// was run against these servers:
//
//	guarantee                                   FerretDB v1.24.2 (SQLite)   mongod
//	functional cases (claims, leases, fencing,  verified                    not verified here
//	  retention, Get, keys, bad input, ctx,
//	  attempts, Fail, backoff, dead, List,
//	  Forget, ForceRelease)
//	fault cases (a link cut under load, calls   verified, through a         not verified here
//	  canceled while they wait)                   fault proxy, one caller
//	concurrent TryBegin: exactly one acquires   NOT held: FerretDB's        not verified here
//	  (fresh key, expired lease, released key)    updates are not atomic      (expected: atomic
//	                                              under concurrency; the      single-document
//	                                              suite skips these cases     writes)
//	TTL index (created by New and Open,         refused: error logged,      not verified here
//	  EnsureIndexes)                              the store works on
//	server clock via hello localTime            verified                    not verified here
//
// The suite runs against a mongod (4.2 or newer), fault cases included,
// when INBOX_TEST_MONGO_URL is set: a run there verifies the mongod column.
// FerretDB 1.24 on SQLite is for functional tests only: it is not atomic,
// and every conditional write scans its whole collection.
//
// Errors: server and network faults, and the per-call Options.Timeout, wrap
// [inbox.ErrStoreUnavailable]; a canceled context wraps context.Canceled;
// driver errors are kept as text only, so mongo.ErrNoDocuments and the other
// driver types never reach the caller.
//
// # URL
//
// With [github.com/watermill-inbox/inbox/stores], MongoDB connection strings
// open a store that owns its client (Close disconnects it):
//
//	mongodb://user:pass@db1:27017,db2:27017/app?replicaSet=rs0&authSource=admin&collection=inbox&retention=168h
//	mongodb+srv://user:pass@cluster.example.net/app?collection=inbox&ensure_indexes=false
//
// The path names the database (required); as in any MongoDB connection
// string it is also the authentication database unless authSource says
// otherwise. The store reads collection, timeout (a Go duration: the store's
// per-call Options.Timeout, not the driver's timeoutMS), ensure_indexes
// (default true: the TTL index is created at Open; false is
// Options.NoTTLIndex) and the shared retention, lease and check. Durations may start with days: retention=7d, retention=1d12h.
// Every other parameter is passed to the driver when the driver knows its
// name (authSource, replicaSet, tls, maxPoolSize, ...); a name neither knows
// is refused, naming it. Errors never quote the password.
//
// Checks at Open: a store opened by URL reads the server's clock (the client
// connects and authenticates), then looks one _id up in its collection (the
// user may read it), within its timeout (5 s by default); it writes nothing.
// MongoDB creates a database and a collection at their first write, so
// neither has to exist. A wrong user or password, or a user without the
// right to read the collection, is an error wrapping
// [github.com/watermill-inbox/inbox/stores.ErrMisconfigured] and
// [inbox.ErrStoreUnavailable]:
//
//	mongo store: authentication failed for user app (authentication database admin) at db1:27017: check the user and password in the URL, and authSource if the user is defined in another database (...)
//	mongo store: user app may not read collection app.inbox at db1:27017: grant it the readWrite role on database app (...)
//
// A server that does not answer wraps [inbox.ErrStoreUnavailable] only
// ("mongo store: Open: cannot reach 127.0.0.1:27017 (reading the server's
// clock (hello)): inbox: store unavailable: server selection error: ...").
// check=false sends nothing at Open: the store reads the server's clock at
// its first call, which also creates the TTL index, and the same mistakes
// fail the calls with [inbox.ErrStoreUnavailable]. [New], which takes the
// caller's client, reads the clock (so checks that the client connects and
// authenticates) and creates the TTL index, and nothing else.
//
// The driver's own log, which MongoDB's MONGODB_LOG_* environment variables
// turn on and which goes to standard error by default, goes to
// Options.Logger for a client made from a URL (informational messages at
// info level, debug ones at debug level, with source=mongo-driver); by
// default that is slog's default logger. A client passed to New keeps the
// logger options its owner gave it.
package mongostore
