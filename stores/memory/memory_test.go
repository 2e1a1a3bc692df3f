package memory_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
	"github.com/watermill-inbox/inbox/stores/memory"
	"github.com/watermill-inbox/inbox/stores/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T, cfg storetest.Config) inbox.LeaseStore {
			s, err := memory.New(memory.Options{Retention: cfg.Retention})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		Lease:     200 * time.Millisecond,
		Retention: 500 * time.Millisecond,
		// The memory store keeps monotonic time; returned times are exact.
		TimePrecision: time.Microsecond,
	})
}

func TestMaxEntries_evicts_oldest_unleased(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := memory.New(memory.Options{MaxEntries: 3})
	if err != nil {
		t.Fatal(err)
	}
	complete := func(key string) {
		c, err := s.TryBegin(ctx, key, inbox.BeginOptions{})
		if err != nil || c.Status != inbox.Acquired {
			t.Fatalf("TryBegin(%s) = %+v, %v", key, c, err)
		}
		if err := s.Complete(ctx, key, c.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	complete("a")
	held, err := s.TryBegin(ctx, "b", inbox.BeginOptions{})
	if err != nil {
		t.Fatal(err)
	}
	complete("c")
	complete("d") // evicts "a": the oldest record without a live lease
	if st := s.Stats(); st.Entries != 3 || st.Evicted != 1 {
		t.Fatalf("stats %+v, want 3 entries and 1 eviction", st)
	}
	if ok, _ := s.IsProcessed(ctx, "a"); ok {
		t.Fatal(`"a" should have been evicted`)
	}
	for _, k := range []string{"c", "d"} {
		if ok, _ := s.IsProcessed(ctx, k); !ok {
			t.Fatalf("%q should still be processed", k)
		}
	}
	if r, _ := s.Get(ctx, "b"); r.State != inbox.StateInProgress {
		t.Fatalf(`live lease "b" was touched: %v`, r.State)
	}
	_ = held
}

func TestMaxEntries_all_leased_is_unavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := memory.New(memory.Options{MaxEntries: 2})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := s.TryBegin(ctx, fmt.Sprint(i), inbox.BeginOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = s.TryBegin(ctx, "x", inbox.BeginOptions{})
	if !errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Fatalf("TryBegin on a full store of live leases: %v, want ErrStoreUnavailable", err)
	}
	if r, _ := s.Get(ctx, "x"); r.State != inbox.StateNotFound {
		t.Fatalf("refused TryBegin created a record: %+v", r)
	}
}

func TestMaxEntries_expired_records_make_room_first(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := memory.New(memory.Options{MaxEntries: 2, Retention: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b"} {
		if err := s.MarkProcessed(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if ok, _ := s.IsProcessed(ctx, "b"); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("retention of 1ms never ran out")
		}
		time.Sleep(time.Millisecond)
	}
	if err := s.MarkProcessed(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Evicted != 0 {
		t.Fatalf("expired records should be swept, not evicted: %+v", st)
	}
}

// Records removed by eviction or expiry free their slot for the next key:
// nothing of the old record (owner, payload hash, attempts, lease) may show
// through in the new one, and the list must stay consistent through many
// reuses.
func TestSlotReuse_starts_clean(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := memory.New(memory.Options{MaxEntries: 2, Lease: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for n := range 50 {
		key := fmt.Sprintf("k%d", n)
		opts := inbox.BeginOptions{}
		if n%2 == 0 {
			opts = inbox.BeginOptions{Owner: "o" + key, PayloadHash: "h" + key, LeaseID: "lease-" + key}
		}
		c, err := s.TryBegin(ctx, key, opts)
		if err != nil || c.Status != inbox.Acquired {
			t.Fatalf("TryBegin(%s) = %+v, %v", key, c, err)
		}
		r, err := s.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if r.State != inbox.StateInProgress || r.Attempts != 1 || r.Owner != opts.Owner || r.PayloadHash != opts.PayloadHash {
			t.Fatalf("new record %s = %+v, want a fresh one with %+v", key, r, opts)
		}
		if n > 0 {
			prev := fmt.Sprintf("k%d", n-1)
			if err := s.Complete(ctx, prev, "lease-"+prev); n%2 == 0 && !errors.Is(err, inbox.ErrLeaseLost) {
				t.Fatalf("Complete(%s) with a lease it never had: %v", prev, err)
			}
		}
		if n%2 == 0 {
			if err := s.Complete(ctx, key, c.LeaseID); err != nil {
				t.Fatal(err)
			}
		} else if err := s.Release(ctx, key, c.LeaseID); err != nil {
			t.Fatal(err)
		}
		if n >= 2 {
			if r, _ := s.Get(ctx, fmt.Sprintf("k%d", n-2)); r.State != inbox.StateNotFound {
				t.Fatalf("k%d should have been evicted: %+v", n-2, r)
			}
		}
		if st := s.Stats(); st.Entries != min(n+1, 2) {
			t.Fatalf("after %s: %+v", key, st)
		}
	}
}

// Records are kept in chunks of slots: a store larger than a chunk, that
// evicts and reuses slots across chunks, keeps every key it should.
func TestManyRecords_across_chunks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const max, total = 2500, 6000
	s, err := memory.New(memory.Options{MaxEntries: max})
	if err != nil {
		t.Fatal(err)
	}
	for n := range total {
		key := fmt.Sprintf("key-%d", n)
		c, err := s.TryBegin(ctx, key, inbox.BeginOptions{Owner: key})
		if err != nil || c.Status != inbox.Acquired {
			t.Fatalf("TryBegin(%s) = %+v, %v", key, c, err)
		}
		if err := s.Complete(ctx, key, c.LeaseID); err != nil {
			t.Fatal(err)
		}
	}
	if st := s.Stats(); st.Entries != max || st.Evicted != total-max {
		t.Fatalf("stats %+v, want %d entries and %d evictions", st, max, total-max)
	}
	for n := range total {
		key := fmt.Sprintf("key-%d", n)
		r, err := s.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if kept := n >= total-max; kept != (r.State == inbox.StateProcessed) || kept && (r.Owner != key || r.Attempts != 1) {
			t.Fatalf("%s: %+v (kept: %v)", key, r, kept)
		}
	}
}

// Lease ids of up to 32 bytes are kept in the record, longer ones as strings:
// ids of either kind, and near misses across the boundary, must be compared
// byte for byte.
func TestLeaseIDs_compared_byte_for_byte(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	hex := "0123456789abcdef0123456789abcdef"
	ids := []string{hex, strings.ToUpper(hex), hex[:31], hex + "0", hex[:31] + "g", "lease-1", "é" + hex[2:], inbox.NewLeaseID()}
	s, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for n, held := range ids {
		key := fmt.Sprintf("k%d", n)
		c, err := s.TryBegin(ctx, key, inbox.BeginOptions{LeaseID: held})
		if err != nil || c.Status != inbox.Acquired || c.LeaseID != held {
			t.Fatalf("TryBegin(%s, %q) = %+v, %v", key, held, c, err)
		}
		if c, err := s.TryBegin(ctx, key, inbox.BeginOptions{LeaseID: held}); err != nil || c.Status != inbox.Acquired || c.LeaseID != held {
			t.Fatalf("retry of TryBegin(%s, %q) = %+v, %v", key, held, c, err)
		}
		for _, other := range ids {
			if other == held {
				continue
			}
			if c, err := s.TryBegin(ctx, key, inbox.BeginOptions{LeaseID: other}); err != nil || c.Status != inbox.Busy {
				t.Fatalf("TryBegin(%s, %q) while %q holds it = %+v, %v", key, other, held, c, err)
			}
			if err := s.Complete(ctx, key, other); !errors.Is(err, inbox.ErrLeaseLost) {
				t.Fatalf("Complete(%s, %q) while %q holds it: %v", key, other, held, err)
			}
			if _, err := s.Extend(ctx, key, other, time.Minute); !errors.Is(err, inbox.ErrLeaseLost) {
				t.Fatalf("Extend(%s, %q) while %q holds it: %v", key, other, held, err)
			}
		}
		if err := s.Complete(ctx, key, held); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, key, held); err != nil {
			t.Fatalf("repeated Complete(%s, %q): %v", key, held, err)
		}
		if err := s.Release(ctx, key, held); !errors.Is(err, inbox.ErrLeaseLost) {
			t.Fatalf("Release(%s, %q) after Complete: %v", key, held, err)
		}
	}
	// A released lease holds nothing any more, whatever its form.
	for _, held := range ids[:2] {
		c, err := s.TryBegin(ctx, "r", inbox.BeginOptions{LeaseID: held})
		if err != nil || c.Status != inbox.Acquired {
			t.Fatalf("TryBegin(r, %q) = %+v, %v", held, c, err)
		}
		if err := s.Release(ctx, "r", held); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, "r", held); !errors.Is(err, inbox.ErrLeaseLost) {
			t.Fatalf("Complete(r, %q) after Release: %v", held, err)
		}
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	s, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryBegin(context.Background(), "k", inbox.BeginOptions{}); !errors.Is(err, inbox.ErrClosed) {
		t.Fatalf("TryBegin after Close: %v, want ErrClosed", err)
	}
}

func TestOptions_validate(t *testing.T) {
	t.Parallel()
	if _, err := memory.New(memory.Options{Retention: -time.Second}); !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Fatalf("negative retention: %v", err)
	}
	if _, err := memory.New(memory.Options{Lease: -time.Second}); !errors.Is(err, inbox.ErrInvalidLease) {
		t.Fatalf("negative lease: %v", err)
	}
}

func TestOpenURL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := stores.Open(ctx, "memory://?retention=1h&lease=5s&max_entries=10")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := s.TryBegin(ctx, "k", inbox.BeginOptions{})
	if err != nil || c.Lease != 5*time.Second {
		t.Fatalf("TryBegin through a URL-opened store: %+v, %v; want the URL's 5s lease", c, err)
	}
	for _, bad := range []string{
		"memory://?retention=forever",
		"memory://?lease=-1s",
		"memory://?max_entries=ten",
		"memory://?max_entrys=10",
		"memory://somehost",
		"memory://?retention=1h&retention=2h",
	} {
		if _, err := stores.Open(ctx, bad); !errors.Is(err, stores.ErrInvalidURL) {
			t.Errorf("Open(%q): %v, want ErrInvalidURL", bad, err)
		}
	}
}
