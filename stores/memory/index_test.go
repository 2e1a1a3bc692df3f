package memory

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/storetest"
)

// collide makes every key of s hash to one of three values, so that nearly
// every lookup walks a chain of records.
func collide(s *Store) { s.testHash = func(k string) uint64 { return uint64(len(k) % 3) } }

// TestConformance_colliding_hashes runs the conformance suite on a store
// whose keys all collide in its index.
func TestConformance_colliding_hashes(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T, cfg storetest.Config) inbox.LeaseStore {
			s, err := New(Options{Retention: cfg.Retention})
			if err != nil {
				t.Fatal(err)
			}
			collide(s)
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		Lease:         200 * time.Millisecond,
		Retention:     500 * time.Millisecond,
		TimePrecision: time.Microsecond,
	})
}

// keyOfLen returns a key of n bytes ending in tag.
func keyOfLen(n int, tag string) string { return strings.Repeat("k", n-len(tag)) + tag }

// TestIndex_collisions_and_key_lengths fills a colliding store with keys of
// every length around the inline limit, evicts and reinserts through the
// probe runs, and checks that every key finds its own record, byte for byte.
func TestIndex_collisions_and_key_lengths(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, colliding := range []bool{false, true} {
		t.Run(fmt.Sprintf("colliding=%v", colliding), func(t *testing.T) {
			t.Parallel()
			const max = 700
			s, err := New(Options{MaxEntries: max})
			if err != nil {
				t.Fatal(err)
			}
			if colliding {
				collide(s)
			}
			lengths := []int{8, inlineKey - 1, inlineKey, inlineKey + 1, inbox.MaxKeyLen}
			var keys []string
			for n := range 400 {
				for _, l := range lengths {
					keys = append(keys, keyOfLen(l, fmt.Sprintf(":%d", n)))
				}
			}
			keys = append(keys, "ABC", "abc", "abc ", "ab\u00e7") // no folding of case, spaces or accents
			for _, k := range keys {
				c, err := s.TryBegin(ctx, k, inbox.BeginOptions{Owner: "o"})
				if err != nil || c.Status != inbox.Acquired {
					t.Fatalf("TryBegin(%d-byte key %q) = %+v, %v", len(k), k[len(k)-6:], c, err)
				}
				if err := s.Complete(ctx, k, c.LeaseID); err != nil {
					t.Fatal(err)
				}
			}
			if st := s.Stats(); st.Entries != max || st.Evicted != uint64(len(keys)-max) {
				t.Fatalf("stats %+v, want %d entries and %d evictions", st, max, len(keys)-max)
			}
			for n, k := range keys {
				r, err := s.Get(ctx, k)
				if err != nil {
					t.Fatal(err)
				}
				if kept := n >= len(keys)-max; kept != (r.State == inbox.StateProcessed) || kept && r.Attempts != 1 {
					t.Fatalf("key %d (%d bytes): %+v, kept: %v", n, len(k), r, kept)
				}
			}
			// Reinsert the evicted ones: freed slots and chain links are reused.
			for _, k := range keys[:len(keys)-max] {
				c, err := s.TryBegin(ctx, k, inbox.BeginOptions{Owner: "o"})
				if err != nil || c.Status != inbox.Acquired {
					t.Fatalf("TryBegin again = %+v, %v", c, err)
				}
				if err := s.Release(ctx, k, c.LeaseID); err != nil {
					t.Fatal(err)
				}
			}
			n := 0
			for _, x := range s.index.w {
				if x == 0 {
					continue
				}
				n++
				if i := int32(uint32(x)) - 1; uint32(s.rec(i).hash) != uint32(x>>32) || s.rec(i).keyLen == 0 {
					t.Fatalf("index word %#x names slot %d, whose record does not match", x, i)
				}
			}
			if n != s.Stats().Entries || n != s.index.n {
				t.Fatalf("index holds %d words (counted %d), Stats %d entries", n, s.index.n, s.Stats().Entries)
			}
		})
	}
}

// TestRecords_hold_no_strings checks the point of the layout: a store of
// records with ordinary keys and lease ids allocates no text chunk, so the
// garbage collector has nothing to walk per record.
func TestRecords_hold_no_strings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	for n := range 3 * chunkLen {
		k := fmt.Sprintf("rabbit:billing:OrderPlaced:%08d-8a1c-4f0e-9b7d-2c6f1e0a9d3b", n)
		c, err := s.TryBegin(ctx, k, inbox.BeginOptions{Owner: "host/1", LeaseID: inbox.NewLeaseID()})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, k, c.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	for c, chunk := range s.text {
		if chunk != nil {
			t.Errorf("text chunk %d allocated for records that fit their entries", c)
		}
	}
}

// TestRecent_stale_hints checks that Store.recent, which finds the record of
// a fresh claim by its lease id, is only a hint: a slot reused by another
// key under the same lease id, a lease taken over, a freed slot and bad
// arguments all get the answer the index would give.
func TestRecent_stale_hints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := New(Options{MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	const id = "0123456789abcdef0123456789abcdef"
	begin := func(key, leaseID string) {
		t.Helper()
		c, err := s.TryBegin(ctx, key, inbox.BeginOptions{LeaseID: leaseID, Lease: time.Hour})
		if err != nil || c.Status != inbox.Acquired {
			t.Fatalf("TryBegin(%s) = %+v, %v", key, c, err)
		}
	}
	begin("a", id)
	if err := s.Release(ctx, "a", id); err != nil {
		t.Fatal(err)
	}
	begin("b", id) // evicts a (MaxEntries 1): b reuses its slot, under the same lease id
	if err := s.Complete(ctx, "a", id); !errors.Is(err, inbox.ErrLeaseLost) {
		t.Fatalf("Complete of the evicted key through a reused slot: %v, want ErrLeaseLost", err)
	}
	if err := s.Complete(ctx, "b", id); err != nil {
		t.Fatalf("Complete(b): %v", err)
	}
	if r, _ := s.Get(ctx, "b"); r.State != inbox.StateProcessed {
		t.Fatalf("b: %v, want processed", r.State)
	}
	if err := s.Release(ctx, "b", "other"); !errors.Is(err, inbox.ErrLeaseLost) {
		t.Fatalf("Release with another lease id: %v, want ErrLeaseLost", err)
	}

	// A lease taken over after expiry: the old holder is fenced off.
	s2, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	c1, err := s2.TryBegin(ctx, "k", inbox.BeginOptions{Lease: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	var c2 inbox.Claim
	for c2.Status != inbox.Acquired && time.Now().Before(deadline) {
		if c2, err = s2.TryBegin(ctx, "k", inbox.BeginOptions{Lease: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	if c2.Status != inbox.Acquired {
		t.Fatal("the expired lease was not taken over")
	}
	if err := s2.Complete(ctx, "k", c1.LeaseID); !errors.Is(err, inbox.ErrLeaseLost) {
		t.Fatalf("Complete by the expired holder: %v, want ErrLeaseLost", err)
	}

	// Bad arguments are refused as such, whatever slot a hint names.
	s3, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s3.Complete(ctx, "", ""); !errors.Is(err, inbox.ErrInvalidKey) {
		t.Fatalf("Complete with an empty key: %v, want ErrInvalidKey", err)
	}
	if err := s3.Release(ctx, "k", ""); !errors.Is(err, inbox.ErrInvalidLeaseID) {
		t.Fatalf("Release with an empty lease id: %v, want ErrInvalidLeaseID", err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	begin3, err := s3.TryBegin(ctx, "k", inbox.BeginOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s3.Complete(canceled, "k", begin3.LeaseID); !errors.Is(err, context.Canceled) {
		t.Fatalf("Complete with a canceled context: %v, want context.Canceled", err)
	}
}
