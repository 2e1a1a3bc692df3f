package redisstore

import "github.com/redis/go-redis/v9"

// The record of an inbox key is one Redis string: a few MessagePack values
// written one after the other (no array around them), so that a script
// reads them with one call of cmsgpack.unpack, which returns each as a Lua
// value. The first value is the kind of record, which says what follows:
//
//	kind 0, fresh: id, ow, ph, ln, ttl
//	kind 3, completed fresh: id, ow, ph, ln, ttl, E1, ttl2
//	kind 1, in flight, released or in a backoff: id, ow, ph, lu, ln, at, fs, ls, ex, rs, ra
//	kind 2, processed: the same fields as kind 1
//	kind 4, dead: the same fields as kind 1
//
// with
//
//	id   lease id: of the live or expired lease; after Complete the
//	     completing lease's; "" after Release, Fail, MarkProcessed or
//	     ForceRelease
//	ow   owner of the latest acquisition
//	ph   first non-empty payload hash, "" while there is none
//	lu   lease deadline, 0 when released, failed, processed or dead
//	ln   length of the current lease
//	at   attempts (leases acquired)
//	fs   first seen
//	ls   last seen
//	ex   logical expiry of the whole record
//	rs   reason of the latest Fail, "" when none
//	ra   retry at: the end of the backoff of the latest Fail, 0 when none;
//	     cleared by the next acquisition
//	ttl  the physical TTL, in milliseconds, the fresh record was written with
//	E1   the absolute expiry of the fresh record, in milliseconds
//	ttl2 the physical TTL, in milliseconds, the completed record was written
//	     with (the retention, rounded up)
//
// Strings are MessagePack str (fixstr, str 8, 16 or 32), numbers unsigned
// integers (the client writes positive fixint or uint 64, the scripts'
// cmsgpack.pack the smallest that fits). Times and durations are integers
// of microseconds on the Redis clock, except ttl, E1 and ttl2. A record of
// kind 1 or 2 without rs and ra (the layout before they were added) reads
// as rs "" and ra 0.
//
// Kinds 0 and 3 hold no time of their own: their times are derived from the
// key's absolute expiry E (PEXPIRETIME, milliseconds of the Redis clock,
// exact and the same for every reader), and they are live exactly as long as
// Redis holds the key (their logical expiry is E); they never hold a reason
// or a backoff (rs "", ra 0: a Fail writes kind 1 or 4). A record of kind
// 1, 2 or 4 holds its times, and is absent once the clock (TIME) reaches
// ex, whatever its physical TTL (set one millisecond past ex, so Redis
// never drops a record before the scripts stop seeing it). ex is lu plus
// the retention while a lease is in flight, max(now, ra) plus the
// retention after a Fail with a backoff, and now plus the retention after
// any other change (Complete, Release, a dead Fail, MarkProcessed,
// ForceRelease).
//
// A fresh record is what the client writes when it claims a key Redis does
// not hold, natively: SET key record NX PX ttl, pipelined with PEXPIRETIME
// key in the same round trip. It holds no time because the client does not
// know Redis's clock before it writes: it was acquired at
// a = (E - ttl) * 1000, the time of the SET rounded down to the millisecond;
// its lease deadline is a + ln; attempts 1; first and last seen a. The
// client computes the claim's ExpiresAt the same way from the PEXPIRETIME
// reply, so the claim, Busy replies and Get agree to the microsecond, and
// the lease ends at most a millisecond before ln has passed since the SET
// ran.
//
// A completed fresh record is what Complete writes over a fresh record, the
// message's usual path, with as little work as it can: the fresh record's
// bytes after its kind, then E1 (the fresh record's expiry, read with
// PEXPIRETIME) and ttl2, written with SET PX ttl2, no TIME and no decoding.
// It was processed at c = (E - ttl2) * 1000 (E its own expiry), the time of
// the SET rounded down to the millisecond: first seen (E1 - ttl) * 1000,
// last seen c, attempts 1. Every other change writes kind 1, 2 or 4.
//
// Each script is on one key (KEYS[1]), so it is atomic and runs on Redis
// Cluster; the fast claim's two commands are on one key too, so a Cluster
// pipeline sends them to the key's node in one round trip. Redis 7
// replicates scripts by their effects, so TIME is allowed before writes;
// PEXPIRETIME needs Redis 7.0 or later.

// clock is the common prelude: now in microseconds (Lua converts TIME's
// strings itself, cheaper than calls of tonumber), the key, load and save.
//
// load returns nil when the key has no live record, else kind, id, ow, ph,
// lu, ln, at, fs, ls, ex, rs, ra (kinds 0 and 3 converted as described
// above, kind 3 as kind 2). A value of another shape is an error reply
// naming it.
//
// save writes a record of kind 1, 2 or 4 with a physical TTL one
// millisecond past ex. Numbers handed to redis.call are formatted with
// %.17g, so the TTL is formatted here; cmsgpack.pack writes integral
// numbers as integers.
const clock = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local k = KEYS[1]
local function load()
  local v = redis.call('GET', k)
  if not v then return nil end
  local kind, id, ow, ph, x, y, at, fs, ls, ex, rs, ra = cmsgpack.unpack(v)
  if (kind == 0 or kind == 3) and type(id) == 'string' and type(x) == 'number' and type(y) == 'number' then
    -- x is the lease, y the TTL the fresh record was written with
    local e = redis.call('PEXPIRETIME', k)
    if e < 0 then return nil end
    if kind == 0 then
      local a = (e - y) * 1000
      return 0, id, ow, ph, a + x, x, 1, a, a, e * 1000, '', 0
    end
    if type(at) == 'number' and type(fs) == 'number' then
      -- at is the fresh record's expiry, fs the TTL of this one
      return 2, id, ow, ph, 0, x, 1, (at - y) * 1000, (e - fs) * 1000, e * 1000, '', 0
    end
  end
  if rs == nil and ra == nil then rs, ra = '', 0 end
  if (kind ~= 1 and kind ~= 2 and kind ~= 4) or type(id) ~= 'string' or type(ex) ~= 'number' or type(ra) ~= 'number' then
    return redis.error_reply('unexpected record of ' .. #v .. ' bytes under ' .. k)
  end
  if ex <= now then return nil end
  return kind, id, ow, ph, x, y, at, fs, ls, ex, rs, ra
end
local function save(kind, id, ow, ph, lu, ln, at, fs, ls, ex, rs, ra)
  redis.call('SET', k, cmsgpack.pack(kind, id, ow, ph, lu, ln, at, fs, ls, ex, rs, ra), 'PX', string.format('%d', math.ceil((ex - now) / 1000) + 1))
end
`

// checked makes a script return load's error reply, if any.
const checked = `
local kind, id, ow, ph, lu, ln, at, fs, ls, ex, rs, ra = load()
if type(kind) == 'table' then return kind end
`

// opsScript applies a sequence of operations to one key, in order: the
// TryBegin of a key that SET NX found, Complete, Release, Fail and
// MarkProcessed, alone or, when one batch carries several operations on a
// key, all of them in one call.
//
// ARGV = retention (µs), retention (ms, rounded up: ttl2), then the
// operations one after the other, each a code and its arguments:
//
//	B lease-id lease-µs owner payload-hash   TryBegin
//	C lease-id                               Complete
//	R lease-id                               Release
//	F lease-id retry-after-µs dead reason    Fail (dead "1" or "0")
//	M                                        MarkProcessed
//
// Replies, one per operation (one operation: its reply; several: an array
// of them):
//
//   - B: {status, until, lease, now, mismatch, attempts}, with status 1
//     Acquired (until the lease deadline, lease its length), 2 Processed, 3
//     Busy (until the end of the live lease or of the backoff), and for 4
//     Dead the reason as a seventh element.
//   - C: 1 completed (now or before, by this lease).
//   - R, F: 1 released, or failed.
//   - C, R, F: -1 no record, -2 another lease holds the key, -3 processed
//     (R, F), -4 dead.
//   - M: 1.
//
// A Complete alone takes a short way first: a fresh record of its lease
// becomes a completed fresh record (GET, PEXPIRETIME, SET; no TIME), and a
// completed fresh record of its lease answers 1 at once; anything else goes
// the common way below.
var opsScript = redis.NewScript(`
if #ARGV == 4 and ARGV[3] == 'C' then
  local v = redis.call('GET', KEYS[1])
  if v then
    local id = ARGV[4]
    local n = #id
    local h = string.char(217, n)
    if n < 32 then h = string.char(160 + n) end
    if string.sub(v, 2, 1 + #h + n) == h .. id then
      local kind = string.byte(v)
      if kind == 0 then
        local e = redis.call('PEXPIRETIME', KEYS[1])
        if e > 0 then
          redis.call('SET', KEYS[1], '\3' .. string.sub(v, 2) .. cmsgpack.pack(e, tonumber(ARGV[2])), 'PX', ARGV[2])
          return 1
        end
      elseif kind == 3 then
        return 1
      end
    end
  end
end
` + clock + `
local ret = tonumber(ARGV[1])

local function begin(lid, lease, owner, hash)
  local kind, id, ow, ph, lu, ln, at, fs, ls, ex, rs, ra = load()
  if type(kind) == 'table' then return kind end
  if kind == nil then
    lu = now + lease
    save(1, lid, owner, hash, lu, lease, 1, now, now, lu + ret, '', 0)
    return {1, lu, lease, now, 0, 1}
  end
  local mm = 0
  if hash ~= '' and ph ~= '' and ph ~= hash then mm = 1 end
  if kind == 2 then return {2, 0, 0, now, mm, at} end
  if kind == 4 then return {4, 0, 0, now, mm, at, rs} end
  if lu > now then
    if id ~= lid then return {3, lu, 0, now, mm, at} end
    -- A retry by the holder: renew from now with the lease's own length.
    lu = now + ln
    save(1, id, ow, ph, lu, ln, at, fs, now, lu + ret, rs, 0)
    return {1, lu, ln, now, mm, at}
  end
  -- A failed attempt's backoff: busy for every caller until it ends.
  if ra > now then return {3, ra, 0, now, mm, at} end
  lu = now + lease
  if ph == '' then ph = hash end
  save(1, lid, owner, ph, lu, lease, at + 1, fs, now, lu + ret, rs, 0)
  return {1, lu, lease, now, mm, at + 1}
end

-- holder returns the record if lid holds the key, else the error code.
local function holder(lid)
  local kind, id, ow, ph, lu, ln, at, fs, ls, ex, rs, ra = load()
  if type(kind) == 'table' then return kind end
  if kind == nil then return -1 end
  if kind == 4 then return -4 end
  if id ~= lid then return -2 end
  return kind, id, ow, ph, lu, ln, at, fs, ls, ex, rs, ra
end

local function complete(lid)
  local kind, id, ow, ph, lu, ln, at, fs, ls, ex, rs = holder(lid)
  if type(kind) ~= 'number' or kind < 0 then return kind end
  if kind == 2 then return 1 end
  save(2, id, ow, ph, 0, ln, at, fs, now, now + ret, rs, 0)
  return 1
end

local function release(lid)
  local kind, id, ow, ph, lu, ln, at, fs, ls, ex, rs = holder(lid)
  if type(kind) ~= 'number' or kind < 0 then return kind end
  if kind == 2 then return -3 end
  save(1, '', ow, ph, 0, ln, at, fs, now, now + ret, rs, 0)
  return 1
end

local function fail(lid, after, dead, reason)
  local kind, id, ow, ph, lu, ln, at, fs = holder(lid)
  if type(kind) ~= 'number' or kind < 0 then return kind end
  if kind == 2 then return -3 end
  if dead == '1' then
    save(4, '', ow, ph, 0, ln, at, fs, now, now + ret, reason, 0)
  elseif after > 0 then
    save(1, '', ow, ph, 0, ln, at, fs, now, now + after + ret, reason, now + after)
  else
    save(1, '', ow, ph, 0, ln, at, fs, now, now + ret, reason, 0)
  end
  return 1
end

local function mark()
  local kind, id, ow, ph, lu, ln, at, fs, ls, ex, rs = load()
  if type(kind) == 'table' then return kind end
  if kind == nil then
    save(2, '', '', '', 0, 0, 0, now, now, now + ret, '', 0)
  else
    save(2, '', ow, ph, 0, ln, at, fs, now, now + ret, rs, 0)
  end
  return 1
end

local out = {}
local i = 3
while i <= #ARGV do
  local op, r = ARGV[i], nil
  if op == 'B' then
    r = begin(ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3], ARGV[i + 4])
    i = i + 5
  elseif op == 'C' then
    r = complete(ARGV[i + 1])
    i = i + 2
  elseif op == 'R' then
    r = release(ARGV[i + 1])
    i = i + 2
  elseif op == 'F' then
    r = fail(ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3], ARGV[i + 4])
    i = i + 5
  elseif op == 'M' then
    r = mark()
    i = i + 1
  else
    return redis.error_reply('unknown operation ' .. tostring(op))
  end
  if type(r) == 'table' and r.err then return r end
  out[#out + 1] = r
end
if #out == 1 then return out[1] end
return out
`)

// Extend: ARGV = lease id, lease (µs), retention (µs). Reply: the new lease
// deadline, or -1 no record, -2 another lease holds the key, -3 processed,
// -4 dead.
var extendScript = redis.NewScript(clock + checked + `
if kind == nil then return -1 end
if kind == 4 then return -4 end
if id ~= ARGV[1] then return -2 end
if kind == 2 then return -3 end
local lease = tonumber(ARGV[2])
lu = now + lease
save(1, id, ow, ph, lu, lease, at, fs, now, lu + ARGV[3], rs, 0)
return lu
`)

// Get: no ARGV. Reply: {0} when absent, else {1, now, kind, lease until,
// attempts, first seen, last seen, owner, payload hash, reason, retry at},
// kind 0 or 1 (in flight or available), 2 (processed) or 4 (dead). List
// reads each record with it too.
var getScript = redis.NewScript(clock + checked + `
if kind == nil then return {0} end
return {1, now, kind, lu, at, fs, ls, ow, ph, rs, ra}
`)

// ForceRelease: ARGV = retention (µs). A live lease or a running backoff
// ends: the record becomes available now (lease id cleared, attempts and
// reason kept), kept for the retention. Reply: 1 released, 0 nothing to
// release (absent, processed, dead, or neither leased nor backing off).
var forceReleaseScript = redis.NewScript(clock + checked + `
if kind == nil or kind == 2 or kind == 4 then return 0 end
if lu <= now and ra <= now then return 0 end
save(1, '', ow, ph, 0, ln, at, fs, now, now + ARGV[1], rs, 0)
return 1
`)
