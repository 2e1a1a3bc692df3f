package redisstore

import "github.com/redis/go-redis/v9"

// The record of an inbox key is one Redis string: a few MessagePack values
// written one after the other (no array around them), so that a script
// reads them with one call of cmsgpack.unpack, which returns each as a Lua
// value, and writes them with one call of cmsgpack.pack. The first value is
// the kind of record, which says what follows:
//
//	kind 0, fresh: id, ow, ph, ln, ttl
//	kind 1, in flight or released: id, ow, ph, lu, ln, at, fs, ls, ex
//	kind 2, processed: the same fields as kind 1
//
// with
//
//	id   lease id: of the live or expired lease; after Complete the
//	     completing lease's; "" after Release or MarkProcessed
//	ow   owner of the latest acquisition
//	ph   first non-empty payload hash, "" while there is none
//	lu   lease deadline, 0 when released or processed
//	ln   length of the current lease
//	at   attempts (leases acquired)
//	fs   first seen
//	ls   last seen
//	ex   logical expiry of the whole record
//	ttl  the physical TTL, in milliseconds, the fresh record was written with
//
// Strings are MessagePack str (fixstr, str 8, 16 or 32), numbers unsigned
// integers (positive fixint or uint 64). Times and durations are integers of
// microseconds on the Redis clock, except ttl.
//
// A fresh record is what the client writes when it claims a key Redis does
// not hold, natively: SET key record NX PX ttl, pipelined with PEXPIRETIME
// key in the same round trip. It holds no time, because the client does not
// know Redis's clock before it writes; its times are derived from the key's
// absolute expiry E (PEXPIRETIME, milliseconds of the Redis clock, exact and
// the same for every reader): acquired at a = (E - ttl) * 1000, which is the
// time of the SET rounded down to the millisecond; lease deadline a + ln;
// attempts 1; first and last seen a; logical expiry E * 1000 (for this kind
// the physical and logical expiry are one). The client computes the claim's
// ExpiresAt the same way from the PEXPIRETIME reply, so the claim, Busy
// replies and Get agree to the microsecond, and the lease ends at most a
// millisecond before ln has passed since the SET ran. Every script that
// changes a fresh record writes it as kind 1 or 2.
//
// Each script is on one key (KEYS[1]), so it is atomic and runs on Redis
// Cluster; the fast claim's two commands are on one key too, so a Cluster
// pipeline sends them to the key's node in one round trip. The scripts
// compare ex with the clock (TIME), so a record past its logical expiry is
// absent whatever the physical TTL (set one millisecond past ex when a
// script writes, so Redis never drops a record before the scripts stop
// seeing it). Redis 7 replicates scripts by their effects, so TIME is
// allowed before writes; PEXPIRETIME needs Redis 7.0 or later.

// clock is the common prelude: now in microseconds (Lua converts TIME's
// strings itself, cheaper than calls of tonumber), the key, fmt, load and
// save.
//
// load returns nil when the key has no live record, else kind, id, ow, ph,
// lu, ln, at, fs, ls, ex (a fresh record converted as described above). A
// value of another shape is an error reply naming it.
//
// save writes a record of kind 1 or 2 with the physical TTL px (a string of
// milliseconds), or, when px is nil, one millisecond past ex. Numbers
// handed to redis.call are formatted with %.17g, so the TTL is formatted
// here; cmsgpack.pack writes integral numbers as integers.
const clock = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local k = KEYS[1]
local fmt = string.format
local function load()
  local v = redis.call('GET', k)
  if not v then return nil end
  local kind, id, ow, ph, x, y, at, fs, ls, ex = cmsgpack.unpack(v)
  if kind == 0 and type(id) == 'string' and type(x) == 'number' and type(y) == 'number' then
    -- fresh: x is the lease, y the TTL it was written with
    local e = redis.call('PEXPIRETIME', k)
    if e < 0 or e * 1000 <= now then return nil end
    local a = (e - y) * 1000
    return 0, id, ow, ph, a + x, x, 1, a, a, e * 1000
  end
  if (kind ~= 1 and kind ~= 2) or type(id) ~= 'string' or type(ex) ~= 'number' then
    return redis.error_reply('unexpected record of ' .. #v .. ' bytes under ' .. k)
  end
  if ex <= now then return nil end
  return kind, id, ow, ph, x, y, at, fs, ls, ex
end
local function save(kind, id, ow, ph, lu, ln, at, fs, ls, ex, px)
  redis.call('SET', k, cmsgpack.pack(kind, id, ow, ph, lu, ln, at, fs, ls, ex), 'PX', px or fmt('%d', math.ceil((ex - now) / 1000) + 1))
end
`

// checked makes a script return load's error reply, if any.
const checked = `
local kind, id, ow, ph, lu, ln, at, fs, ls, ex = load()
if type(kind) == 'table' then return kind end
`

// TryBegin, for a key that SET NX found (or when the fast claim cannot be
// used): ARGV = lease id, lease (µs), retention (µs), owner, payload hash,
// physical TTL of a new record in milliseconds (lease + retention, rounded
// up, plus one: the client computes it, see ttlMillis). Reply: the lease
// deadline, an integer, when it acquired the key with the lease asked for
// and no payload mismatch; otherwise {status, lease until, lease, now,
// mismatch} with status 1 Acquired, 2 Processed, 3 Busy.
var tryBeginScript = redis.NewScript(clock + checked + `
local lid, owner, hash = ARGV[1], ARGV[4], ARGV[5]
local lease, ret = tonumber(ARGV[2]), tonumber(ARGV[3])
if kind == nil then
  lu = now + lease
  save(1, lid, owner, hash, lu, lease, 1, now, now, lu + ret, ARGV[6])
  return lu
end
local mm = 0
if hash ~= '' and ph ~= '' and ph ~= hash then mm = 1 end
if kind == 2 then
  return {2, 0, 0, now, mm}
end
if lu > now then
  if id ~= lid then
    return {3, lu, 0, now, mm}
  end
  -- A retry by the holder: renew from now with the lease's own length.
  lu = now + ln
  save(1, id, ow, ph, lu, ln, at, fs, now, lu + ret)
  return {1, lu, ln, now, mm}
end
lu = now + lease
if ph == '' then ph = hash end
save(1, lid, owner, ph, lu, lease, at + 1, fs, now, lu + ret, ARGV[6])
if mm == 0 then return lu end
return {1, lu, lease, now, mm}
`)

// Complete: ARGV = lease id, retention (µs), physical TTL of a processed
// record in milliseconds (the retention, rounded up, plus one). Reply: 1
// completed (now or before, by this lease), -1 no record, -2 another lease
// holds the key.
var completeScript = redis.NewScript(clock + checked + `
if kind == nil then return -1 end
if id ~= ARGV[1] then return -2 end
if kind == 2 then return 1 end
save(2, id, ow, ph, 0, ln, at, fs, now, now + ARGV[2], ARGV[3])
return 1
`)

// Release: ARGV = lease id, retention (µs), physical TTL as for Complete.
// Reply: 1 released, -1 no record, -2 another lease holds the key, -3
// processed.
var releaseScript = redis.NewScript(clock + checked + `
if kind == nil then return -1 end
if id ~= ARGV[1] then return -2 end
if kind == 2 then return -3 end
save(1, '', ow, ph, 0, ln, at, fs, now, now + ARGV[2], ARGV[3])
return 1
`)

// Extend: ARGV = lease id, lease (µs), retention (µs). Reply: the new lease
// deadline, or -1, -2, -3 as for Release.
var extendScript = redis.NewScript(clock + checked + `
if kind == nil then return -1 end
if id ~= ARGV[1] then return -2 end
if kind == 2 then return -3 end
local lease = tonumber(ARGV[2])
lu = now + lease
save(1, id, ow, ph, lu, lease, at, fs, now, lu + ARGV[3])
return lu
`)

// Get: no ARGV. Reply: {0} when absent, else {1, now, processed, lease
// until, attempts, first seen, last seen, owner, payload hash}.
var getScript = redis.NewScript(clock + checked + `
if kind == nil then return {0} end
local pr = 0
if kind == 2 then pr = 1 end
return {1, now, pr, lu, at, fs, ls, ow, ph}
`)

// IsProcessed: no ARGV. Reply: 1 processed, 0 not.
var isProcessedScript = redis.NewScript(clock + checked + `
if kind == 2 then return 1 end
return 0
`)

// MarkProcessed: ARGV = retention (µs), physical TTL as for Complete.
// Reply: 1.
var markProcessedScript = redis.NewScript(clock + checked + `
local ex = now + ARGV[1]
if kind == nil then
  save(2, '', '', '', 0, 0, 0, now, now, ex, ARGV[2])
else
  save(2, '', ow, ph, 0, ln, at, fs, now, ex, ARGV[2])
end
return 1
`)
