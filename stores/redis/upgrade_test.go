package redisstore_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
)

// layoutV1 is one record of testdata/layout-v1.json: the records the store
// wrote before processed and dead keys had their compact layouts, one of
// each layout and state, as TestLayoutV1_generate wrote them (commit
// 2588c5a, removed with the layout change).
type layoutV1 struct {
	Name  string `json:"name"`
	Key   string `json:"key"` // the inbox key, without the store's prefix
	Value string `json:"value"`
	// PTTL when it was written (ms), and the absolute expiry (PEXPIRETIME,
	// ms of the Redis clock) the test restores it with: kinds 0 and 3
	// derive their times from it.
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

// A store upgraded in place reads every record the previous layout wrote,
// loaded raw with its expiry: the same state, attempts, times, owner,
// reason and payload hash (a SHA-256 compared on its first 16 bytes); a
// processed key is Processed to a claim and is not run again, a repeated
// Complete of the lease that completed it succeeds and another lease's
// fails; a key in flight is completed by its holder into the compact
// layout; a dead key stays dead.
func TestUpgrade_layout_v1_reads(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("testdata/layout-v1.json")
	if err != nil {
		t.Fatal(err)
	}
	var recs []layoutV1
	if err := json.Unmarshal(b, &recs); err != nil {
		t.Fatal(err)
	}
	if len(recs) < 16 {
		t.Fatalf("layout-v1.json holds %d records, want the 16 written", len(recs))
	}
	c := sharedClient(t)
	ctx := context.Background()
	prefix := testPrefix(t, c)
	s := newStore(t, c, redisstore.Options{Prefix: prefix, Retention: 50 * 365 * 24 * time.Hour})
	sum := sha256.Sum256([]byte("payload"))
	sha := hex.EncodeToString(sum[:])
	seen := map[string]bool{}
	for _, l := range recs {
		v, err := hex.DecodeString(l.Value)
		if err != nil {
			t.Fatalf("%s: %v", l.Name, err)
		}
		seen[l.Value[:2]] = true
		if err := c.Set(ctx, prefix+l.Key, v, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.PExpireAt(ctx, prefix+l.Key, time.UnixMilli(l.PExpireAt)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, kind := range []string{"00", "01", "02", "03", "04"} {
		if !seen[kind] {
			t.Errorf("layout-v1.json holds no record of kind %s", kind)
		}
	}
	other := inbox.BeginOptions{LeaseID: "lease-other", Owner: "upgrade", PayloadHash: sha}
	for _, l := range recs {
		t.Run(l.Name, func(t *testing.T) {
			r, err := s.Get(ctx, l.Key)
			if err != nil {
				t.Fatal(err)
			}
			hash := l.Hash
			if len(hash) == 64 {
				hash = hash[:32] // kept as its first 16 bytes
			}
			us := func(tm time.Time) int64 {
				if tm.IsZero() {
					return 0
				}
				return tm.UnixMicro()
			}
			if r.State.String() != l.State || r.Attempts != l.Attempts || us(r.FirstSeen) != l.FirstSeen || us(r.LastSeen) != l.LastSeen ||
				us(r.LeaseUntil) != l.LeaseUntil || us(r.RetryAt) != l.RetryAt || r.Owner != l.Owner || r.Reason != l.Reason || r.PayloadHash != hash {
				t.Fatalf("Get = %+v, want %+v (payload hash %q)", r, l, hash)
			}
			switch l.State {
			case "Processed":
				if cl, err := s.TryBegin(ctx, l.Key, other); err != nil || cl.Status != inbox.Processed || cl.PayloadMismatch != (l.Hash != "" && l.Hash != sha) {
					t.Fatalf("TryBegin = %+v, %v; want Processed, a payload mismatch only against another hash", cl, err)
				}
				if err := s.Complete(ctx, l.Key, "lease-other"); !errors.Is(err, inbox.ErrLeaseLost) {
					t.Fatalf("Complete by another lease = %v, want ErrLeaseLost", err)
				}
				if l.LeaseID != "" {
					if err := s.Complete(ctx, l.Key, l.LeaseID); err != nil {
						t.Fatalf("Complete repeated by the completing lease: %v", err)
					}
				}
				if err := s.MarkProcessed(ctx, l.Key); err != nil {
					t.Fatal(err)
				}
				// Rewritten in the compact layout: the same history.
				r2, err := s.Get(ctx, l.Key)
				if err != nil || r2.State != inbox.StateProcessed || r2.Attempts != l.Attempts || us(r2.FirstSeen) != l.FirstSeen || r2.PayloadHash != hash {
					t.Fatalf("Get after MarkProcessed = %+v, %v", r2, err)
				}
			case "InProgress":
				if cl, err := s.TryBegin(ctx, l.Key, other); err != nil || cl.Status != inbox.Busy || cl.ExpiresAt.UnixMicro() != l.LeaseUntil {
					t.Fatalf("TryBegin by another lease = %+v, %v; want Busy until %d µs", cl, err, l.LeaseUntil)
				}
				if err := s.Complete(ctx, l.Key, l.LeaseID); err != nil {
					t.Fatalf("Complete by the holder: %v", err)
				}
				if err := s.Complete(ctx, l.Key, l.LeaseID); err != nil {
					t.Fatalf("Complete repeated by the holder: %v", err)
				}
				if err := s.Complete(ctx, l.Key, "lease-other"); !errors.Is(err, inbox.ErrLeaseLost) {
					t.Fatalf("Complete by another lease = %v, want ErrLeaseLost", err)
				}
				// The compact layout, whatever its size: its time from first
				// seen to processed is the testdata's age, past the 32 bits of
				// µs (71 minutes) that keep a fresh key's record at 44 bytes.
				raw, err := c.Get(ctx, prefix+l.Key).Bytes()
				if err != nil || raw[0] != redisstore.KindCompact {
					t.Fatalf("record after Complete = % x, %v; want the compact layout", raw, err)
				}
				r2, err := s.Get(ctx, l.Key)
				if err != nil || r2.State != inbox.StateProcessed || r2.Attempts != l.Attempts || us(r2.FirstSeen) != l.FirstSeen || r2.PayloadHash != hash || r2.Owner != "" {
					t.Fatalf("Get after Complete = %+v, %v", r2, err)
				}
			case "Dead":
				if cl, err := s.TryBegin(ctx, l.Key, other); err != nil || cl.Status != inbox.Dead || cl.Reason != l.Reason || cl.Attempts != l.Attempts {
					t.Fatalf("TryBegin = %+v, %v; want Dead: %s", cl, err, l.Reason)
				}
			case "Available":
				cl, err := s.TryBegin(ctx, l.Key, other)
				if l.RetryAt != 0 {
					if err != nil || cl.Status != inbox.Busy || !cl.BackingOff || cl.ExpiresAt.UnixMicro() != l.RetryAt {
						t.Fatalf("TryBegin in the backoff = %+v, %v; want Busy until %d µs", cl, err, l.RetryAt)
					}
					return
				}
				if err != nil || cl.Status != inbox.Acquired || cl.Attempts != l.Attempts+1 || cl.PayloadMismatch != (l.Hash != "" && l.Hash != sha) {
					t.Fatalf("TryBegin = %+v, %v; want Acquired, attempt %d", cl, err, l.Attempts+1)
				}
			default:
				t.Fatalf("state %s in layout-v1.json", l.State)
			}
		})
	}
}
