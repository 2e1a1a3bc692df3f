package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
	"github.com/watermill-inbox/inbox/stores/redis/internal/redistest"
)

// The record layouts ("Record layouts" in doc.go) pinned through the
// store's behaviour. The tests here name a record's values in the order of
// its layout, one after the other; rawRecord and packRecord convert them
// with the store's Go codec (codec_test.go checks it against the scripts').

// rawRecord returns the values of key's record in the order of its layout:
// strings as string, integers as int64.
func rawRecord(t *testing.T, c *redis.Client, key string) []any {
	t.Helper()
	b, err := c.Get(context.Background(), key).Bytes()
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	r, err := redisstore.DecodeRecord(b)
	if err != nil {
		t.Fatalf("record under %s: %v", key, err)
	}
	switch r.Kind {
	case redisstore.KindCompact:
		return []any{r.Kind, r.Attempts, r.FirstSeen, r.LastSeen - r.FirstSeen, r.PayloadHash, r.ID}
	case redisstore.KindMarked:
		return []any{r.Kind, r.Attempts, r.FirstSeen, r.TTL2, r.PayloadHash, r.ID}
	case redisstore.KindTomb:
		return []any{r.Kind, r.Attempts, r.FirstSeen, r.LastSeen - r.FirstSeen, r.PayloadHash, r.Owner, r.Reason}
	}
	v := []any{r.Kind, r.ID, r.Owner, r.PayloadHash}
	switch r.Kind {
	case redisstore.KindFresh:
		return append(v, r.Lease, r.TTL)
	case redisstore.KindCompleted:
		return append(v, r.Lease, r.TTL, r.FreshExpiry, r.TTL2)
	}
	v = append(v, r.Until, r.Lease, r.Attempts, r.FirstSeen, r.LastSeen, r.Expiry)
	if r.Short {
		return v
	}
	return append(v, r.Reason, r.RetryAt)
}

// packRecord encodes the values of a record, in the order of its layout,
// with the store's Go codec.
func packRecord(vals ...any) []byte {
	str := func(i int) string { return vals[i].(string) }
	num := func(i int) int64 { return vals[i].(int64) }
	switch k := num(0); k {
	case redisstore.KindCompact, redisstore.KindTomb:
		r := redisstore.Record{Kind: k, Attempts: num(1), FirstSeen: num(2), LastSeen: num(2) + num(3), PayloadHash: str(4)}
		if k == redisstore.KindCompact {
			r.ID = str(5)
		} else {
			r.Owner, r.Reason = str(5), str(6)
		}
		return redisstore.EncodeRecord(r)
	}
	r := redisstore.Record{Kind: num(0), ID: str(1), Owner: str(2), PayloadHash: str(3)}
	switch {
	case r.Kind == redisstore.KindFresh:
		r.Lease, r.TTL = num(4), num(5)
	case r.Kind == redisstore.KindCompleted:
		r.Lease, r.TTL, r.FreshExpiry, r.TTL2 = num(4), num(5), num(6), num(7)
	default:
		r.Until, r.Lease, r.Attempts, r.FirstSeen, r.LastSeen, r.Expiry = num(4), num(5), num(6), num(7), num(8), num(9)
		if r.Short = len(vals) == 10; !r.Short {
			r.Reason, r.RetryAt = str(10), num(11)
		}
	}
	return redisstore.EncodeRecord(r)
}

// A claim of a new key writes the fresh record with SET NX PX, its times
// derived from the key's absolute expiry: the claim, Get and a Busy reply
// agree to the microsecond. Complete rewrites it as a completed fresh
// record with the retention as its TTL, its times derived from the fresh
// record's expiry and its own.
func TestStore_record_layout(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	ctx := context.Background()
	prefix := testPrefix(t, c)
	s := newStore(t, c, redisstore.Options{Prefix: prefix, Retention: time.Hour})
	owner, hash := strings.Repeat("o", 20), strings.Repeat("h", 100) // fixstr and str 8
	cl, err := s.TryBegin(ctx, "k", inbox.BeginOptions{LeaseID: "lease-1", Owner: owner, PayloadHash: hash, Lease: time.Minute})
	if err != nil || cl.Status != inbox.Acquired {
		t.Fatalf("TryBegin = %+v, %v", cl, err)
	}
	const ttlMS = int64((time.Hour+time.Minute)/time.Millisecond) + 1
	got := rawRecord(t, c, prefix+"k")
	want := []any{int64(0), "lease-1", owner, hash, time.Minute.Microseconds(), ttlMS}
	if !slices.Equal(got, want) {
		t.Fatalf("fresh record = %v, want %v", got, want)
	}
	e, err := c.PExpireTime(ctx, prefix+"k").Result()
	if err != nil {
		t.Fatal(err)
	}
	acquired := (e.Milliseconds() - ttlMS) * 1000
	if cl.ExpiresAt.UnixMicro() != acquired+time.Minute.Microseconds() {
		t.Fatalf("ExpiresAt %d µs, want (PEXPIRETIME - ttl) * 1000 + lease = %d", cl.ExpiresAt.UnixMicro(), acquired+time.Minute.Microseconds())
	}
	r, err := s.Get(ctx, "k")
	if err != nil || r.State != inbox.StateInProgress || r.Attempts != 1 || !r.LeaseUntil.Equal(cl.ExpiresAt) ||
		r.FirstSeen.UnixMicro() != acquired || !r.LastSeen.Equal(r.FirstSeen) || r.Owner != owner || r.PayloadHash != hash {
		t.Fatalf("Get = %+v, %v; want in progress until %v, first and last seen at %d µs", r, err, cl.ExpiresAt, acquired)
	}
	b, err := s.TryBegin(ctx, "k", inbox.BeginOptions{LeaseID: "lease-2"})
	if err != nil || b.Status != inbox.Busy || !b.ExpiresAt.Equal(cl.ExpiresAt) || b.BackingOff {
		t.Fatalf("TryBegin by another lease = %+v, %v; want Busy until %v, not BackingOff", b, err, cl.ExpiresAt)
	}
	if !slices.Equal(rawRecord(t, c, prefix+"k"), want) {
		t.Fatal("a Busy TryBegin changed the fresh record")
	}
	if err := s.Complete(ctx, "k", "lease-1"); err != nil {
		t.Fatal(err)
	}
	got = rawRecord(t, c, prefix+"k")
	if len(got) != 6 || got[0] != int64(redisstore.KindCompact) || got[1] != int64(1) || got[2] != acquired || got[3].(int64) < 0 ||
		got[4] != hash || got[5] != redisstore.Fingerprint("lease-1") {
		t.Fatalf("processed record = %v, want [5 1 %d <µs to Complete> %q <fingerprint of lease-1>]", got, acquired, hash)
	}
	completed := acquired + got[3].(int64)
	e2, err := c.PExpireTime(ctx, prefix+"k").Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl := time.Until(time.UnixMilli(e2.Milliseconds())); ttl <= 59*time.Minute || ttl > time.Hour+time.Second {
		t.Fatalf("TTL after Complete = %s, want about the retention (1h)", ttl)
	}
	r, err = s.Get(ctx, "k")
	if err != nil || r.State != inbox.StateProcessed || r.Attempts != 1 || r.FirstSeen.UnixMicro() != acquired ||
		r.LastSeen.UnixMicro() != completed || r.Owner != "" || r.PayloadHash != hash || !r.LeaseUntil.IsZero() {
		t.Fatalf("Get after Complete = %+v, %v; want processed, 1 attempt, first seen %d µs, last seen %d µs, no owner", r, err, acquired, completed)
	}
	if err := s.Complete(ctx, "k", "lease-1"); err != nil {
		t.Fatalf("Complete repeated by the completing lease: %v", err)
	}
	if !slices.Equal(rawRecord(t, c, prefix+"k"), got) {
		t.Fatal("a repeated Complete changed the processed record")
	}
	if err := s.Complete(ctx, "k", "lease-2"); !errors.Is(err, inbox.ErrLeaseLost) {
		t.Fatalf("Complete by another lease = %v, want ErrLeaseLost", err)
	}
}

// The scripts read a completed fresh record (kind 3, which older versions
// wrote): Processed for a claim, lease lost for another lease or for a
// Release; MarkProcessed rewrites it in the compact layout, keeping its
// history.
func TestStore_scripts_read_completed_fresh_records(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	ctx := context.Background()
	prefix := testPrefix(t, c)
	s := newStore(t, c, redisstore.Options{Prefix: prefix, Retention: time.Hour})
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	// As the short way of Complete wrote it: the fresh record's values, its
	// expiry and the retention, with the retention as its TTL.
	const leaseUS, ttl, retMS = int64(30_000_000), int64(3_630_001), int64(3_600_000)
	completed := func(key, id string) {
		t.Helper()
		v := packRecord(int64(3), id, "me", "hash-1", leaseUS, ttl, now.UnixMilli()-1000+ttl, retMS)
		if err := c.Set(ctx, prefix+key, v, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	completed("k", "lease-1")
	// A lease id of 32 bytes or more is a str 8 in the record.
	long := strings.Repeat("L", inbox.MaxLeaseIDLen)
	completed("long", long)
	if err := s.Complete(ctx, "long", long); err != nil {
		t.Fatalf("Complete repeated with a long lease id: %v", err)
	}
	if err := s.Complete(ctx, "k", "lease-1"); err != nil {
		t.Fatalf("Complete repeated by the completing lease: %v", err)
	}
	before, err := s.Get(ctx, "k")
	if err != nil || before.State != inbox.StateProcessed {
		t.Fatalf("Get = %+v, %v", before, err)
	}
	if got, err := s.TryBegin(ctx, "k", inbox.BeginOptions{PayloadHash: "hash-2"}); err != nil || got.Status != inbox.Processed || !got.PayloadMismatch {
		t.Fatalf("TryBegin of the completed key = %+v, %v; want Processed with a payload mismatch", got, err)
	}
	if err := s.Complete(ctx, "k", "lease-2"); !errors.Is(err, inbox.ErrLeaseLost) {
		t.Fatalf("Complete by another lease = %v, want ErrLeaseLost", err)
	}
	if err := s.Release(ctx, "k", "lease-1"); !errors.Is(err, inbox.ErrLeaseLost) || !strings.Contains(err.Error(), "already processed") {
		t.Fatalf("Release by the completing lease = %v, want ErrLeaseLost: already processed", err)
	}
	if _, err := s.Extend(ctx, "k", "lease-1", time.Minute); !errors.Is(err, inbox.ErrLeaseLost) {
		t.Fatalf("Extend by the completing lease = %v, want ErrLeaseLost", err)
	}
	if ok, err := s.IsProcessed(ctx, "k"); err != nil || !ok {
		t.Fatalf("IsProcessed = %v, %v", ok, err)
	}
	if err := s.MarkProcessed(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	got := rawRecord(t, c, prefix+"k")
	if len(got) != 6 || got[0] != int64(redisstore.KindCompact) || got[1] != int64(1) || got[2] != before.FirstSeen.UnixMicro() || got[4] != "hash-1" || got[5] != "" {
		t.Fatalf("record after MarkProcessed = %v, want kind 5 with 1 attempt, first seen %d, the hash, no lease fingerprint", got, before.FirstSeen.UnixMicro())
	}
}

// The scripts read a fresh record written by hand (as the fast claim of
// another client writes it): Busy for another lease, renewed by its
// holder, taken over once its lease has ended, keeping its first seen and
// payload hash; each change writes the full layout.
func TestStore_scripts_read_fresh_records(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	ctx := context.Background()
	prefix := testPrefix(t, c)
	s := newStore(t, c, redisstore.Options{Prefix: prefix, Retention: time.Hour})
	fresh := func(key, id string, lease time.Duration, ttlMS int64) int64 {
		t.Helper()
		if err := c.Set(ctx, prefix+key, packRecord(int64(0), id, "old-owner", "hash-1", lease.Microseconds(), ttlMS), time.Duration(ttlMS)*time.Millisecond).Err(); err != nil {
			t.Fatal(err)
		}
		e, err := c.PExpireTime(ctx, prefix+key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return (e.Milliseconds() - ttlMS) * 1000 // acquired, µs
	}

	t.Run("in flight", func(t *testing.T) {
		acquired := fresh("a", "lease-1", time.Minute, 3_600_000)
		cl, err := s.TryBegin(ctx, "a", inbox.BeginOptions{LeaseID: "lease-2"})
		if err != nil || cl.Status != inbox.Busy || cl.ExpiresAt.UnixMicro() != acquired+time.Minute.Microseconds() || cl.BackingOff {
			t.Fatalf("TryBegin by another lease = %+v, %v; want Busy until %d µs, not BackingOff", cl, err, acquired+time.Minute.Microseconds())
		}
		cl, err = s.TryBegin(ctx, "a", inbox.BeginOptions{LeaseID: "lease-1", Lease: 5 * time.Second, PayloadHash: "hash-2"})
		if err != nil || cl.Status != inbox.Acquired || cl.Lease != time.Minute || !cl.PayloadMismatch {
			t.Fatalf("TryBegin by the holder = %+v, %v; want Acquired with the lease's own length (1m) and a mismatch", cl, err)
		}
		got := rawRecord(t, c, prefix+"a")
		if len(got) != 12 || got[0] != int64(1) || got[1] != "lease-1" || got[2] != "old-owner" || got[3] != "hash-1" ||
			got[4] != cl.ExpiresAt.UnixMicro() || got[6] != int64(1) || got[7] != acquired {
			t.Fatalf("record after the holder's retry = %v", got)
		}
		if err := s.Complete(ctx, "a", "lease-2"); err == nil {
			t.Fatal("Complete by another lease succeeded")
		}
		if err := s.Complete(ctx, "a", "lease-1"); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, "a", "lease-1"); err != nil {
			t.Fatalf("Complete repeated by the completing lease: %v", err)
		}
	})

	t.Run("expired lease", func(t *testing.T) {
		acquired := fresh("b", "lease-1", time.Millisecond, 3_600_000)
		deadline := time.Now().Add(5 * time.Second)
		for {
			r, err := s.Get(ctx, "b")
			if err != nil {
				t.Fatal(err)
			}
			if r.State == inbox.StateAvailable {
				if r.Attempts != 1 || r.FirstSeen.UnixMicro() != acquired {
					t.Fatalf("Get = %+v, want 1 attempt, first seen %d µs", r, acquired)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the 1 ms lease never ended: %+v", r)
			}
			time.Sleep(time.Millisecond)
		}
		cl, err := s.TryBegin(ctx, "b", inbox.BeginOptions{LeaseID: "lease-2", Owner: "new-owner", PayloadHash: "hash-2"})
		if err != nil || cl.Status != inbox.Acquired || !cl.PayloadMismatch {
			t.Fatalf("TryBegin = %+v, %v; want Acquired with a payload mismatch", cl, err)
		}
		r, err := s.Get(ctx, "b")
		if err != nil || r.State != inbox.StateInProgress || r.Attempts != 2 || r.FirstSeen.UnixMicro() != acquired || r.Owner != "new-owner" || r.PayloadHash != "hash-1" {
			t.Fatalf("Get = %+v, %v; want attempt 2, first seen %d µs, the new owner, the first hash", r, err, acquired)
		}
		if err := s.Release(ctx, "b", "lease-1"); err == nil {
			t.Fatal("Release by the old lease succeeded")
		}
	})

	t.Run("expired record", func(t *testing.T) {
		// A fresh record whose TTL is its whole life: once its expiry has
		// passed it is absent, whether or not Redis has dropped it yet.
		fresh("c", "lease-1", time.Millisecond, 2)
		time.Sleep(5 * time.Millisecond)
		cl, err := s.TryBegin(ctx, "c", inbox.BeginOptions{})
		if err != nil || cl.Status != inbox.Acquired {
			t.Fatalf("TryBegin = %+v, %v", cl, err)
		}
		if r, err := s.Get(ctx, "c"); err != nil || r.Attempts != 1 {
			t.Fatalf("Get = %+v, %v; want a new record (1 attempt)", r, err)
		}
	})
}

// cmdLog records the names of the commands a client sends, pipelines
// included.
type cmdLog struct {
	mu    sync.Mutex
	names []string
}

func (l *cmdLog) DialHook(next redis.DialHook) redis.DialHook { return next }
func (l *cmdLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		l.add(cmd)
		return next(ctx, cmd)
	}
}
func (l *cmdLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			l.add(c)
		}
		return next(ctx, cmds)
	}
}
func (l *cmdLog) add(c redis.Cmder) {
	switch c.Name() {
	case "hello", "select", "client", "auth", "ping": // a new connection's set-up
		return
	}
	l.mu.Lock()
	l.names = append(l.names, c.Name())
	l.mu.Unlock()
}

func (l *cmdLog) take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := strings.Join(l.names, " ")
	l.names = nil
	return s
}

// A claim of a new key runs no script: SET NX and PEXPIRETIME, in one
// pipeline. A key that exists (busy, processed, the holder's retry) costs
// the TryBegin script as well; Complete, Release and Extend are scripts. A
// claim with BeginOptions.Retry (a copy of a failed attempt) is the script
// alone, one round trip, for a key that exists and a new one alike.
func TestStore_new_key_claim_is_native(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	var log cmdLog
	c.AddHook(&log)
	ctx := context.Background()
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c)})
	step := func(what, want string, f func() error) {
		t.Helper()
		log.take()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := log.take(); got != want {
			t.Fatalf("%s sent %q, want %q", what, got, want)
		}
	}
	var cl inbox.Claim
	retry := false
	claim := func(key, id string, want inbox.Status) func() error {
		return func() error {
			var err error
			cl, err = s.TryBegin(ctx, key, inbox.BeginOptions{LeaseID: id, Retry: retry})
			if err == nil && cl.Status != want {
				err = fmt.Errorf("status %v, want %v", cl.Status, want)
			}
			return err
		}
	}
	step("TryBegin of a new key", "set pexpiretime", claim("a", "lease-1", inbox.Acquired))
	step("TryBegin by another lease", "set pexpiretime evalsha", claim("a", "lease-2", inbox.Busy))
	step("TryBegin repeated by the holder", "set pexpiretime evalsha", claim("a", "lease-1", inbox.Acquired))
	step("Extend", "evalsha", func() error { _, err := s.Extend(ctx, "a", "lease-1", time.Minute); return err })
	step("Complete", "evalsha", func() error { return s.Complete(ctx, "a", "lease-1") })
	step("TryBegin of a processed key", "set pexpiretime evalsha", claim("a", "lease-3", inbox.Processed))
	step("TryBegin of another new key", "set pexpiretime", claim("b", "lease-4", inbox.Acquired))
	step("Release", "evalsha", func() error { return s.Release(ctx, "b", "lease-4") })
	step("TryBegin of a released key", "set pexpiretime evalsha", claim("b", "lease-5", inbox.Acquired))
	if cl.ExpiresAt.IsZero() || math.Abs(time.Until(cl.ExpiresAt).Seconds()-inbox.DefaultLease.Seconds()) > 5 {
		t.Fatalf("ExpiresAt %v, want about the default lease from now", cl.ExpiresAt)
	}

	retry = true
	step("Fail", "evalsha", func() error { return s.Fail(ctx, "b", "lease-5", inbox.FailOptions{Reason: "boom"}) })
	step("TryBegin with Retry of a failed key", "evalsha", claim("b", "lease-6", inbox.Acquired))
	if cl.Attempts != 3 {
		t.Fatalf("TryBegin with Retry of a failed key: Attempts %d, want 3", cl.Attempts)
	}
	step("TryBegin with Retry by another lease", "evalsha", claim("b", "lease-7", inbox.Busy))
	step("TryBegin with Retry of a new key", "evalsha", claim("c", "lease-8", inbox.Acquired))
}

// Fail writes the full layout with its reason. With a backoff: kind 1
// without lease id or deadline, the retry at, and an expiry the retention
// after it (the TTL to match); TryBegin answers Busy until exactly the
// retry at, for any lease, and Get reports it. ForceRelease clears the
// retry at; the next acquisition counts an attempt and keeps the reason.
// Dead is the compact kind 6, kept for the retention, and MarkProcessed
// makes it the compact kind 5.
func TestStore_record_layout_fail(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	ctx := context.Background()
	prefix := testPrefix(t, c)
	const ret = time.Hour
	s := newStore(t, c, redisstore.Options{Prefix: prefix, Retention: ret})
	claim := func(id string, want inbox.Status) inbox.Claim {
		t.Helper()
		cl, err := s.TryBegin(ctx, "k", inbox.BeginOptions{LeaseID: id, Owner: "me", PayloadHash: "hash-1", Lease: time.Minute})
		if err != nil || cl.Status != want {
			t.Fatalf("TryBegin(%s) = %+v, %v; want %v", id, cl, err, want)
		}
		return cl
	}
	// expiry checks that the record's logical expiry is ex and that Redis
	// keeps it a little longer.
	expiry := func(ex int64) {
		t.Helper()
		e, err := c.PExpireTime(ctx, prefix+"k").Result()
		if err != nil {
			t.Fatal(err)
		}
		if us := e.Milliseconds() * 1000; us <= ex || us > ex+10_000 {
			t.Fatalf("physical expiry %d µs, want just past the logical expiry %d µs", us, ex)
		}
	}
	first := claim("lease-1", inbox.Acquired)
	acquired := first.ExpiresAt.UnixMicro() - time.Minute.Microseconds()
	if err := s.Fail(ctx, "k", "lease-1", inbox.FailOptions{RetryAfter: 10 * time.Minute, Reason: "boom"}); err != nil {
		t.Fatal(err)
	}
	got := rawRecord(t, c, prefix+"k")
	if len(got) != 12 {
		t.Fatalf("record after Fail = %v, want 12 values", got)
	}
	failed, retryAt := got[8].(int64), got[11].(int64)
	want := []any{int64(1), "", "me", "hash-1", int64(0), time.Minute.Microseconds(), int64(1), acquired, failed,
		retryAt + ret.Microseconds(), "boom", failed + (10 * time.Minute).Microseconds()}
	if !slices.Equal(got, want) {
		t.Fatalf("record after Fail with a backoff = %v, want %v", got, want)
	}
	expiry(want[9].(int64))
	for _, id := range []string{"lease-1", "lease-2"} {
		b := claim(id, inbox.Busy)
		if b.ExpiresAt.UnixMicro() != retryAt || b.RetryAfter <= 0 || b.RetryAfter > 10*time.Minute || b.Attempts != 1 || !b.BackingOff {
			t.Fatalf("TryBegin(%s) in the backoff = %+v; want Busy until %d µs, 1 attempt, BackingOff", id, b, retryAt)
		}
	}
	if !slices.Equal(rawRecord(t, c, prefix+"k"), want) {
		t.Fatal("a Busy TryBegin changed the record in a backoff")
	}
	r, err := s.Get(ctx, "k")
	if err != nil || r.State != inbox.StateAvailable || r.RetryAt.UnixMicro() != retryAt || r.Reason != "boom" ||
		r.Attempts != 1 || r.LastSeen.UnixMicro() != failed || !r.LeaseUntil.IsZero() {
		t.Fatalf("Get in the backoff = %+v, %v", r, err)
	}

	if err := s.ForceRelease(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	got = rawRecord(t, c, prefix+"k")
	released := got[8].(int64)
	want = []any{int64(1), "", "me", "hash-1", int64(0), time.Minute.Microseconds(), int64(1), acquired, released,
		released + ret.Microseconds(), "boom", int64(0)}
	if !slices.Equal(got, want) {
		t.Fatalf("record after ForceRelease = %v, want %v", got, want)
	}
	expiry(want[9].(int64))
	second := claim("lease-3", inbox.Acquired)
	if second.Attempts != 2 || second.BackingOff {
		t.Fatalf("claim after ForceRelease: %+v, want attempt 2", second)
	}
	if b := claim("lease-2", inbox.Busy); b.BackingOff || !b.ExpiresAt.Equal(second.ExpiresAt) {
		t.Fatalf("TryBegin by another lease after the backoff = %+v; want Busy on lease-3 until %v, not BackingOff", b, second.ExpiresAt)
	}
	got = rawRecord(t, c, prefix+"k")
	if got[0] != int64(1) || got[1] != "lease-3" || got[4] != second.ExpiresAt.UnixMicro() || got[6] != int64(2) || got[10] != "boom" || got[11] != int64(0) {
		t.Fatalf("record after the second claim = %v, want lease-3, attempt 2, the reason kept, no backoff", got)
	}

	if err := s.Fail(ctx, "k", "lease-3", inbox.FailOptions{Dead: true, Reason: "poison"}); err != nil {
		t.Fatal(err)
	}
	got = rawRecord(t, c, prefix+"k")
	if len(got) != 7 {
		t.Fatalf("dead record = %v, want 7 values", got)
	}
	want = []any{int64(redisstore.KindTomb), int64(2), acquired, got[3], "hash-1", "me", "poison"}
	if !slices.Equal(got, want) || got[3].(int64) < 0 {
		t.Fatalf("dead record = %v, want %v", got, want)
	}
	ttl := func() time.Duration {
		t.Helper()
		d, err := c.PTTL(ctx, prefix+"k").Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := ttl(); d <= ret-time.Minute || d > ret {
		t.Fatalf("TTL of the dead record = %s, want about the retention (%s)", d, ret)
	}
	if d := claim("lease-4", inbox.Dead); d.Reason != "poison" || d.Attempts != 2 {
		t.Fatalf("TryBegin of the dead key = %+v", d)
	}
	for name, err := range map[string]error{
		"Complete": s.Complete(ctx, "k", "lease-3"),
		"Release":  s.Release(ctx, "k", "lease-3"),
		"Fail":     s.Fail(ctx, "k", "lease-3", inbox.FailOptions{}),
	} {
		if !errors.Is(err, inbox.ErrLeaseLost) || !strings.Contains(err.Error(), "dead") {
			t.Errorf("%s of the dead key = %v, want ErrLeaseLost: dead", name, err)
		}
	}
	if _, err := s.Extend(ctx, "k", "lease-3", time.Minute); !errors.Is(err, inbox.ErrLeaseLost) {
		t.Errorf("Extend of the dead key = %v, want ErrLeaseLost", err)
	}
	if err := s.ForceRelease(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rawRecord(t, c, prefix+"k"), want) {
		t.Fatal("calls on the dead key changed its record")
	}
	if err := s.MarkProcessed(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	got = rawRecord(t, c, prefix+"k")
	if len(got) != 6 || got[0] != int64(redisstore.KindCompact) || got[1] != int64(2) || got[2] != acquired || got[4] != "hash-1" || got[5] != "" {
		t.Fatalf("record after MarkProcessed of the dead key = %v, want kind 5 with 2 attempts, first seen %d, the hash, no lease fingerprint", got, acquired)
	}
	if d := ttl(); d <= ret-time.Minute || d > ret {
		t.Fatalf("TTL of the marked record = %s, want about the retention (%s)", d, ret)
	}
}

// A Fail without a backoff ends the lease with no retry at: the next claim
// acquires at once. A dead record of the full layout (older versions wrote
// it) whose logical expiry has passed is absent, though Redis still holds
// it.
func TestStore_record_layout_fail_without_backoff_and_dead_expiry(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	ctx := context.Background()
	prefix := testPrefix(t, c)
	s := newStore(t, c, redisstore.Options{Prefix: prefix, Retention: time.Hour})
	cl, err := s.TryBegin(ctx, "k", inbox.BeginOptions{LeaseID: "lease-1"})
	if err != nil || cl.Status != inbox.Acquired {
		t.Fatalf("TryBegin = %+v, %v", cl, err)
	}
	if err := s.Fail(ctx, "k", "lease-1", inbox.FailOptions{Reason: "transient"}); err != nil {
		t.Fatal(err)
	}
	got := rawRecord(t, c, prefix+"k")
	if len(got) != 12 || got[0] != int64(1) || got[1] != "" || got[9] != got[8].(int64)+time.Hour.Microseconds() || got[10] != "transient" || got[11] != int64(0) {
		t.Fatalf("record after Fail without a backoff = %v", got)
	}
	if cl, err := s.TryBegin(ctx, "k", inbox.BeginOptions{}); err != nil || cl.Status != inbox.Acquired || cl.Attempts != 2 {
		t.Fatalf("TryBegin after Fail without a backoff = %+v, %v; want Acquired, attempt 2", cl, err)
	}

	now := time.Now().UnixMicro()
	past := packRecord(int64(4), "", "me", "", int64(0), int64(0), int64(3), now-2e6, now-1e6, now-1000, "poison", int64(0))
	if err := c.Set(ctx, prefix+"gone", past, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Get(ctx, "gone"); err != nil || r.State != inbox.StateNotFound {
		t.Fatalf("Get of an expired dead record = %+v, %v; want NotFound", r, err)
	}
	if cl, err := s.TryBegin(ctx, "gone", inbox.BeginOptions{}); err != nil || cl.Status != inbox.Acquired || cl.Attempts != 1 {
		t.Fatalf("TryBegin of an expired dead record = %+v, %v; want Acquired, attempt 1", cl, err)
	}
}

// Records of kinds 1 and 2 written before the reason and the retry at
// existed (ten values) read as without either (a live lease's Busy is not
// BackingOff), and the next change writes the current layout.
func TestStore_scripts_read_records_without_reason(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	ctx := context.Background()
	prefix := testPrefix(t, c)
	s := newStore(t, c, redisstore.Options{Prefix: prefix, Retention: time.Hour})
	now := time.Now().UnixMicro()
	ex := now + time.Hour.Microseconds()
	if err := c.Set(ctx, prefix+"released", packRecord(int64(1), "", "me", "h", int64(0), int64(1000), int64(3), now-2000, now-1000, ex), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, prefix+"done", packRecord(int64(2), "", "me", "h", int64(0), int64(1000), int64(1), now-2000, now-1000, ex), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	lu := now + time.Hour.Microseconds()
	if err := c.Set(ctx, prefix+"held", packRecord(int64(1), "lease-0", "me", "h", lu, time.Hour.Microseconds(), int64(1), now-2000, now-1000, lu+ex-now), 2*time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if cl, err := s.TryBegin(ctx, "held", inbox.BeginOptions{LeaseID: "lease-9"}); err != nil || cl.Status != inbox.Busy || cl.BackingOff || cl.ExpiresAt.UnixMicro() != lu {
		t.Fatalf("TryBegin of a leased record without retry at = %+v, %v; want Busy until %d µs, not BackingOff", cl, err, lu)
	}
	if r, err := s.Get(ctx, "released"); err != nil || r.State != inbox.StateAvailable || r.Attempts != 3 || r.Reason != "" || !r.RetryAt.IsZero() {
		t.Fatalf("Get of a released record without reason = %+v, %v", r, err)
	}
	if cl, err := s.TryBegin(ctx, "done", inbox.BeginOptions{}); err != nil || cl.Status != inbox.Processed || cl.Attempts != 1 {
		t.Fatalf("TryBegin of a processed record without reason = %+v, %v", cl, err)
	}
	cl, err := s.TryBegin(ctx, "released", inbox.BeginOptions{LeaseID: "lease-1"})
	if err != nil || cl.Status != inbox.Acquired || cl.Attempts != 4 {
		t.Fatalf("TryBegin of a released record without reason = %+v, %v; want Acquired, attempt 4", cl, err)
	}
	if got := rawRecord(t, c, prefix+"released"); len(got) != 12 || got[10] != "" || got[11] != int64(0) {
		t.Fatalf("record after the claim = %v, want the current layout", got)
	}
}

// A Complete that knows its claim (the middleware's, through Go: the
// claim's ExpiresAt, lease, owner and payload hash) writes a compact
// processed record made by the client (kind 7: that of Complete, with the
// retention in place of the time to processed, which Get derives from the
// key's expiry), and costs the server a GET and a SET: no TIME, no
// PEXPIRETIME. One that knows it wrong, or is not the holder's, goes the
// common way. A payload hash of 64 hex digits is kept
// as its first 16 bytes, and Get shows them.
func TestStore_complete_knowing_its_claim(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	s := newStore(t, c, redisstore.Options{Prefix: "p:", Retention: time.Hour})
	owner, hash := "owner-1", strings.Repeat("ab", 32)
	claim := func(key, id string) inbox.Claim {
		t.Helper()
		cl, err := s.TryBegin(ctx, key, inbox.BeginOptions{LeaseID: id, Owner: owner, PayloadHash: hash, Lease: time.Minute})
		if err != nil || cl.Status != inbox.Acquired {
			t.Fatalf("TryBegin(%s) = %+v, %v", key, cl, err)
		}
		return cl
	}
	goComplete := func(key, id string, cl inbox.Claim) error {
		t.Helper()
		done := make(chan error, 1)
		s.Go(ctx, driver.Op{Kind: driver.Complete, Key: key, LeaseID: id, Owner: owner, PayloadHash: hash, Lease: cl.Lease, ExpiresAt: cl.ExpiresAt},
			func(_ inbox.Claim, err error) { done <- err })
		return <-done
	}
	calls := func(name string) float64 { return commandStats(t, c)[name].calls }

	claim("ref", "lease-1")
	if err := s.Complete(ctx, "ref", "lease-1"); err != nil {
		t.Fatal(err)
	}
	cl := claim("k", "lease-1")
	pexpire, set, clock := calls("pexpiretime"), calls("set"), calls("time")
	start := time.Now()
	if err := goComplete("k", "lease-1", cl); err != nil {
		t.Fatal(err)
	}
	end := time.Now()
	if d := calls("pexpiretime") - pexpire; d != 0 {
		t.Errorf("the Complete that knows its claim read PEXPIRETIME %v times, want 0", d)
	}
	if d := calls("time") - clock; d != 0 {
		t.Errorf("the Complete that knows its claim read TIME %v times, want 0", d)
	}
	if d := calls("set") - set; d != 1 {
		t.Errorf("the Complete that knows its claim sent %v SETs, want 1", d)
	}
	got, want := rawRecord(t, c, "p:k"), rawRecord(t, c, "p:ref")
	compact := redisstore.CompactHash(hash)
	if len(compact) != 17 || len(got) != 6 || got[0] != int64(redisstore.KindMarked) || got[1] != int64(1) || got[2] != cl.ExpiresAt.Add(-time.Minute).UnixMicro() ||
		got[3] != time.Hour.Milliseconds() || got[4] != compact || got[5] != redisstore.Fingerprint("lease-1") || !slices.Equal(got[4:], want[4:]) || want[0] != int64(redisstore.KindCompact) {
		t.Fatalf("record completed knowing its claim = %v; by Complete %v", got, want)
	}
	if b, err := c.Get(ctx, "p:k").Bytes(); err != nil || len(b) > 44 {
		t.Fatalf("processed record of %d bytes (%v), want at most 44 (one allocation)", len(b), err)
	}
	r, err := s.Get(ctx, "k")
	if err != nil || r.State != inbox.StateProcessed || r.Attempts != 1 || !r.FirstSeen.Equal(cl.ExpiresAt.Add(-time.Minute)) || r.Owner != "" || r.PayloadHash != hash[:32] {
		t.Fatalf("Get = %+v, %v; want processed, first seen at the claim, no owner, the hash's first 16 bytes", r, err)
	}
	// Processed at the SET, to the millisecond of the Redis clock, which is
	// this machine's.
	if r.LastSeen.Before(start.Truncate(time.Millisecond)) || r.LastSeen.After(end) {
		t.Fatalf("Get: last seen %v, want the Complete's time, between %v and %v", r.LastSeen, start, end)
	}
	if p, err := s.TryBegin(ctx, "k", inbox.BeginOptions{PayloadHash: hash}); err != nil || p.Status != inbox.Processed || p.PayloadMismatch {
		t.Fatalf("TryBegin with the same hash = %+v, %v; want Processed, no mismatch", p, err)
	}
	if p, err := s.TryBegin(ctx, "k", inbox.BeginOptions{PayloadHash: hash[:32] + strings.Repeat("cd", 16)}); err != nil || p.Status != inbox.Processed || p.PayloadMismatch {
		t.Fatalf("TryBegin with a hash of the same first 16 bytes = %+v, %v; want Processed, no mismatch", p, err)
	}
	if p, err := s.TryBegin(ctx, "k", inbox.BeginOptions{PayloadHash: strings.Repeat("cd", 32)}); err != nil || p.Status != inbox.Processed || !p.PayloadMismatch {
		t.Fatalf("TryBegin with another hash = %+v, %v; want Processed with a mismatch", p, err)
	}
	if err := goComplete("k", "lease-1", cl); err != nil {
		t.Fatalf("repeated: %v", err)
	}
	// Known wrong (another expiry): the common way completes it all the same.
	cl = claim("w", "lease-1")
	wrong := cl
	wrong.ExpiresAt = wrong.ExpiresAt.Add(-time.Second)
	if err := goComplete("w", "lease-1", wrong); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Get(ctx, "w"); err != nil || r.State != inbox.StateProcessed {
		t.Fatalf("Get after a Complete that knew its claim wrong = %+v, %v", r, err)
	}
	// Not the holder: refused, nothing changed.
	cl = claim("o", "lease-1")
	before := rawRecord(t, c, "p:o")
	if err := goComplete("o", "lease-2", cl); !errors.Is(err, inbox.ErrLeaseLost) {
		t.Fatalf("Complete by another lease = %v, want ErrLeaseLost", err)
	}
	if !slices.Equal(rawRecord(t, c, "p:o"), before) {
		t.Fatal("a refused Complete changed the record")
	}
}
