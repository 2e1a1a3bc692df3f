package redisstore

import "github.com/redis/go-redis/v9"

// Each script is on one key (KEYS[1]), so it is atomic and runs on Redis
// Cluster, but for the order of order keys (gates: the operations O and G
// of opsScript, orderScript and releaseOrderScript), which also read the
// records of other keys and is kept only where that is allowed (not on
// Cluster). Redis 7 replicates scripts by their effects, so TIME is allowed
// before writes; PEXPIRETIME needs Redis 7.0 or later. The records they
// read and write are described in "Record layouts" in doc.go.

// clock is the common prelude of the scripts: now in microseconds (Lua
// converts TIME's strings itself, cheaper than calls of tonumber), the key,
// and the scripts' side of the record codec: hash, fp, decode, load, save,
// processed and dead.
//
// decode returns the values of a record's bytes v, in any layout, or
// nothing when v is not a record: kind and the values of its layout (a
// record of ten values with rs "" and ra 0 added).
//
// load returns nil when the key (KEYS[1], or the Redis key it is given)
// has no live record, else kind, id, ow, ph,
// lu, ln, at, fs, ls, ex, rs, ra: a fresh record as kind 0, a completed one
// and a compact processed one as kind 2, a compact dead one as kind 4,
// their expiry from PEXPIRETIME; the id of a compact processed record is
// NUL and its lease fingerprint (fp). A payload hash of an older record
// that is 64 lowercase hex digits reads in its compact form (hash). A
// value that is not a record is an error reply naming it.
//
// hash returns a payload hash in its compact form, fp the fingerprint of a
// lease id ("Record layouts" in doc.go; compactHash and fingerprint in
// record.go are the client's).
//
// save writes a record of kind 1 in the full layout, with a physical TTL
// one millisecond past ex. Numbers handed to redis.call are formatted with
// %.17g, so the TTL is formatted here; cmsgpack.pack writes integral
// numbers as integers, the smallest format that fits.
//
// processed and dead write the compact records (kinds 5 and 6) as of now,
// for the retention ttl (ms, a string).
const clock = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local k = KEYS[1]
local function hash(ph)
  if #ph == 64 and not string.find(ph, '[^0-9a-f]') then
    return '\0' .. struct.pack('>I4I4I4I4', tonumber(string.sub(ph, 1, 8), 16), tonumber(string.sub(ph, 9, 16), 16),
      tonumber(string.sub(ph, 17, 24), 16), tonumber(string.sub(ph, 25, 32), 16))
  end
  return ph
end
local function fp(lid)
  local h = redis.sha1hex(lid)
  return struct.pack('>I4I4', tonumber(string.sub(h, 1, 8), 16), tonumber(string.sub(h, 9, 16), 16))
end
local function decode(v)
  local kind, a, b, c, x, y, at, fs, ls, ex, rs, ra, z = cmsgpack.unpack(v)
  if kind == 5 or kind == 6 or kind == 7 then
    if type(a) ~= 'number' or type(b) ~= 'number' or type(c) ~= 'number' or type(x) ~= 'string' or type(y) ~= 'string' then return end
    if kind ~= 6 and at == nil then return kind, a, b, c, x, y end
    if kind == 6 and type(at) == 'string' and fs == nil then return kind, a, b, c, x, y, at end
    return
  end
  local id, ow, ph = a, b, c
  if type(id) ~= 'string' or type(ow) ~= 'string' or type(ph) ~= 'string' or type(x) ~= 'number' or type(y) ~= 'number' then return end
  if kind == 0 then
    if at == nil then return kind, id, ow, ph, x, y end
  elseif kind == 3 then
    if type(at) == 'number' and type(fs) == 'number' and ls == nil then return kind, id, ow, ph, x, y, at, fs end
  elseif (kind == 1 or kind == 2 or kind == 4) and type(at) == 'number' and type(fs) == 'number' and type(ls) == 'number' and type(ex) == 'number' and z == nil then
    if type(rs) == 'string' and type(ra) == 'number' then return kind, id, ow, ph, x, y, at, fs, ls, ex, rs, ra end
    if rs == nil and kind ~= 4 then return kind, id, ow, ph, x, y, at, fs, ls, ex, '', 0 end
  end
end
local function load(key)
  key = key or k
  local v = redis.call('GET', key)
  if not v then return nil end
  local kind, id, ow, ph, x, y, at, fs, ls, ex, rs, ra = decode(v)
  if kind == nil then
    return redis.error_reply('unexpected record of ' .. #v .. ' bytes under ' .. key)
  end
  if kind >= 5 then
    -- kind 5: at fs d ph fp; kind 6: at fs d ph ow rs; kind 7: at fs ttl2 ph fp
    local e = redis.call('PEXPIRETIME', key)
    if e < 0 then return nil end
    if kind ~= 6 then
      if y ~= '' then y = '\0' .. y end
      local ls = ow + ph
      if kind == 7 then ls = (e - ph) * 1000 end
      return 2, y, '', x, 0, 0, id, ow, ls, e * 1000, '', 0
    end
    return 4, '', y, x, 0, 0, id, ow, ow + ph, e * 1000, at, 0
  end
  ph = hash(ph)
  if kind == 0 or kind == 3 then
    -- x is the lease, y the TTL the fresh record was written with
    local e = redis.call('PEXPIRETIME', key)
    if e < 0 then return nil end
    if kind == 0 then
      local a = (e - y) * 1000
      return 0, id, ow, ph, a + x, x, 1, a, a, e * 1000, '', 0
    end
    -- at is the fresh record's expiry, fs the TTL of this one
    return 2, id, ow, ph, 0, x, 1, (at - y) * 1000, (e - fs) * 1000, e * 1000, '', 0
  end
  if ex <= now then return nil end
  return kind, id, ow, ph, x, y, at, fs, ls, ex, rs, ra
end
local function save(kind, id, ow, ph, lu, ln, at, fs, ls, ex, rs, ra)
  redis.call('SET', k, cmsgpack.pack(kind, id, ow, ph, lu, ln, at, fs, ls, ex, rs, ra), 'PX', string.format('%d', math.ceil((ex - now) / 1000) + 1))
end
local function processed(at, fs, ph, f, ttl)
  redis.call('SET', k, cmsgpack.pack(5, at, fs, math.max(now - fs, 0), ph, f), 'PX', ttl)
end
local function dead(at, fs, ph, ow, rs, ttl)
  redis.call('SET', k, cmsgpack.pack(6, at, fs, math.max(now - fs, 0), ph, ow, rs), 'PX', ttl)
end
`

// checked makes a script return load's error reply, if any.
const checked = `
local kind, id, ow, ph, lu, ln, at, fs, ls, ex, rs, ra = load()
if type(kind) == 'table' then return kind end
`

// gates is the scripts' side of the order of order keys ("Order keys" in
// doc.go), after clock. The gate of an order key is a Redis list of inbox
// keys (without the prefix pre), its head at index 0 and the keys waiting
// behind it after, with the TTL gttl (ms, a string) from its last change.
// These scripts touch keys they are not given in KEYS (the heads' records),
// which only a server that is no Cluster allows: the store keeps order
// only over a *redis.Client.
//
// advance moves the gate g past the heads whose record is processed and
// returns its head, nil when no key is left (Redis drops an empty list),
// and, when the head's record is in a failed attempt's backoff, the end
// of the backoff, else 0; or load's error reply.
const gates = `
local function advance(g, pre, gttl)
  local moved = false
  while true do
    local h = redis.call('LINDEX', g, 0)
    if not h then return nil, 0 end
    local kind, id, ow, ph, lu, ln, at, fs, ls, ex, rs, ra = load(pre .. h)
    if type(kind) == 'table' then return kind end
    if kind ~= 2 then
      if moved then redis.call('PEXPIRE', g, gttl) end
      if kind ~= nil and lu <= now and ra > now then return h, ra end
      return h, 0
    end
    redis.call('LPOP', g)
    moved = true
  end
end
`

// opsScript applies a sequence of operations to one key, in order: the
// TryBegin of a key that SET NX found, Complete, Release, Fail and
// MarkProcessed, alone or, when one batch carries several operations on a
// key, all of them in one call.
//
// ARGV = retention (µs), retention (ms, rounded up), then the operations
// one after the other, each a code and its arguments:
//
//	B lease-id lease-µs owner payload-hash   TryBegin
//	C lease-id                               Complete
//	R lease-id                               Release
//	F lease-id retry-after-µs dead reason    Fail (dead "1" or "0")
//	M                                        MarkProcessed
//	K lease-id fresh compact                 Complete, knowing its claim
//	E lease-id lease-µs                      Extend
//	O lease-id lease-µs owner payload-hash gate prefix gate-ttl-ms
//	                                         TryBegin with an order key
//	G lease-id retry-after-µs dead reason gate prefix gate-ttl-ms
//	                                         Fail with an order key
//
// Replies, one per operation (one operation: its reply; several: an array
// of them):
//
//   - B: {status, until, lease, now, mismatch, attempts}, with status 1
//     Acquired (until the lease deadline, lease its length), 2 Processed, 3
//     Busy on a live lease (until its end), 5 Busy in a failed attempt's
//     backoff (until its end: Claim.BackingOff), and for 4 Dead the reason
//     as a seventh element. O replies as B, or 6 Behind (until the end
//     of the head's backoff, 0 when it is not backing off; attempts those
//     of the key's own record, if any).
//   - C, K: 1 completed (now or before, by this lease).
//   - R, F, G: 1 released, or failed.
//   - E: the new lease deadline.
//   - C, K, R, F, G, E: -1 no record, -2 another lease holds the key, -3
//     processed (R, F, E), -4 dead.
//   - M: 1.
//
// A K alone takes a short way first ("Record layouts" in doc.go). It
// carries the fresh record its claim wrote and the compact processed
// record (kind 7) that replaces it, both made by the client from the
// claim: when the key holds the fresh record, it gets the compact one
// (GET, SET: the fenced mark at its least), and when it holds a compact
// processed record that ends with this lease's fingerprint, it answers 1.
// A C, or a K that finds anything else, takes the common way below.
var opsScript = redis.NewScript(`
if #ARGV == 6 and ARGV[3] == 'K' then
  local v = redis.call('GET', KEYS[1])
  if v == ARGV[5] then
    redis.call('SET', KEYS[1], ARGV[6], 'PX', ARGV[2])
    return 1
  end
  if v and (string.byte(v) == 7 or string.byte(v) == 5) and string.sub(v, -9) == string.sub(ARGV[6], -9) then return 1 end
end
` + clock + gates + `
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
  if ra > now then return {5, ra, 0, now, mm, at} end
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
  if id ~= lid and (string.byte(id) ~= 0 or id ~= '\0' .. fp(lid)) then return -2 end
  return kind, id, ow, ph, lu, ln, at, fs, ls, ex, rs, ra
end

local function complete(lid)
  local kind, id, ow, ph, lu, ln, at, fs, ls, ex, rs = holder(lid)
  if type(kind) ~= 'number' or kind < 0 then return kind end
  if kind == 2 then return 1 end
  processed(at, fs, ph, fp(lid), ARGV[2])
  return 1
end

local function release(lid)
  local kind, id, ow, ph, lu, ln, at, fs, ls, ex, rs = holder(lid)
  if type(kind) ~= 'number' or kind < 0 then return kind end
  if kind == 2 then return -3 end
  save(1, '', ow, ph, 0, ln, at, fs, now, now + ret, rs, 0)
  return 1
end

local function fail(lid, after, isDead, reason)
  local kind, id, ow, ph, lu, ln, at, fs = holder(lid)
  if type(kind) ~= 'number' or kind < 0 then return kind end
  if kind == 2 then return -3 end
  if isDead == '1' then
    dead(at, fs, ph, ow, reason, ARGV[2])
  elseif after > 0 then
    save(1, '', ow, ph, 0, ln, at, fs, now, now + after + ret, reason, now + after)
  else
    save(1, '', ow, ph, 0, ln, at, fs, now, now + ret, reason, 0)
  end
  return 1
end

-- ordered is begin with the order key of the gate g: a key that is not
-- processed or dead waits behind another head (Behind, queued once,
-- its record untouched).
local function ordered(lid, lease, owner, hash, g, pre, gttl)
  local kind, id, ow, ph, lu, ln, at = load()
  if type(kind) == 'table' then return kind end
  if kind ~= 2 and kind ~= 4 then
    local h, ua = advance(g, pre, gttl)
    if type(h) == 'table' then return h end
    local key = string.sub(k, #pre + 1)
    if h and h ~= key then
      if not redis.call('LPOS', g, key) then
        redis.call('RPUSH', g, key)
        redis.call('PEXPIRE', g, gttl)
      end
      local mm, n = 0, 0
      if kind ~= nil then
        n = at
        if hash ~= '' and ph ~= '' and ph ~= hash then mm = 1 end
      end
      return {6, ua, 0, now, mm, n}
    end
  end
  return begin(lid, lease, owner, hash)
end

-- failOrdered is fail with the order key of the gate g: the key heads the
-- gate, opened if there is none (one headed by another key is left as
-- it is).
local function failOrdered(lid, after, isDead, reason, g, pre, gttl)
  local r = fail(lid, after, isDead, reason)
  if r ~= 1 then return r end
  local h = advance(g, pre, gttl)
  if type(h) == 'table' then return h end
  local key = string.sub(k, #pre + 1)
  if h == nil then
    redis.call('RPUSH', g, key)
    redis.call('PEXPIRE', g, gttl)
  elseif h == key then
    redis.call('PEXPIRE', g, gttl)
  end
  return 1
end

local function extend(lid, lease)
  local kind, id, ow, ph, lu, ln, at, fs, ls, ex, rs = holder(lid)
  if type(kind) ~= 'number' or kind < 0 then return kind end
  if kind == 2 then return -3 end
  lu = now + lease
  save(1, id, ow, ph, lu, lease, at, fs, ls, lu + ret, rs, 0)
  return lu
end

local function mark()
  local kind, id, ow, ph, lu, ln, at, fs, ls, ex, rs = load()
  if type(kind) == 'table' then return kind end
  if kind == nil then
    processed(0, now, '', '', ARGV[2])
  else
    processed(at, fs, ph, '', ARGV[2])
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
  elseif op == 'K' then
    r = complete(ARGV[i + 1])
    i = i + 4
  elseif op == 'E' then
    r = extend(ARGV[i + 1], tonumber(ARGV[i + 2]))
    i = i + 3
  elseif op == 'R' then
    r = release(ARGV[i + 1])
    i = i + 2
  elseif op == 'F' then
    r = fail(ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3], ARGV[i + 4])
    i = i + 5
  elseif op == 'O' then
    r = ordered(ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6], ARGV[i + 7])
    i = i + 8
  elseif op == 'G' then
    r = failOrdered(ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6], ARGV[i + 7])
    i = i + 8
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

// Order: KEYS[1] the gate of an order key, ARGV = prefix, gate TTL (ms).
// The gate moves past its processed heads ("gates"). Reply: the gate's
// keys, head first; none when it has no gate.
var orderScript = redis.NewScript(clock + gates + `
local h = advance(k, ARGV[1], ARGV[2])
if type(h) == 'table' then return h end
if h == nil then return {} end
return redis.call('LRANGE', k, 0, -1)
`)

// ReleaseOrder: KEYS[1] the gate of an order key, ARGV = prefix, gate TTL
// (ms), head. When head heads the gate (past its processed heads), the
// next key does. Reply: 1 released, 0 no gate, else the gate's head.
var releaseOrderScript = redis.NewScript(clock + gates + `
local h = advance(k, ARGV[1], ARGV[2])
if type(h) == 'table' then return h end
if h == nil then return 0 end
if h ~= ARGV[3] then return h end
redis.call('LPOP', k)
redis.call('PEXPIRE', k, ARGV[2])
return 1
`)
