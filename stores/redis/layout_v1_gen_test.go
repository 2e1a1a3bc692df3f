package redisstore_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
)

// writeLayoutV1 makes TestLayoutV1_generate write testdata/layout-v1.json:
// the records this version of the store writes, one of each layout and
// state, for the upgrade test of the next layout.
var writeLayoutV1 = flag.Bool("write-layout-v1", false, "write testdata/layout-v1.json from the records this store writes")

// layoutV1 is one record of testdata/layout-v1.json.
type layoutV1 struct {
	Name  string `json:"name"`
	Key   string `json:"key"` // the inbox key, without the store's prefix
	Value string `json:"value"`
	// PTTL when it was written (ms), and the absolute expiry (PEXPIRETIME,
	// ms of the Redis clock) the upgrade test restores it with: kinds 0 and
	// 3 derive their times from it.
	PTTL      int64  `json:"pttl"`
	PExpireAt int64  `json:"pexpireat"`
	LeaseID   string `json:"leaseId,omitempty"` // the lease that completed it, or holds it
	// What Get returned.
	State      string `json:"state"`
	Attempts   int    `json:"attempts"`
	FirstSeen  int64  `json:"firstSeenUs"`
	LastSeen   int64  `json:"lastSeenUs"`
	LeaseUntil int64  `json:"leaseUntilUs,omitempty"`
	RetryAt    int64  `json:"retryAtUs,omitempty"`
	Owner      string `json:"owner,omitempty"`
	Hash       string `json:"payloadHash,omitempty"`
	Reason     string `json:"reason,omitempty"`
}

func TestLayoutV1_generate(t *testing.T) {
	if !*writeLayoutV1 {
		t.Skip("writes testdata/layout-v1.json with -write-layout-v1")
	}
	c := sharedClient(t)
	ctx := context.Background()
	prefix := testPrefix(t, c)
	// Long enough that every record is still live when the upgrade test
	// restores it with its absolute expiry.
	const retention = 50 * 365 * 24 * time.Hour
	const long = 10 * 365 * 24 * time.Hour
	s := newStore(t, c, redisstore.Options{Prefix: prefix, Retention: retention})
	sum := sha256.Sum256([]byte("payload"))
	sha := hex.EncodeToString(sum[:])

	begin := func(key string, o inbox.BeginOptions) inbox.Claim {
		t.Helper()
		cl, err := s.TryBegin(ctx, key, o)
		if err != nil || cl.Status != inbox.Acquired {
			t.Fatalf("TryBegin %s = %+v, %v", key, cl, err)
		}
		return cl
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	type made struct{ name, key, lease string }
	var all []made
	add := func(name, key, lease string) { all = append(all, made{name, key, lease}) }

	// Kind 0: a fast claim, live and with its lease ended.
	begin("fresh", inbox.BeginOptions{LeaseID: "lease-fresh", Owner: "owner-a", PayloadHash: sha, Lease: long})
	add("fresh, in flight", "fresh", "lease-fresh")
	begin("fresh-expired", inbox.BeginOptions{LeaseID: "lease-fresh-expired", Owner: "owner-a", PayloadHash: sha, Lease: time.Millisecond})
	add("fresh, lease ended", "fresh-expired", "lease-fresh-expired")
	// Kind 3: Complete of a fresh record, by the short way (C) and knowing
	// its claim (K).
	begin("completed", inbox.BeginOptions{LeaseID: "lease-completed", Owner: "owner-a", PayloadHash: sha, Lease: long})
	must(s.Complete(ctx, "completed", "lease-completed"))
	add("completed fresh", "completed", "lease-completed")
	cl := begin("completed-k", inbox.BeginOptions{LeaseID: "lease-completed-k", Owner: "owner-a", PayloadHash: sha, Lease: time.Minute})
	_, errs, err := redisstore.Apply(ctx, s, []driver.Op{{Kind: driver.Complete, Key: "completed-k", LeaseID: cl.LeaseID, Owner: "owner-a", PayloadHash: sha, Lease: cl.Lease, ExpiresAt: cl.ExpiresAt}})
	must(err)
	must(errs[0])
	add("completed fresh, knowing its claim", "completed-k", "lease-completed-k")
	begin("completed-nohash", inbox.BeginOptions{LeaseID: "lease-completed-nohash", Owner: "owner-a", Lease: long})
	must(s.Complete(ctx, "completed-nohash", "lease-completed-nohash"))
	add("completed fresh, no payload hash", "completed-nohash", "lease-completed-nohash")
	// Kind 1: held by the script's claim, live and ended.
	begin("held", inbox.BeginOptions{LeaseID: "lease-held", Owner: "owner-b", PayloadHash: sha, Lease: long, Retry: true})
	add("held, in flight", "held", "lease-held")
	begin("held-expired", inbox.BeginOptions{LeaseID: "lease-held-expired", Owner: "owner-b", PayloadHash: "hash-1", Lease: time.Millisecond, Retry: true})
	add("held, lease ended", "held-expired", "lease-held-expired")
	// Kind 1: released, then acquired again.
	begin("released", inbox.BeginOptions{LeaseID: "lease-released", Owner: "owner-b", PayloadHash: sha, Lease: long})
	must(s.Release(ctx, "released", "lease-released"))
	add("released", "released", "")
	begin("reacquired", inbox.BeginOptions{LeaseID: "lease-r1", Owner: "owner-b", PayloadHash: sha, Lease: long})
	must(s.Release(ctx, "reacquired", "lease-r1"))
	begin("reacquired", inbox.BeginOptions{LeaseID: "lease-r2", Owner: "owner-c", PayloadHash: sha, Lease: long})
	add("released, acquired again", "reacquired", "lease-r2")
	// Kind 1: a failed attempt's backoff, running and over.
	begin("backoff", inbox.BeginOptions{LeaseID: "lease-backoff", Owner: "owner-b", PayloadHash: sha, Lease: long})
	must(s.Fail(ctx, "backoff", "lease-backoff", inbox.FailOptions{RetryAfter: long, Reason: "timeout"}))
	add("in a backoff", "backoff", "")
	begin("failed", inbox.BeginOptions{LeaseID: "lease-failed", Owner: "owner-b", PayloadHash: sha, Lease: long})
	must(s.Fail(ctx, "failed", "lease-failed", inbox.FailOptions{Reason: "boom"}))
	add("failed, no backoff", "failed", "")
	// Kind 2: processed by the script (a claim of the script, then
	// Complete), after two attempts, and by MarkProcessed.
	begin("processed", inbox.BeginOptions{LeaseID: "lease-p1", Owner: "owner-b", PayloadHash: sha, Lease: long, Retry: true})
	must(s.Fail(ctx, "processed", "lease-p1", inbox.FailOptions{Reason: "first try"}))
	begin("processed", inbox.BeginOptions{LeaseID: "lease-p2", Owner: "owner-c", PayloadHash: sha, Lease: long, Retry: true})
	must(s.Complete(ctx, "processed", "lease-p2"))
	add("processed, second attempt", "processed", "lease-p2")
	begin("processed-opaque", inbox.BeginOptions{LeaseID: "lease-opaque", Owner: "owner-b", PayloadHash: "hash-1", Lease: long, Retry: true})
	must(s.Complete(ctx, "processed-opaque", "lease-opaque"))
	add("processed, opaque payload hash", "processed-opaque", "lease-opaque")
	must(s.MarkProcessed(ctx, "marked"))
	add("marked, never claimed", "marked", "")
	begin("marked-held", inbox.BeginOptions{LeaseID: "lease-marked", Owner: "owner-b", PayloadHash: sha, Lease: long})
	must(s.MarkProcessed(ctx, "marked-held"))
	add("marked while held", "marked-held", "")
	// Kind 4: dead.
	begin("dead", inbox.BeginOptions{LeaseID: "lease-dead", Owner: "owner-d", PayloadHash: sha, Lease: long})
	must(s.Fail(ctx, "dead", "lease-dead", inbox.FailOptions{Dead: true, Reason: "poison"}))
	add("dead", "dead", "")

	// Wait for the short leases to end.
	for _, k := range []string{"fresh-expired", "held-expired"} {
		for {
			r, err := s.Get(ctx, k)
			must(err)
			if r.State == inbox.StateAvailable {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}

	var out []layoutV1
	for _, m := range all {
		k := prefix + m.key
		v, err := c.Get(ctx, k).Bytes()
		must(err)
		pttl, err := c.PTTL(ctx, k).Result()
		must(err)
		e, err := c.PExpireTime(ctx, k).Result()
		must(err)
		r, err := s.Get(ctx, m.key)
		must(err)
		l := layoutV1{
			Name: m.name, Key: m.key, Value: hex.EncodeToString(v), PTTL: pttl.Milliseconds(), PExpireAt: e.Milliseconds(), LeaseID: m.lease,
			State: r.State.String(), Attempts: r.Attempts, FirstSeen: r.FirstSeen.UnixMicro(), LastSeen: r.LastSeen.UnixMicro(),
			Owner: r.Owner, Hash: r.PayloadHash, Reason: r.Reason,
		}
		if !r.LeaseUntil.IsZero() {
			l.LeaseUntil = r.LeaseUntil.UnixMicro()
		}
		if !r.RetryAt.IsZero() {
			l.RetryAt = r.RetryAt.UnixMicro()
		}
		out = append(out, l)
	}
	b, err := json.MarshalIndent(out, "", "  ")
	must(err)
	must(os.WriteFile("testdata/layout-v1.json", append(b, '\n'), 0o644))
}
