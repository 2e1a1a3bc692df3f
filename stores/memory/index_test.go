package memory

import (
	"context"
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

// TestIndex_chains_and_key_lengths fills a colliding store with keys of
// every length around the inline limit, evicts and reinserts through the
// chains, and checks that every key finds its own record, byte for byte.
func TestIndex_chains_and_key_lengths(t *testing.T) {
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
			for _, chain := range s.index {
				for i := chain; i != none; i = s.rec(i).hnext {
					n++
				}
			}
			if n != s.Stats().Entries {
				t.Fatalf("index chains hold %d records, Stats %d", n, s.Stats().Entries)
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
