package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
)

// The scripts of the first release (commit f35278f), verbatim, which wrote
// every field of a record and formatted numbers in Redis. A rolling upgrade
// runs them next to the current ones on the same keys, so each side must
// read the other's records.
const v1Clock = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local k = KEYS[1]
`

const v1ExpireAfter = `
local function expireAfter(d)
  redis.call('PEXPIRE', k, math.ceil(d / 1000) + 1)
end
`

var v1TryBegin = redis.NewScript(v1Clock + v1ExpireAfter + `
local id, lease, ret, owner, hash = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
local r = redis.call('HMGET', k, 'ex', 'pr', 'id', 'lu', 'ln', 'ph', 'at')
local ex = tonumber(r[1])
if ex == nil or ex <= now then
  if ex ~= nil then redis.call('DEL', k) end
  local lu = now + lease
  redis.call('HSET', k, 'id', id, 'lu', lu, 'ln', lease, 'at', 1, 'pr', 0, 'fs', now, 'ls', now, 'ow', owner, 'ph', hash, 'ex', lu + ret)
  expireAfter(lease + ret)
  return {1, lu, lease, now, 0}
end
local ph = r[6] or ''
local mm = 0
if hash ~= '' and ph ~= '' and ph ~= hash then mm = 1 end
if r[2] == '1' then
  return {2, 0, 0, now, mm}
end
local lu = tonumber(r[4])
if lu > now then
  if r[3] ~= id then
    return {3, lu, 0, now, mm}
  end
  -- A retry by the holder: renew from now with the lease's own length.
  lease = tonumber(r[5])
  lu = now + lease
  redis.call('HSET', k, 'lu', lu, 'ls', now, 'ex', lu + ret)
  expireAfter(lease + ret)
  return {1, lu, lease, now, mm}
end
lu = now + lease
local at = tonumber(r[7]) or 0
if ph == '' then ph = hash end
redis.call('HSET', k, 'id', id, 'lu', lu, 'ln', lease, 'at', at + 1, 'ls', now, 'ow', owner, 'ph', ph, 'ex', lu + ret)
expireAfter(lease + ret)
return {1, lu, lease, now, mm}
`)

var v1Complete = redis.NewScript(v1Clock + v1ExpireAfter + `
local r = redis.call('HMGET', k, 'ex', 'id', 'pr')
local ex = tonumber(r[1])
if ex == nil or ex <= now then return -1 end
if r[2] ~= ARGV[1] then return -2 end
if r[3] == '1' then return 1 end
local ret = tonumber(ARGV[2])
redis.call('HSET', k, 'pr', 1, 'lu', 0, 'ls', now, 'ex', now + ret)
expireAfter(ret)
return 1
`)

var v1Get = redis.NewScript(v1Clock + `
local r = redis.call('HMGET', k, 'ex', 'pr', 'lu', 'at', 'fs', 'ls', 'ow', 'ph')
local ex = tonumber(r[1])
if ex == nil or ex <= now then return {0} end
return {1, now, tonumber(r[2]) or -1, tonumber(r[3]) or -1, tonumber(r[4]) or -1, tonumber(r[5]) or -1, tonumber(r[6]) or -1, r[7] or '', r[8] or ''}
`)

// Records written by the first release's scripts are read by the current
// ones: a lease in flight stays fenced and renewable by its holder, an
// expired one keeps its history, a processed key stays processed.
func TestStore_reads_records_of_v1_scripts(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	ctx := context.Background()
	prefix := testPrefix(t, c)
	s := newStore(t, c, redisstore.Options{Prefix: prefix, Retention: time.Hour})
	const ret = "3600000000" // µs
	v1Begin := func(key, id, lease, owner, hash string) {
		t.Helper()
		r, err := v1TryBegin.Run(ctx, c, []string{prefix + key}, id, lease, ret, owner, hash).Slice()
		if err != nil || r[0] != int64(1) {
			t.Fatalf("v1 TryBegin(%q) = %v, %v", key, r, err)
		}
	}

	t.Run("in flight", func(t *testing.T) {
		v1Begin("a", "lease-1", "60000000", "old-owner", "")
		cl, err := s.TryBegin(ctx, "a", inbox.BeginOptions{LeaseID: "lease-2"})
		if err != nil || cl.Status != inbox.Busy || cl.RetryAfter <= 0 || cl.RetryAfter > time.Minute {
			t.Fatalf("TryBegin by another lease = %+v, %v; want Busy for up to a minute", cl, err)
		}
		cl, err = s.TryBegin(ctx, "a", inbox.BeginOptions{LeaseID: "lease-1", Lease: 5 * time.Second})
		if err != nil || cl.Status != inbox.Acquired || cl.Lease != time.Minute {
			t.Fatalf("TryBegin by the holder = %+v, %v; want Acquired with the lease's own length (1m)", cl, err)
		}
		r, err := s.Get(ctx, "a")
		if err != nil || r.State != inbox.StateInProgress || r.Attempts != 1 || r.Owner != "old-owner" || r.PayloadHash != "" || r.FirstSeen.IsZero() {
			t.Fatalf("Get = %+v, %v", r, err)
		}
		if err := s.Complete(ctx, "a", "lease-2"); err == nil {
			t.Fatal("Complete by another lease succeeded")
		}
		if err := s.Complete(ctx, "a", "lease-1"); err != nil {
			t.Fatal(err)
		}
		if cl, err := s.TryBegin(ctx, "a", inbox.BeginOptions{}); err != nil || cl.Status != inbox.Processed {
			t.Fatalf("TryBegin after Complete = %+v, %v", cl, err)
		}
	})

	t.Run("expired lease", func(t *testing.T) {
		v1Begin("b", "lease-1", "1000", "old-owner", "hash-1") // a lease of 1 ms
		first, err := s.Get(ctx, "b")
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); first.State != inbox.StateAvailable; {
			if time.Now().After(deadline) {
				t.Fatalf("the 1 ms lease never ended: %+v", first)
			}
			time.Sleep(time.Millisecond)
			if first, err = s.Get(ctx, "b"); err != nil {
				t.Fatal(err)
			}
		}
		cl, err := s.TryBegin(ctx, "b", inbox.BeginOptions{LeaseID: "lease-2", Owner: "new-owner", PayloadHash: "hash-2"})
		if err != nil || cl.Status != inbox.Acquired || !cl.PayloadMismatch {
			t.Fatalf("TryBegin = %+v, %v; want Acquired with a payload mismatch", cl, err)
		}
		r, err := s.Get(ctx, "b")
		if err != nil || r.State != inbox.StateInProgress || r.Attempts != 2 || !r.FirstSeen.Equal(first.FirstSeen) || r.Owner != "new-owner" || r.PayloadHash != "hash-1" {
			t.Fatalf("Get = %+v, %v; want attempt 2, first seen %v, the new owner, the first hash", r, err, first.FirstSeen)
		}
	})

	t.Run("processed", func(t *testing.T) {
		v1Begin("c", "lease-1", "60000000", "", "")
		if n, err := v1Complete.Run(ctx, c, []string{prefix + "c"}, "lease-1", ret).Int64(); err != nil || n != 1 {
			t.Fatalf("v1 Complete = %d, %v", n, err)
		}
		if cl, err := s.TryBegin(ctx, "c", inbox.BeginOptions{}); err != nil || cl.Status != inbox.Processed {
			t.Fatalf("TryBegin = %+v, %v; want Processed", cl, err)
		}
		if err := s.Complete(ctx, "c", "lease-1"); err != nil {
			t.Fatalf("Complete repeated by the completing lease: %v", err)
		}
		if ok, err := s.IsProcessed(ctx, "c"); err != nil || !ok {
			t.Fatalf("IsProcessed = %v, %v", ok, err)
		}
	})
}

// The other way round: the first release's scripts, still running on
// consumers not yet upgraded, read the records of the current ones (which
// leave out an empty payload hash and format numbers themselves).
func TestStore_v1_scripts_read_current_records(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	ctx := context.Background()
	prefix := testPrefix(t, c)
	s := newStore(t, c, redisstore.Options{Prefix: prefix, Retention: time.Hour})
	const ret = "3600000000" // µs
	if _, err := s.TryBegin(ctx, "k", inbox.BeginOptions{LeaseID: "lease-1", Owner: "new-owner", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	k := []string{prefix + "k"}
	g, err := v1Get.Run(ctx, c, k).Slice()
	if err != nil || len(g) != 9 || g[2] != int64(0) || g[4] != int64(1) || g[5] != g[6] || g[7] != "new-owner" || g[8] != "" {
		t.Fatalf("v1 Get = %v, %v; want in flight, attempt 1, first seen = last seen, the owner, no hash", g, err)
	}
	r, err := v1TryBegin.Run(ctx, c, k, "lease-2", "1000000", ret, "", "").Slice()
	if err != nil || r[0] != int64(3) {
		t.Fatalf("v1 TryBegin by another lease = %v, %v; want Busy (3)", r, err)
	}
	r, err = v1TryBegin.Run(ctx, c, k, "lease-1", "1000000", ret, "", "hash").Slice()
	if err != nil || r[0] != int64(1) || r[2] != int64(60000000) || r[4] != int64(0) {
		t.Fatalf("v1 TryBegin by the holder = %v, %v; want Acquired (1) with the lease's own length, no mismatch", r, err)
	}
	if n, err := v1Complete.Run(ctx, c, k, "lease-1", ret).Int64(); err != nil || n != 1 {
		t.Fatalf("v1 Complete = %d, %v", n, err)
	}
	if cl, err := s.TryBegin(ctx, "k", inbox.BeginOptions{}); err != nil || cl.Status != inbox.Processed {
		t.Fatalf("TryBegin after the v1 Complete = %+v, %v", cl, err)
	}
	g, err = v1Get.Run(ctx, c, k).Slice()
	if err != nil || len(g) != 9 || g[2] != int64(1) {
		t.Fatalf("v1 Get = %v, %v; want processed", g, err)
	}
}
