// Package redisstore is the Redis [inbox.LeaseStore] and [inbox.Admin], over
// go-redis v9's [redis.UniversalClient], so one store serves a standalone
// Redis, Sentinel (a failover client) and Redis Cluster.
//
//	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
//	store, err := redisstore.New(client, redisstore.Options{Retention: 72 * time.Hour})
//
// What each method does and guarantees is [inbox.LeaseStore]'s contract;
// this page has what is Redis's own. How each operation runs, its round
// trips, the cost of List and the benchmarks are in the repository's
// docs/stores.md ("Stores in depth", Redis).
//
// # Layout
//
// Each inbox key is one Redis string, named [Options.Prefix] + key (default
// "inbox:"), holding its record in MessagePack; its TTL is lease + retention
// while a lease is in flight, the end of a failed attempt's backoff +
// retention, and the retention once it is processed, released or dead. A
// processed key keeps its attempts, first seen, when it was processed, its
// payload hash (the first 16 bytes of a SHA-256) and a fingerprint of the lease
// that completed it: not its owner, which Get shows empty. Expiry is logical,
// in Lua scripts that read Redis's TIME, so deadlines come from the Redis clock
// and consumers with skewed clocks agree; the TTL only cleans up. The claim of
// a new key is a native SET NX PX (with PEXPIRETIME, one round trip), a key
// that exists a script, in a second round trip (a claim with
// [inbox.BeginOptions.Retry], a copy of a failed attempt, goes to the script at
// once); every operation without an order key touches one key, so it is atomic,
// on Cluster too. Order keys ([inbox.OrderAdmin]) are kept over a *redis.Client
// only. The store owns every key under its prefix: a value it did not write
// there is an error wrapping [inbox.ErrStoreUnavailable], never overwritten.
// Leases and retention are kept in whole microseconds and are at most
// [MaxDuration] (100 years). Needs Redis 7.0 or later (PEXPIRETIME), and
// EVALSHA, EVAL, SET and PEXPIRETIME on its keys.
//
// # Batched round trips
//
// TryBegin, Complete, Release, Fail, MarkProcessed and Extend go through
// the layer's group commit: a call that finds fewer than two round trips in
// flight goes out at once; calls made while two are in flight travel
// together in the next one, one go-redis pipeline (split per node on
// Cluster), at most 128 calls, each with its own result and its own
// Timeout. A connection that fails fails the calls of its round trip with
// [inbox.ErrStoreUnavailable].
//
// # Operators: List, Forget, ForceRelease
//
// List returns pages in key order, as every store does: each page SCANs
// the whole database (every master on Cluster) and reads the records of
// the keys it keeps, so its time grows with the database; on one of
// millions of keys, give the operators' store URL a longer timeout
// (timeout=1m). It needs a *redis.Client or a *redis.ClusterClient (a Ring
// is [inbox.ErrNotSupported]). Forget is a DEL; ForceRelease a script.
//
// # Errors
//
// go-redis errors never leak as such: a network or server error, a reply of
// an unexpected shape and the store's own [Options.Timeout] wrap
// [inbox.ErrStoreUnavailable], with go-redis's error kept in the chain. A
// context canceled by the caller wraps [context.Canceled]; a deadline wraps
// both [inbox.ErrStoreUnavailable] and [context.DeadlineExceeded]. A client
// closed under the store, or a closed store, gives [inbox.ErrClosed].
// Options.Timeout reaches the socket only when the client was built with
// ContextTimeoutEnabled (stores opened from a URL are); otherwise a call
// that hangs is bounded by the client's ReadTimeout and WriteTimeout (3 s
// by default) for each of its retries.
//
// # URL
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
// store), prefix (must end with ':', so that prefix=app cannot reach
// another namespace's apple:1), timeout (per call), conn_check, cluster
// (an addr parameter implies it; a Cluster URL names no database, or 0)
// and allow_eviction ([Options.AllowEviction]).
// Durations may start with days: retention=7d. master_name makes a Sentinel
// client: the URL's host and every addr are Sentinels, and
// route_by_latency, route_randomly and replica_only are refused with it.
// Every other parameter goes to go-redis's [redis.ParseURL],
// [redis.ParseClusterURL] or [redis.ParseFailoverURL] (dial_timeout,
// pool_size, max_retries, ...), pool sizes within [0, 100000]; an unknown
// parameter is an error naming it. A store made from a URL owns its client
// (Close closes it), enables ContextTimeoutEnabled, speaks RESP2 unless the
// URL sets protocol, and skips go-redis's check of each pooled connection
// unless conn_check=true (a recvfrom per call; a dead connection is then
// found by the call, which go-redis retries). Errors quote the URL with its
// password masked.
//
// # Checks at Open
//
// A store opened from a URL is checked before [stores.Open] returns it,
// within its timeout: a PING (connect, authenticate, select the database),
// on a standalone client INFO cluster (a Cluster node needs cluster=true),
// the Get script and the fast claim's SET XX and PEXPIRETIME on one key
// under the prefix, writing nothing live, then CONFIG GET maxmemory-policy
// (on every master of a Cluster): a policy other than noeviction can evict
// the store's keys when the server runs out of memory (every record has a
// TTL, so the volatile-* policies too), and a processed key evicted is a
// message that runs again, so Open refuses it, wrapping
// [ErrEvictionPolicy], unless the URL says allow_eviction=true. A server
// that refuses CONFIG GET (an ACL, a renamed command) gets one warning
// ([SetLogger]) and opens. [Store.ServerMemory] reports the keys the
// server evicted and its memory headroom, which package inboxmetrics
// exports. A mistake of configuration wraps [stores.ErrMisconfigured] and
// [inbox.ErrStoreUnavailable] and says what to fix, for example:
//
//	redis store: authentication failed for user default at 127.0.0.1:6390: check the user and password in the URL (WRONGPASS ...)
//	redis store: 127.0.0.1:7000 is a Redis Cluster node: add cluster=true to the URL (or addr=... for more seed nodes)
//	redis store: 127.0.0.1:6379 has maxmemory-policy volatile-lru, which can evict the store's keys ...
//
// A server that does not answer wraps [inbox.ErrStoreUnavailable] only.
// check=false sends nothing at Open. [New] takes the caller's client as it
// is and sends nothing: it checks only its options.
//
// # Durability
//
// The store is as durable as the Redis under it: with appendonly yes and
// appendfsync always, no acknowledged mark or lease is lost on a crash;
// with everysec the last second can be; without persistence a restart
// forgets every key; a failover can lose what the replica had not received.
//
// # Verified against
//
// The conformance suite runs against Redis 7.0 standalone (with its fault
// cases through a proxy), a TLS-only server with a verifying client, a
// local 3-node Cluster, and a master with a replica and a Sentinel, where a
// failover under a store opened by URL reaches the promoted replica and
// finds there the marks and leases replicated before it; persistence is
// checked with SIGKILL and SHUTDOWN of a private append-only server.
//
// go-redis logs a few events through one logger for the whole process;
// importing this package sends them to [SetLogger]'s Watermill logger, at
// debug level, or nowhere (the default). [ExpiringKeyRepository] implements
// Watermill's middleware.ExpiringKeyRepository, for applications that use
// Watermill's own Deduplicator.
package redisstore

// Record layouts
//
// This is the one description of the records the store keeps. The Go side
// of the codec is record.go (record, encode), with the tests' reader in
// decode_test.go (decode, view); the scripts' side is in scripts.go:
// decode, load, save, processed and dead in the prelude clock, and the
// short way of Complete at the top of opsScript. codec_test.go checks,
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
//	1     full             id ow ph lu ln at fs ls ex rs ra save: in flight, released, in a backoff
//	5     compact          at fs d ph fp                    processed: Complete, MarkProcessed
//	7     compact marked   at fs ttl2 ph fp                 the client: the short way of Complete (apply.go)
//	6     compact dead     at fs d ph ow rs                 dead: Fail
//	3     completed fresh  id ow ph ln ttl E1 ttl2          nothing now (older versions did)
//	2, 4  full             as kind 1                        nothing now: processed, dead
//	1, 2  short            id ow ph lu ln at fs ls ex       nothing now
//
// with
//
//	id    lease id: of the live or expired lease; "" after Release, Fail,
//	      MarkProcessed or ForceRelease; in kinds 2 and 3 the completing
//	      lease's
//	ow    owner of the latest acquisition
//	ph    first non-empty payload hash, "" while there is none, in its
//	      compact form: one of 64 lowercase hex digits (the middleware's
//	      SHA-256) as a NUL and its first 16 bytes, any other as it is (a
//	      payload hash never holds a NUL). Hashes are compared in that
//	      form; Get shows a compact one as its 32 hex digits.
//	lu    lease deadline, 0 when released, failed, processed or dead
//	ln    length of the current lease
//	at    attempts (leases acquired)
//	fs    first seen
//	ls    last seen
//	d     the time from fs to the Complete, MarkProcessed or Fail that
//	      wrote the compact record: its last seen is fs + d
//	fp    the first 8 bytes of the SHA-1 of the lease id that completed
//	      the key ("" after MarkProcessed): a repeated Complete of that
//	      lease succeeds, any other lease's is ErrLeaseLost
//	ex    logical expiry of the whole record
//	rs    reason of the latest Fail, "" when none
//	ra    retry at: the end of the backoff of the latest Fail, 0 when
//	      none; cleared by the next acquisition
//	ttl   the physical TTL the fresh record was written with (lease +
//	      retention, rounded up, plus one)
//	E1    the fresh record's absolute expiry (PEXPIRETIME when Complete ran)
//	ttl2  the physical TTL the completed record was written with (the
//	      retention, rounded up; ms)
//
// Times and durations are microseconds of the Redis clock, except ttl, E1
// and ttl2, which are milliseconds.
//
// Why compact records. A key is kept for the retention once processed, so
// what a processed key costs is what the inbox costs to run. A compact
// record holds only what is read later: no owner, no lease id but its
// fingerprint, no lease, no reason unless dead (a dead key keeps its owner
// too, for the operator who looks at it), no expiry of its own, and the
// payload hash as bytes. With a SHA-256 payload hash it is 41 to 43 bytes
// (d up to 71 minutes), so Redis keeps it in one allocation with its
// object (an embedded string, at most 44 bytes).
// TestSizing_bytes_per_processed_key measures it against the floor, SET
// key 1 PX retention.
//
// Encodings. Strings are MessagePack str: fixstr, str 8, str 16 or str 32,
// the smallest that fits, from both writers. Integers are never negative,
// and both writers write the smallest format that fits (positive fixint,
// uint 8, 16, 32 or 64; versions before kind 7 wrote uint 64 from the
// client).
// Both decoders take any integer format, negative ones included; the Go
// decoder refuses floats and integers beyond int64, which no writer writes
// and the scripts would read as Lua numbers. Both refuse a record with a
// value missing, a value more or a value of the wrong type.
//
// Who reads what. Every layout is read by decode, which every script runs
// through load, and by the tests' Go decode (decode_test.go; the store reads
// records only through the scripts). load returns each as the values of the
// full layout: a fresh record as kind 0, a completed or compact processed
// one as kind 2 (a compact one's id is a NUL and fp, which holder matches
// against the fingerprint of the caller's lease id), a compact dead one as
// kind 4, a short one with rs "" and ra 0, a payload hash in its compact
// form. Every change a script makes writes kind 1 (save), 5 (processed) or
// 6 (dead); the short way of Complete writes the client's kind 7.
//
// Times from PEXPIRETIME. Kinds 0, 3, 5, 6 and 7 hold no expiry of their own:
// they live exactly as long as Redis holds the key, their logical expiry
// ex the key's absolute expiry E (PEXPIRETIME, milliseconds of the Redis
// clock, exact and the same for every reader), read by load. Kinds 5, 6
// and 7 are written with the retention as their TTL. The client that
// writes a fresh or marked record does not know the Redis clock, so kinds
// 0, 3 and 7 take their times from E too, as does the fast claim's
// pipeline (SET key record NX PX ttl, then PEXPIRETIME key, one round
// trip; on Cluster both go to the key's node):
//
//	fresh (kind 0):      acquired a = (E - ttl) * 1000, the time of the SET
//	                     rounded down to the millisecond; lu = a + ln;
//	                     at 1; fs = ls = a; ex = E * 1000
//	completed (kind 3):  fs = (E1 - ttl) * 1000; processed at
//	                     ls = (E - ttl2) * 1000; lu 0; at 1; ex = E * 1000
//	marked (kind 7):     processed at ls = (E - ttl2) * 1000, the time
//	                     of the SET rounded down to the millisecond;
//	                     ex = E * 1000
//
// The client computes the claim's ExpiresAt from the PEXPIRETIME reply as
// load does (acquiredAt in record.go), so the claim, Busy replies and Get
// agree to the microsecond.
//
// The short way of Complete. Kind 0 exists for speed: the claim of a new
// key is a native SET NX, no script. Its Complete, the message's usual
// path, has a short way too: a Complete that knows its claim (the
// middleware's: its lease, ExpiresAt, owner and payload hash) carries the
// fresh record's bytes and the kind 7 record that replaces it, both made
// by the client; when the key still holds those bytes, the script writes
// that record (GET, SET: no decoding, no clock), and when it holds a
// compact processed record (kind 5 or 7) ending with that fp, it answers
// at once. Both were measured (BENCHMARKS.md, "Record layouts for speed"),
// when the short way wrote kind 3: writing the full layout instead cost,
// on Kafka through cmd/inboxbench, 17 to 19 percent more Redis CPU per
// message without the short way, and about a quarter of the throughput and
// 50 to 70 percent more Redis CPU without kind 0. Kind 7 against a kind 5
// written with TIME in the script: BenchmarkRedisCPU_message/store-mark,
// 16 callers, 12.3 to 14.0 against 14.2 to 15.9 µs of Redis CPU a message
// (script 3.7 to 4.6 against 5.7 to 6.5).
//
// Logical expiry. A record of the full or short layout holds its times and
// is absent once TIME reaches ex, whatever its physical TTL, which save sets
// one millisecond past ex so that Redis never drops a record before the
// scripts stop seeing it. ex is lu plus the retention while a lease is in
// flight, max(now, ra) plus the retention after a Fail with a backoff, and
// now plus the retention after a Release, a Fail without a backoff or a
// ForceRelease.
//
// Layouts still read because older versions wrote them. Kinds 2, 3 and 4,
// and payload hashes of 64 hex digits, are what the store wrote before the
// compact records; testdata/layout-v1.json holds one record of each state
// as that version wrote them, and TestUpgrade_layout_v1_reads reads them.
// The short layout (kinds 1 and 2 without rs and ra) is what the store
// wrote before Fail existed. Nothing writes them now; the next change
// rewrites such a record in a current layout. A record lives at most its
// lease + the retention after its last write, so they can stop being read
// once every store of a deployment has run a newer version for that long.
// A kind-4 record is never short.
//
// Upgrading. The previous version's scripts do not read kinds 5, 6 and 7:
// while both versions run on one prefix, its calls on a key that the new
// version processed or killed fail with ErrStoreUnavailable (the
// middleware nacks the message, which is retried), never with a wrong
// answer. Upgrade every consumer of a prefix together.
