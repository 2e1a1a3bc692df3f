package redisstore

import "github.com/redis/go-redis/v9"

// Each operation is one Lua script on one key (KEYS[1]), so it is atomic and
// runs on Redis Cluster. The record is a hash:
//
//	id  lease id: of the live or expired lease; after Complete the completing
//	    lease's; "" after Release or MarkProcessed
//	lu  lease deadline, 0 when released or processed
//	ln  length of the current lease
//	at  attempts (leases acquired)
//	pr  "1" when processed, else "0"
//	fs  first seen
//	ls  last seen
//	ow  owner of the latest acquisition
//	ph  first non-empty payload hash; absent while there is none (records of
//	    the first release hold "" instead: the scripts read both alike)
//	ex  logical expiry of the whole record
//
// Times and durations are integers of microseconds on the Redis clock (TIME),
// written as decimal strings that the scripts format themselves
// (string.format's %d): a Lua number handed to redis.call is formatted with
// %.17g, which cost Redis more than the rest of an HSET field. Every other
// field is always written, so the scripts of the first release, which a
// rolling upgrade runs next to these on the same keys, read these records
// too (layout_test.go checks both ways).
// The scripts compare ex with the clock, so a record past its logical expiry
// is absent whatever the physical TTL (PEXPIRE, set one millisecond past ex
// so Redis never drops a record before the scripts stop seeing it). Redis 7
// replicates scripts by their effects, so TIME is allowed before writes.

// clock is the common prelude: now in microseconds (Lua converts TIME's
// strings itself, cheaper than calls of tonumber), the key, and fmt.
const clock = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local k = KEYS[1]
local fmt = string.format
`

// expireAfter sets the physical TTL: d microseconds from now, rounded up to
// the next millisecond, plus one.
const expireAfter = `
local function expireAfter(d)
  redis.call('PEXPIRE', k, math.ceil(d / 1000) + 1)
end
`

// TryBegin: ARGV = lease id, lease (µs), retention (µs), owner, payload
// hash, physical TTL of a new record in milliseconds (lease + retention,
// rounded up, plus one: the client computes it, see ttlMillis). Reply: the
// lease deadline, an integer, when it acquired the key with the lease asked
// for and no payload mismatch (always so for a new key: the hot path, kept
// small); otherwise {status, lease until, lease, now, mismatch} with status
// 1 Acquired, 2 Processed, 3 Busy.
//
// A key without a live record, the common case, costs one HGET of ex, not
// an HMGET of the whole record, and the fields it writes are strings (a
// number passed to redis.call is formatted with %.17g, which costs Redis
// more than the whole HSET of a string field).
var tryBeginScript = redis.NewScript(clock + expireAfter + `
local id, owner, hash = ARGV[1], ARGV[4], ARGV[5]
local ex = tonumber(redis.call('HGET', k, 'ex'))
if ex == nil or ex <= now then
  if ex ~= nil then redis.call('DEL', k) end
  local lu = now + ARGV[2]
  local nows = fmt('%d', now)
  if hash == '' then
    redis.call('HSET', k, 'id', id, 'lu', fmt('%d', lu), 'ln', ARGV[2], 'at', '1', 'pr', '0', 'fs', nows, 'ls', nows, 'ow', owner, 'ex', fmt('%d', lu + ARGV[3]))
  else
    redis.call('HSET', k, 'id', id, 'lu', fmt('%d', lu), 'ln', ARGV[2], 'at', '1', 'pr', '0', 'fs', nows, 'ls', nows, 'ow', owner, 'ph', hash, 'ex', fmt('%d', lu + ARGV[3]))
  end
  redis.call('PEXPIRE', k, ARGV[6])
  return lu
end
local lease, ret = tonumber(ARGV[2]), tonumber(ARGV[3])
local r = redis.call('HMGET', k, 'pr', 'id', 'lu', 'ln', 'ph', 'at')
local ph = r[5] or ''
local mm = 0
if hash ~= '' and ph ~= '' and ph ~= hash then mm = 1 end
if r[1] == '1' then
  return {2, 0, 0, now, mm}
end
local lu = tonumber(r[3])
if lu > now then
  if r[2] ~= id then
    return {3, lu, 0, now, mm}
  end
  -- A retry by the holder: renew from now with the lease's own length.
  lease = tonumber(r[4])
  lu = now + lease
  redis.call('HSET', k, 'lu', fmt('%d', lu), 'ls', fmt('%d', now), 'ex', fmt('%d', lu + ret))
  expireAfter(lease + ret)
  return {1, lu, lease, now, mm}
end
lu = now + lease
local at = tonumber(r[6]) or 0
if ph == '' then ph = hash end
redis.call('HSET', k, 'id', id, 'lu', fmt('%d', lu), 'ln', ARGV[2], 'at', fmt('%d', at + 1), 'ls', fmt('%d', now), 'ow', owner, 'ph', ph, 'ex', fmt('%d', lu + ret))
expireAfter(lease + ret)
if mm == 0 then return lu end
return {1, lu, lease, now, mm}
`)

// Complete: ARGV = lease id, retention (µs), physical TTL of a processed
// record in milliseconds (the retention, rounded up, plus one). Reply: 1
// completed (now or before, by this lease), -1 no record, -2 another lease
// holds the key.
var completeScript = redis.NewScript(clock + `
local r = redis.call('HMGET', k, 'ex', 'id', 'pr')
local ex = tonumber(r[1])
if ex == nil or ex <= now then return -1 end
if r[2] ~= ARGV[1] then return -2 end
if r[3] == '1' then return 1 end
redis.call('HSET', k, 'pr', '1', 'lu', '0', 'ls', fmt('%d', now), 'ex', fmt('%d', now + ARGV[2]))
redis.call('PEXPIRE', k, ARGV[3])
return 1
`)

// Release: ARGV = lease id, retention (µs). Reply: 1 released, -1 no record,
// -2 another lease holds the key, -3 processed.
var releaseScript = redis.NewScript(clock + expireAfter + `
local r = redis.call('HMGET', k, 'ex', 'id', 'pr')
local ex = tonumber(r[1])
if ex == nil or ex <= now then return -1 end
if r[2] ~= ARGV[1] then return -2 end
if r[3] == '1' then return -3 end
local ret = tonumber(ARGV[2])
redis.call('HSET', k, 'id', '', 'lu', 0, 'ls', now, 'ex', now + ret)
expireAfter(ret)
return 1
`)

// Extend: ARGV = lease id, lease (µs), retention (µs). Reply: the new lease
// deadline, or -1, -2, -3 as for Release.
var extendScript = redis.NewScript(clock + expireAfter + `
local r = redis.call('HMGET', k, 'ex', 'id', 'pr')
local ex = tonumber(r[1])
if ex == nil or ex <= now then return -1 end
if r[2] ~= ARGV[1] then return -2 end
if r[3] == '1' then return -3 end
local lease, ret = tonumber(ARGV[2]), tonumber(ARGV[3])
local lu = now + lease
redis.call('HSET', k, 'ln', lease, 'lu', lu, 'ls', now, 'ex', lu + ret)
expireAfter(lease + ret)
return lu
`)

// Get: no ARGV. Reply: {0} when absent, else {1, now, processed, lease
// until, attempts, first seen, last seen, owner, payload hash}.
var getScript = redis.NewScript(clock + `
local r = redis.call('HMGET', k, 'ex', 'pr', 'lu', 'at', 'fs', 'ls', 'ow', 'ph')
local ex = tonumber(r[1])
if ex == nil or ex <= now then return {0} end
return {1, now, tonumber(r[2]) or -1, tonumber(r[3]) or -1, tonumber(r[4]) or -1, tonumber(r[5]) or -1, tonumber(r[6]) or -1, r[7] or '', r[8] or ''}
`)

// IsProcessed: no ARGV. Reply: 1 processed, 0 not.
var isProcessedScript = redis.NewScript(clock + `
local r = redis.call('HMGET', k, 'ex', 'pr')
local ex = tonumber(r[1])
if ex == nil or ex <= now or r[2] ~= '1' then return 0 end
return 1
`)

// MarkProcessed: ARGV = retention (µs). Reply: 1.
var markProcessedScript = redis.NewScript(clock + expireAfter + `
local ret = tonumber(ARGV[1])
local ex = tonumber(redis.call('HGET', k, 'ex'))
if ex == nil or ex <= now then
  if ex ~= nil then redis.call('DEL', k) end
  redis.call('HSET', k, 'id', '', 'lu', 0, 'ln', 0, 'at', 0, 'pr', 1, 'fs', now, 'ls', now, 'ow', '', 'ph', '', 'ex', now + ret)
else
  redis.call('HSET', k, 'id', '', 'lu', 0, 'pr', 1, 'ls', now, 'ex', now + ret)
end
expireAfter(ret)
return 1
`)
