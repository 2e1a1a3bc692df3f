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
// "inbox:"), holding its record in MessagePack; its TTL is lease +
// retention while a lease is in flight, the end of a failed attempt's
// backoff + retention, and the retention once it is processed, released or
// dead. Expiry is logical, in Lua scripts that read
// Redis's TIME, so deadlines come from the Redis clock and consumers with
// skewed clocks agree; the TTL only cleans up. The claim of a new key is a
// native SET NX PX (with PEXPIRETIME, one round trip), a key that exists a
// script, in a second round trip (a claim with [inbox.BeginOptions.Retry],
// a copy of a failed attempt, goes to the script at once); every operation
// touches one key, so it is atomic, on Cluster too.
// The store owns every key under its prefix: a value it did not write there
// is an error wrapping [inbox.ErrStoreUnavailable], never overwritten.
// Leases and retention are kept in whole microseconds and are at most
// [MaxDuration] (100 years). Needs Redis 7.0 or later (PEXPIRETIME), and
// EVALSHA, EVAL, SET and PEXPIRETIME on the prefix's keys.
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
// another namespace's apple:1), timeout (per call), conn_check and cluster
// (an addr parameter implies it; a Cluster URL names no database, or 0).
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
// under the prefix, writing nothing live. A mistake of configuration wraps
// [stores.ErrMisconfigured] and [inbox.ErrStoreUnavailable] and says what to
// fix, for example:
//
//	redis store: authentication failed for user default at 127.0.0.1:6390: check the user and password in the URL (WRONGPASS ...)
//	redis store: 127.0.0.1:7000 is a Redis Cluster node: add cluster=true to the URL (or addr=... for more seed nodes)
//
// A server that does not answer wraps [inbox.ErrStoreUnavailable] only.
// check=false sends nothing at Open. [New] takes the caller's client as it
// is and sends nothing: it checks only its options.
//
// # Durability
//
// The store is exactly as durable as the Redis under it: with appendonly
// yes and appendfsync always, no acknowledged mark or lease is lost on a
// crash; with everysec the last second can be; without persistence a
// restart forgets every key; a failover can lose the writes the replica had
// not received.
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
// TIME, decoding or encoding. Both were measured (BENCHMARKS.md, "Record
// layouts for speed"): writing the full layout instead costs, on Kafka
// through cmd/inboxbench, 17 to 19 percent more Redis CPU per message
// without kind 3 (the throughput moved within its noise), and about a quarter of the throughput and 50 to 70 percent more
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
// existed. Nothing writes it now; the scripts read it as rs ""
// and ra 0 and the next change rewrites it in the full layout. A short
// record lives at most its lease + the retention after its last write, so
// it can stop being read once every store of a deployment has run a newer
// version for that long. A kind-4 record is never short.
