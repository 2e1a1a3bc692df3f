// Package redisstore is the Redis [inbox.LeaseStore], over go-redis v9's
// [redis.UniversalClient], so one store serves a standalone Redis, Sentinel
// (a failover client) and Redis Cluster.
//
//	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
//	store, err := redisstore.New(client, redisstore.Options{Retention: 72 * time.Hour})
//
// # How it works
//
// The store is the portable layer of [driver] (input validation, the
// closed check, the lease default and lease ids, the per-call
// [Options.Timeout], error mapping, batching) over a driver that speaks
// Redis. Every operation is on one Redis key, so it is atomic and valid on
// Cluster whatever slot the key hashes to. A claim of a key Redis does not
// hold, nearly every message, is native: SET key record NX PX ttl,
// pipelined with PEXPIRETIME key in the same round trip (on Cluster both go
// to the key's node). When SET NX wrote, the key is acquired; its lease
// began at the time of the SET on the Redis clock, rounded down to the
// millisecond, which the store reads back from the key's absolute expiry
// (PEXPIRETIME minus the TTL it gave), so Claim.ExpiresAt comes from
// Redis's clock, not the consumer's. When the key exists (a duplicate, a
// busy key, an expired lease to take over, the holder's own retry), SET NX
// changes nothing and a Lua script decides, one more round trip. Complete,
// Release, Fail and MarkProcessed are calls of one Lua script that applies
// operations to a key; Extend, Get (IsProcessed is a Get) and ForceRelease
// are a script each, Forget a DEL, and List a SCAN (see "Operators"
// below). Scripts run by their SHA (EVALSHA); a server whose script cache
// is empty (NOSCRIPT, after a restart, a failover or SCRIPT FLUSH) gets the
// same calls again with EVAL, which loads the script. Scripts that need
// the time read it with TIME (Redis 7 replicates scripts by their effects,
// which makes that safe), so consumers with skewed clocks agree.
// PEXPIRETIME needs Redis 7.0 or later.
//
// Lease ids are made by the client ([inbox.NewLeaseID], or the caller's
// [inbox.BeginOptions.LeaseID]), so a TryBegin that go-redis retries after
// a lost reply finds its own lease (SET NX then fails, and the script
// renews the holder's lease) and returns Acquired again.
//
// Round trips and Redis work per operation, when it travels alone:
//
//	TryBegin of a new key                 1   SET NX PX, PEXPIRETIME
//	TryBegin of a key that exists         2   the same, then the script
//	  (processed, busy, dead, in a backoff, an expired lease, the
//	  holder's retry)
//	Complete, Release, Fail,              1   a script call each
//	  MarkProcessed
//	Extend, Get, IsProcessed,             1   a script each
//	  ForceRelease
//	Forget                                1   DEL
//	List, one page                        2+  SCAN calls over the whole
//	                                          database (1000 keys each), then
//	                                          pipelines of the Get script
//
// Each inbox key is one Redis string, named [Options.Prefix] + key (default
// "inbox:"), that holds its record: a few MessagePack values (the layouts
// are described under "Record layouts" in the source of doc.go). The records
// that the claim of a new key and the Complete after it write hold no time:
// their times are derived from the key's expiry, the time of each SET
// rounded down to the millisecond, so the lease, or the retention, ends up
// to a millisecond before its full length has passed since the SET ran, and
// they live exactly as long as Redis holds the key. Every other record holds
// its times, in microseconds of the Redis clock, and a logical expiry that
// every script compares with TIME, so a processed key is processed for
// exactly the retention and a lease ends exactly at its deadline. The
// physical TTL is lease + retention while a record is in flight (an expired
// lease keeps the record's history, attempts and first seen, for the next
// TryBegin), the end of the backoff + retention after a Fail with one, and
// the retention once it is processed, released or dead, never before the
// logical expiry. The store owns every key under its prefix: a value it did
// not write there is an error wrapping [inbox.ErrStoreUnavailable]
// (WRONGTYPE, or an unexpected record), never overwritten.
//
// Leases and retention are kept in whole microseconds (rounded up) and are
// at most [MaxDuration] (100 years).
//
// # Errors
//
// go-redis errors never leak as such: a network or server error, a reply of
// an unexpected shape and the store's own [Options.Timeout] wrap
// [inbox.ErrStoreUnavailable] (the middleware then nacks the message and
// the broker redelivers it), with go-redis's error kept in the chain for
// errors.Is and errors.As. A context canceled by the caller is returned
// wrapping [context.Canceled]; a deadline wraps both
// [inbox.ErrStoreUnavailable] and [context.DeadlineExceeded]. A client closed
// under the store, or a closed store, gives [inbox.ErrClosed].
//
// Options.Timeout reaches the socket only when the client was built with
// ContextTimeoutEnabled (stores opened from a URL are); otherwise a call
// that hangs is bounded by the client's ReadTimeout and WriteTimeout (3 s by
// default) for each of its retries.
//
// A Release or Fail whose reply is lost, retried by go-redis (MaxRetries),
// fails with [inbox.ErrLeaseLost] although the first one took effect: the
// key is released, in its backoff or dead all the same.
//
// # Failed attempts: backoff and dead keys
//
// Every TryBegin answer carries the key's attempts (Claim.Attempts): 1 for
// the native claim of a new key, otherwise the count in the record. A
// Fail is fenced like a Release (a script call, batched like one) and
// records its reason in the record, which Get and List report as
// Record.Reason until the record is forgotten or expires; the next
// acquisition keeps it as history.
//
// Fail with a backoff (FailOptions.RetryAfter) clears the lease and keeps
// the end of the backoff, "retry at", on the Redis clock: until then every
// TryBegin, the failed lease's own included, answers Busy with ExpiresAt
// the retry at, RetryAfter the time left and Claim.BackingOff true (a Busy
// on a live lease has it false), and Get reports the key Available with
// Record.RetryAt. The first acquisition after it clears the
// retry at. The record lives until the retry at plus the retention. A
// backoff longer than [MaxDuration] is MaxDuration.
//
// Fail with Dead writes a dead record (kind 4) that lives for the retention
// from the Fail: TryBegin answers Dead with its reason and attempts for
// every caller; Complete, Release, Fail and Extend fail with
// [inbox.ErrLeaseLost] ("the key is dead") and change nothing;
// MarkProcessed marks it processed; IsProcessed is false. An operator
// replays it with Forget.
//
// None of this costs the message's usual path anything: the claim of a new
// key and the Complete of its fresh record send what they sent before.
//
// # Operators: List, Forget, ForceRelease
//
// The store implements [inbox.Admin] (cmd/inboxctl uses it). Forget is a
// DEL of the key's record. ForceRelease is a script: a live lease or a
// running backoff ends (the lease id is cleared, attempts and reason are
// kept, the key is available at once, kept for the retention); a key that
// is processed, dead, absent or neither leased nor backing off is left
// alone.
//
// List returns its pages in key order, as every store does: each page
// SCANs the whole database (every master on Cluster, go-redis's
// ClusterClient.ForEachMaster), COUNT 1000 a call, MATCH [Options.Prefix]
// followed by ListOptions.Prefix (both literal: the glob characters *, ?,
// [, ] and the backslash are escaped), keeping the smallest keys after the
// cursor: at most 100,000 of them and 8 MiB of their bytes, and twice the
// page's limit when no state or age is asked for. It then reads their
// records with the Get script in key order, a pipeline per chunk, so
// logical expiry applies (an expired record is not listed) and each item is
// the record Get gives, until the page holds its limit of records in the
// state and of the age asked for, plus one that tells another page follows.
// Next is the page's last key (or, when the keys kept ran out first while
// more were found, the last key examined, so a page may hold fewer records
// than its limit, even none); the next page starts after it, so cursors
// survive a failover or a change of the Cluster's masters. A key that
// exists from the first page to the last is listed once; while slots
// migrate between masters, a key that moves may be missed. A page costs
// Redis a SCAN of every key of the database, matched or not, and a script
// call per record it reads: its time grows with the database, so on one of
// millions of keys give operators' calls a longer [Options.Timeout] (the
// URL's timeout=1m). List needs a *redis.Client (standalone or Sentinel) or
// a *redis.ClusterClient; on any other client, such as a Ring, it fails
// with [inbox.ErrNotSupported], since SCAN would reach one shard only.
//
// # Durability: what survives a Redis restart
//
// The store is exactly as durable as the Redis under it. With append-only
// persistence and appendfsync always (appendonly yes, appendfsync always),
// every TryBegin, Complete and MarkProcessed acknowledged to the store is on
// disk before the reply: after a crash or restart no processed mark is lost
// and no live lease is forgotten, so no key is run twice; the fault tests
// check this with SIGKILL and SHUTDOWN mid-run. With Redis's default
// appendfsync everysec, a crash of the machine or of Redis can lose the last
// second of writes: a key completed in that second runs once more when its
// message is redelivered, and a lease granted in it can be granted again
// while its first holder still runs. With persistence off (the shared test
// Redis of this project keeps nothing on disk) a restart forgets every key.
// With replication (Sentinel, Cluster), a failover can lose the writes the
// replica had not received; WAIT is not used. A restart or failover also
// empties the script cache, which the EVAL fallback absorbs.
//
// # Batched round trips
//
// TryBegin, Complete, Release, Fail and MarkProcessed go through the layer's
// group commit (see "Batching" in [driver]), without timers: a call that
// finds fewer than two round trips of its Store in flight goes out at once,
// alone, in the caller's goroutine, so one consumer waits no longer than
// without batching (its claim never waits behind the mark of its previous
// message); calls that arrive while two are in flight are queued and travel
// together in the next one (at most 128 calls; callers that find 4096 calls
// queued wait for room, honouring their context). A batch is one go-redis
// pipeline (on Cluster, go-redis's ClusterClient splits it per node): the
// native claims of new keys and a script call for each Complete, Release,
// Fail and MarkProcessed. The claims whose key SET NX found then go together
// in a second pipeline, a script call each. A key that appears more than once
// in a batch gets a single script call that applies its operations in the
// order they were made (a Release then a claim of its key acquires it; two
// claims of a new key give one Acquired), so calls on one key take effect in
// that order, and no claim in the second pipeline can be overtaken by a later
// call on its key. Extend, Get, IsProcessed and the operators' calls are not
// batched.
//
// Each call keeps its own result (a lost lease is [inbox.ErrLeaseLost] for
// that call only) and its own Timeout: a batch of several calls runs under
// a context detached from theirs with the latest of their deadlines, and a
// caller whose context ends gets its context's error (its call is not sent
// if it was still queued; if it was, the result is dropped). A connection
// that fails fails every call of its round trip with
// [inbox.ErrStoreUnavailable]; on Cluster, those of the failing node.
// Script calls that find no script (NOSCRIPT) are sent again, with EVAL,
// in one more pipeline. Sixteen consumers of one Store therefore make far
// fewer round trips than calls, which is what costs Redis most of its CPU
// per message (a system call on each side per round trip).
// [driver.Store.BatchStats] counts the round trips and the calls they
// carried.
//
// # URL form
//
// Importing the package registers the schemes redis and rediss (TLS) with
// [github.com/watermill-inbox/inbox/stores]:
//
//	redis://[user:password@]host:6379/0?prefix=inbox:&retention=168h&lease=30s&timeout=5s
//	redis://host1:6379?addr=host2:6379&addr=host3:6379&timeout=5s     (Cluster)
//	redis://host1:6379?cluster=true                                  (Cluster, one seed)
//	redis://[:sentinel-password@]sentinel1:26379/0?master_name=mymaster&addr=sentinel2:26379&password=master-password (Sentinel)
//
// The store's parameters are retention, lease and check (shared by every
// store), prefix, timeout (per call), conn_check (true or false, see below)
// and cluster (true or false; an addr parameter implies true). prefix
// ([Options.Prefix], default inbox:) must end with ':', so that the store's
// keys stay in its namespace: prefix=app is refused (with the inbox key
// le:1 it would reach the Redis key apple:1, another namespace's; use
// prefix=app:). Durations are
// Go durations that may start with days: retention=7d, retention=1d12h,
// timeout=5s. A Cluster URL names no database, or 0. master_name makes a
// Sentinel client ([redis.NewFailoverClient]): the URL's host and every addr
// are then Sentinels, the user info is the Sentinels' and the username and
// password parameters the master's. route_by_latency, route_randomly and
// replica_only are refused with it: the store writes on every call, so it
// talks to the master only. Every other parameter goes to go-redis's
// [redis.ParseURL], [redis.ParseClusterURL] or [redis.ParseFailoverURL], so
// its options (dial_timeout, read_timeout, pool_size, max_retries, ...) can
// be set too, and an unknown parameter is an error naming it. Pool sizes
// (pool_size, min_idle_conns, max_idle_conns, max_active_conns,
// max_concurrent_dials) must be within [0, 100000]: go-redis panics on a
// negative one. The store made from a URL enables ContextTimeoutEnabled, owns
// its client and closes it on Close; errors quote the URL with its password
// masked.
//
// # Checks at Open
//
// A store opened from a URL is checked before [stores.Open] returns it,
// within its timeout (5 s by default): a PING (the client connects,
// authenticates and selects the URL's database); on a standalone client,
// INFO cluster, since a Cluster node needs cluster=true; then the store's
// Get script on one key under the prefix, and the fast claim's SET (with XX,
// on that key, which the Get script found without a live record, so nothing
// live is written) and PEXPIRETIME (the server runs EVALSHA, EVAL, SET and
// PEXPIRETIME for this user on the prefix's keys, and is Redis 7.0 or
// later).
// A mistake of configuration is an error wrapping [stores.ErrMisconfigured]
// and [inbox.ErrStoreUnavailable] that names it and how to fix it, for
// example:
//
//	redis store: authentication failed for user default at 127.0.0.1:6390: check the user and password in the URL (WRONGPASS invalid username-password pair or user is disabled.)
//	redis store: user app may not run the store's scripts (EVALSHA, EVAL) on keys under prefix "inbox:" at 127.0.0.1:6379: grant it in the server's ACL (...) (NOPERM ...)
//	redis store: the database in the URL's path "/99" does not exist at 127.0.0.1:6379: use /0 (...) (ERR DB index is out of range)
//	redis store: 127.0.0.1:7000 is a Redis Cluster node: add cluster=true to the URL (or addr=... for more seed nodes)
//	redis store: the TLS certificate of 10.0.0.5:6380 is not trusted: give the client the CA that signed it, ...
//
// A server that does not answer is an error wrapping
// [inbox.ErrStoreUnavailable] only ("redis store: Open: cannot reach
// 127.0.0.1:6379: inbox: store unavailable: dial tcp 127.0.0.1:6379:
// connect: connection refused; ..."). check=false skips the check: Open then
// sends nothing (go-redis connects on the first call), and the same mistakes
// fail the calls with [inbox.ErrStoreUnavailable]. This check is not
// conn_check, which is go-redis's check of each pooled connection (below).
//
// [New] takes the caller's client as it is and sends nothing: it checks only
// its options.
//
// # go-redis's log
//
// go-redis logs a few events (a dial that failed after its retries, a
// connection closed with unread data, ...) through one logger for the whole
// process, which prints to standard error by default. Importing this package
// replaces it, once, at initialisation: the lines go to the Watermill logger
// given to [SetLogger], at debug level, or nowhere (the default). The store's
// errors carry the same faults to the caller. An application that calls
// redis.SetLogger itself replaces this, for its clients and the store's.
//
// # Client settings
//
// Two more settings of the client made from a URL differ from go-redis's
// defaults, to save CPU on every call (BENCHMARKS.md at the repository root
// has the measurements):
//
//   - it speaks RESP2 unless the URL sets protocol: the scripts' replies
//     are the same in both, and the store uses none of RESP3's push
//     notifications, whose bookkeeping go-redis does on every call;
//   - it skips go-redis's check of every connection taken from the pool, a
//     recvfrom (MSG_PEEK) system call per call (parameter conn_check,
//     default false; true restores the check). A connection that the
//     server closed (a restart, its idle timeout) is then found dead when a
//     call uses it, and go-redis retries the call on another connection
//     (max_retries, 3 by default; every script is safe to repeat, with the
//     caveat of Release above). With retries off (max_retries=-1) the check
//     stays on unless conn_check=false is given, as every dead connection
//     would fail one call.
//
// A client passed to [New] is used as it is; the same settings can be made
// there (Options.Protocol, and a Dialer whose connections do not implement
// syscall.Conn).
//
// TLS (rediss://) is tested against a private redis-server that serves TLS
// only: the conformance suite with a verifying client, and by URL, where a
// certificate the system does not trust is refused unless the URL says
// skip_verify=true (go-redis's parameter).
//
// Sentinel is tested with a private master, replica and Sentinel: the
// conformance suite through a failover client, and a failover
// (SENTINEL FAILOVER) under a store opened by URL, which reaches the
// promoted replica without being reopened and finds there the marks and
// leases that were replicated before it.
//
// # Watermill's Deduplicator
//
// [ExpiringKeyRepository] implements Watermill's
// middleware.ExpiringKeyRepository on Redis for applications that use
// Watermill's own Deduplicator; its documentation says why this project's
// inbox middleware is safer.
//
// # Benchmarks
//
// BenchmarkTryBeginComplete runs one message's work, TryBegin then Complete
// on a new key, three ways: this store ("ours"); the same commands (the
// fast claim's pipeline, then the script call of Complete) sent by hand
// through go-redis ("raw-lua": fixed lease id, no validation, timeout,
// batching or reply checks), which isolates the store's Go-side cost; and
// SET NX PX then SET ("raw-setnx"), the two-round-trip floor with no
// fencing, history or clock. Each runs sequentially and with 16 concurrent
// callers. BenchmarkOverhead_paired alternates ours and raw-lua within each
// iteration of each caller, so that load drift weighs on both alike, and
// reports their time ratio, with the default Timeout and with Timeout off.
// BenchmarkTryBeginCompleteInterleaved runs the three in turn within every
// iteration; the harness of make bench (cmd/inboxbench) uses it.
//
// What ours adds to raw-lua is the store's Go side: the timer of
// [Options.Timeout] on every call (none with Timeout off), validation of the
// key, lease id and owner, batching, the boxing of script arguments and the
// lease id. What raw-lua costs Redis beyond raw-setnx is PEXPIRETIME and
// the script call of Complete, the price of lease fencing, attempts,
// history and one clock.
//
// Two benchmarks report what the store costs the Redis server:
// BenchmarkRedisCPU_TryBegin_new_key its CPU time and command time per
// claim of a new key, on the shared test server; BenchmarkRedisCPU_message
// its CPU time, script time and the client's round trips per message
// (TryBegin and Complete) against Watermill's Deduplicator over Redis and a
// bare SET NX PX, with one caller and with 16, on a server of its own. The
// measured figures are in BENCHMARKS.md at the repository root.
package redisstore

// Record layouts
//
// This is the one description of the records the store keeps. The Go side
// of the codec is record.go (record, encode), with the tests' reader in
// decode_test.go (decode, view); the scripts'
// side is in scripts.go: decode, load and save in the prelude clock, and
// the short way of Complete at the top of opsScript. codec_test.go checks,
// on a real Redis, that each side reads what the other writes, layout by
// layout.
//
// The record of an inbox key is one Redis string: MessagePack values one
// after the other, no array around them, so that a script reads them all
// with one call of cmsgpack.unpack. The first value is the kind, which
// names the layout and what follows:
//
//	kind  layout           values after the kind            written by
//	0     fresh            id ow ph ln ttl                  the client: the fast claim (apply.go)
//	3     completed fresh  id ow ph ln ttl E1 ttl2          opsScript's short way of Complete
//	1     full             id ow ph lu ln at fs ls ex rs ra save: in flight, released, in a backoff
//	2     full             the same                         save: processed
//	4     full             the same                         save: dead
//	1, 2  short            id ow ph lu ln at fs ls ex       nothing now (older versions did)
//
// with
//
//	id    lease id: of the live or expired lease; after Complete the
//	      completing lease's; "" after Release, Fail, MarkProcessed or
//	      ForceRelease
//	ow    owner of the latest acquisition
//	ph    first non-empty payload hash, "" while there is none
//	lu    lease deadline, 0 when released, failed, processed or dead
//	ln    length of the current lease
//	at    attempts (leases acquired)
//	fs    first seen
//	ls    last seen
//	ex    logical expiry of the whole record
//	rs    reason of the latest Fail, "" when none
//	ra    retry at: the end of the backoff of the latest Fail, 0 when
//	      none; cleared by the next acquisition
//	ttl   the physical TTL the fresh record was written with (lease +
//	      retention, rounded up, plus one)
//	E1    the fresh record's absolute expiry (PEXPIRETIME when Complete ran)
//	ttl2  the physical TTL the completed record was written with (the
//	      retention, rounded up)
//
// Times and durations are microseconds of the Redis clock, except ttl, E1
// and ttl2, which are milliseconds.
//
// Encodings. Strings are MessagePack str: fixstr, str 8, str 16 or str 32,
// the smallest that fits, from both writers. Integers are never negative:
// the client writes positive fixint or uint 64; the scripts' cmsgpack.pack
// writes the smallest that fits (positive fixint, uint 8, 16, 32 or 64).
// Both decoders take any integer format, negative ones included; the Go
// decoder refuses floats and integers beyond int64, which no writer writes
// and the scripts would read as Lua numbers. Both refuse a record with a
// value missing, a value more or a value of the wrong type. The short way of
// Complete reads no value: it matches the record's bytes, the kind's byte (0
// or 3) followed by the str header and the bytes of its lease id (a fixstr,
// or a str 8 since lease ids are at most [inbox.MaxLeaseIDLen] bytes), and
// writes a completed fresh record as the byte 3, the fresh record's bytes
// after its kind and cmsgpack.pack(E1, ttl2).
//
// Who reads what. Every layout is read by decode, which every script runs
// through load, and by the tests' Go decode (decode_test.go; the store reads
// records only through the scripts). load returns each as the values of the full
// layout: a fresh record as kind 0, a completed one as kind 2, a short one
// with rs "" and ra 0. Every change a script makes writes the full layout
// (save), except the short way of Complete.
//
// Times from PEXPIRETIME. Kinds 0 and 3 hold no time of their own: the
// client that writes a fresh record does not know the Redis clock. Their
// times come from the key's absolute expiry E (PEXPIRETIME, milliseconds of
// the Redis clock, exact and the same for every reader), read by load and by
// the fast claim's pipeline (SET key record NX PX ttl, then PEXPIRETIME key,
// one round trip; on Cluster both go to the key's node):
//
//	fresh (kind 0):      acquired a = (E - ttl) * 1000, the time of the SET
//	                     rounded down to the millisecond; lu = a + ln;
//	                     at 1; fs = ls = a; ex = E * 1000
//	completed (kind 3):  fs = (E1 - ttl) * 1000; processed at
//	                     ls = (E - ttl2) * 1000; lu 0; at 1; ex = E * 1000
//
// Both live exactly as long as Redis holds the key and never hold a reason
// or a backoff (a Fail writes the full layout). The client computes the
// claim's ExpiresAt from the PEXPIRETIME reply as load does (acquiredAt in
// record.go), so the claim, Busy replies and Get agree to the microsecond.
//
// Why two layouts without time. Kinds 0 and 3 exist for speed only: kind 0
// lets the claim of a new key be a native SET NX, no script; kind 3 lets
// the Complete of a fresh record, the message's usual path, run without
// TIME, decoding or encoding. Both were measured on 2026-11-26
// (BENCHMARKS.md, "the record layouts that exist for speed"): writing the
// full layout instead costs, on Kafka through cmd/inboxbench, 17 to 19
// percent more Redis CPU per message without kind 3 (the throughput moved
// within its noise; a target of issue 14 on that CPU has about 15 percent
// of room), and about a quarter of the throughput and 50 to 70 percent more
// Redis CPU without kind 0. Both stay.
//
// Logical expiry. A record of the full or short layout holds its times and
// is absent once TIME reaches ex, whatever its physical TTL, which save sets
// one millisecond past ex so that Redis never drops a record before the
// scripts stop seeing it. ex is lu plus the retention while a lease is in
// flight, max(now, ra) plus the retention after a Fail with a backoff, and
// now plus the retention after any other change (Complete, Release, a dead
// Fail, MarkProcessed, ForceRelease).
//
// Layouts still read because older versions wrote them. The short layout
// (kinds 1 and 2 without rs and ra) is what the store wrote before Fail
// existed (issue 16). Nothing writes it now; the scripts read it as rs ""
// and ra 0 and the next change rewrites it in the full layout. A short
// record lives at most its lease + the retention after its last write, so
// it can stop being read once every store of a deployment has run a newer
// version for that long. A kind-4 record is never short.
