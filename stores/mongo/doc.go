// Package mongostore is an [inbox.LeaseStore] on MongoDB, through the
// official driver go.mongodb.org/mongo-driver/v2.
//
//	client, err := mongo.Connect(options.Client().ApplyURI("mongodb://db1:27017"))
//	...
//	store, err := mongostore.New(ctx, client, mongostore.Options{Database: "app"})
//	...
//	err = store.EnsureIndexes(ctx) // optional: let the server delete expired records
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
// whether or not the server has deleted it. [Store.EnsureIndexes] adds a TTL
// index on expiresAt so that mongod deletes such records (its TTL monitor runs
// about once a minute); without it, or on a server that refuses TTL indexes,
// they only take space until a job of yours deletes them.
//
// # Claims
//
// Every write is a single-document operation whose filter states the
// condition under which it applies, so on mongod (where single-document
// writes are atomic) concurrent callers cannot both succeed. No pipeline
// update, $$NOW or transaction is used, because FerretDB runs none of them.
// TryBegin is:
//
//  1. FindOneAndUpdate with upsert on {_id: key, processed: false, dead:
//     false, leaseUntil <= now, retryAt <= now, expiresAt > now}: it takes a
//     live record whose lease ended or was released and whose backoff is
//     over ($inc attempts, new leaseId and leaseUntil, retryAt reset), or,
//     when no document has the key, inserts a new one. One round trip for a
//     new key. The returned document gives Claim.Attempts.
//  2. When a document with the key exists but does not match (processed,
//     dead, leased, in a backoff, or past its retention), the upsert's
//     insert fails with a duplicate key error on _id (E11000): that is how
//     races between inserts, and between an insert and an update, are
//     resolved. The store then reads the document and answers Processed,
//     Dead (with the reason), or Busy (with the holder's deadline, or the
//     backoff's end and Claim.BackingOff, and the time left); a retry by
//     the holder (same BeginOptions.LeaseID) renews its lease with a
//     conditional update on {leaseId, leaseUntil > now} without counting an
//     attempt; a record past its retention is replaced by a fresh one with
//     a conditional replace on {expiresAt <= now}.
//  3. When the record changed between those steps, TryBegin starts over, at
//     most 4 times, then fails with inbox.ErrStoreUnavailable.
//
// Complete, Release, Fail and Extend are one conditional update on {_id:
// key, leaseId, processed: false, expiresAt > now} (fencing by lease id: a
// failed, released or dead record has leaseId ""); a Complete that matches
// nothing reads the record to tell a repeated Complete by the completing
// lease (success) from a lost lease ([inbox.ErrLeaseLost]). Fail clears the
// lease, records the reason, and sets either retryAt (now + RetryAfter,
// rounded up to the millisecond, so the backoff never ends early) or dead.
// MarkProcessed is an upsert on {_id, expiresAt > now} that also clears dead
// and retryAt, with the same duplicate key fallback for records past their
// retention.
//
// # Admin
//
// [Store] implements [inbox.Admin] (cmd/inboxctl uses it):
//
//   - List is one find on {_id: {$gte: prefix, $lt: end}, expiresAt > now}
//     plus conditions for the state (processed, dead, leaseUntil against
//     now) and the age (lastSeen <= now - OlderThan), sorted by _id, limited
//     to Limit+1 documents: the extra one says whether a next page exists.
//     The prefix is a range of _id, not a regular expression, since keys may
//     hold any character: end is the prefix with its last code point
//     incremented, and strings compare byte for byte (MongoDB without a
//     collation, as FerretDB), which for UTF-8 is code point order. The
//     cursor (ListPage.Next) is the last _id of the page; the next page
//     starts after it.
//   - Forget is a deleteOne on _id.
//   - ForceRelease is one conditional update on {_id, processed: false,
//     dead: false, expiresAt > now, $or: [leaseUntil > now, retryAt > now]}
//     that clears leaseId, leaseUntil and retryAt and keeps attempts; any
//     other record matches nothing and is left as it is.
//
// No index is added for List: on mongod the _id index serves the prefix
// range and the order, and the state and age conditions are checked on the
// documents the range walks, so a page costs the records between its first
// and its last match, which is a full walk of the prefix for a rare state
// (dead keys among millions). An index on the state would instead cost
// every claim, which rewrites leaseUntil, for the sake of an operator's
// command; list by a narrow prefix instead. FerretDB 1.24 scans the
// collection for every List, as for every conditional write.
//
// # The portable layer, and round trips
//
// [Store] embeds the layer of package
// [github.com/watermill-inbox/inbox/stores/driver] that every store of this
// project sits behind. It checks keys, lease ids, owners, payload hashes,
// leases, failure reasons and list options before anything is sent
// ([inbox.ErrInvalidArgument]), applies List's default limit, refuses calls
// after Close ([inbox.ErrClosed]), fills in Options.Lease and a new lease id
// when TryBegin names none, bounds each call by Options.Timeout (the
// caller's own deadline when it is sooner), and maps errors to the sentinels
// of package inbox with messages that name the store, the operation and the
// key. What this package adds is MongoDB's own: the documents, the claims
// above, the server's clock, and the mapping of the driver's errors.
//
// The layer does not batch this store's calls: each call makes its own
// round trips at once, and concurrent calls run concurrently over the
// client's connection pool. A bulk write cannot keep the fencing on the
// servers this package supports. MongoDB's update command answers how many
// documents a batch matched, not which, so a batch of Completes or Releases
// cannot tell whose lease held. The bulkWrite command, whose answer has a
// result per operation, is MongoDB 8.0's, and FerretDB 1.24 does not know
// it. And FerretDB 1.24 ends an unordered batch of upserts at its first
// duplicate key error, skipping the operations after it and reporting
// neither the document it inserted nor the right index of the error, so the
// outcome of each claim would be lost as well.
//
// # Clock
//
// Lease deadlines and expiry times are on the server's clock, estimated by
// the client, because the form FerretDB runs has no server-side "now" ($$NOW
// needs a pipeline update). New reads the server's clock three times with the
// hello command (its localTime field) and keeps the reading with the
// shortest round trip; between readings the store advances it with the local
// monotonic clock, and it reads the server's clock again once a minute.
// Consumers on hosts whose clocks disagree by any amount therefore agree on
// deadlines to within the error of their estimates: half the round trip of
// the kept reading plus 0.5 ms (localTime has millisecond precision), plus
// the drift since that reading (at most 500 ppm, 30 ms a minute, between the
// local monotonic clock and a slewing server clock). On a LAN that is a few
// milliseconds; keep leases far longer than that (seconds, as the default 30
// s is). A step of the server's clock is picked up within a minute. Times are
// kept in milliseconds, as BSON dates are.
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
//	concurrent TryBegin: exactly one acquires   NOT held: FerretDB's        not verified here
//	  (fresh key, expired lease, released key)    updates are not atomic      (expected: atomic
//	                                              under concurrency; the      single-document
//	                                              suite skips these cases     writes)
//	TTL index (EnsureIndexes)                   refused: warning logged,    not verified here
//	                                              nil returned
//	server clock via hello localTime            verified                    not verified here
//
// No mongod was available where this package was written. The suite runs
// against one when INBOX_TEST_MONGO_URL is set (mongod 4.2 or newer), and a
// run there is what verifies the mongod column.
//
// FerretDB 1.24 on SQLite is for functional tests only. Besides the lack of
// atomicity, it pushes a filter down to SQLite only when the filter is
// exactly {_id: value}; every other filter, so every conditional write of
// this store, scans the whole collection, so every claim and mark costs time
// in proportion to the collection's size (BENCHMARKS.md at the repository
// root has what this package's benchmarks measured). mongod finds the
// document through the _id index whatever else the filter says.
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
//	mongodb+srv://user:pass@cluster.example.net/app?collection=inbox&ensure_indexes=true
//
// The path names the database (required); as in any MongoDB connection
// string it is also the authentication database unless authSource says
// otherwise. The store reads collection, timeout (a Go duration: the store's
// per-call Options.Timeout, not the driver's timeoutMS), ensure_indexes (true
// runs [Store.EnsureIndexes] at open) and the shared retention, lease and
// check. Durations may start with days: retention=7d, retention=1d12h.
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
// its first call, and the same mistakes fail the calls with
// [inbox.ErrStoreUnavailable]; it excludes ensure_indexes=true, which needs
// the server. [New], which takes the caller's client, reads the clock (so
// checks that the client connects and authenticates) and nothing else.
//
// The driver's own log, which MongoDB's MONGODB_LOG_* environment variables
// turn on and which goes to standard error by default, goes to
// Options.Logger for a client made from a URL (informational messages at
// info level, debug ones at debug level, with source=mongo-driver); by
// default that is slog's default logger. A client passed to New keeps the
// logger options its owner gave it.
package mongostore
