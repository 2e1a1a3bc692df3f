package memory_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
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

// Eviction follows the order of the last write: a key written again moves to
// the back, while reads (Get, IsProcessed, a TryBegin that finds the key
// processed) leave the order as it is.
func TestMaxEntries_evicts_least_recently_written(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := memory.New(memory.Options{MaxEntries: 3})
	if err != nil {
		t.Fatal(err)
	}
	mark := func(key string) {
		t.Helper()
		if err := s.MarkProcessed(ctx, key); err != nil {
			t.Fatalf("MarkProcessed(%s): %v", key, err)
		}
	}
	kept := func(want ...string) {
		t.Helper()
		for _, k := range []string{"a", "b", "c", "d", "e"} {
			ok, err := s.IsProcessed(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if ok != slices.Contains(want, k) {
				t.Fatalf("%q processed: %v; want the kept keys to be %v", k, ok, want)
			}
		}
	}
	mark("a")
	mark("b")
	mark("c")
	mark("a") // written again: b is now the least recently written
	mark("d")
	kept("a", "c", "d")
	if _, err := s.Get(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if c, err := s.TryBegin(ctx, "c", inbox.BeginOptions{}); err != nil || c.Status != inbox.Processed {
		t.Fatalf("TryBegin(c) = %+v, %v", c, err)
	}
	mark("e") // evicts c: reads did not move it
	kept("a", "d", "e")
	if st := s.Stats(); st.Entries != 3 || st.Evicted != 2 {
		t.Fatalf("stats %+v, want 3 entries and 2 evictions", st)
	}
}

func TestMaxEntries_all_leased_is_unavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := memory.New(memory.Options{MaxEntries: 2})
	if err != nil {
		t.Fatal(err)
	}
	var claims []inbox.Claim
	for i := range 2 {
		c, err := s.TryBegin(ctx, fmt.Sprint(i), inbox.BeginOptions{})
		if err != nil {
			t.Fatal(err)
		}
		claims = append(claims, c)
	}
	_, err = s.TryBegin(ctx, "x", inbox.BeginOptions{})
	if !errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Fatalf("TryBegin on a full store of live leases: %v, want ErrStoreUnavailable", err)
	}
	if err := s.MarkProcessed(ctx, "x"); !errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Fatalf("MarkProcessed on a full store of live leases: %v, want ErrStoreUnavailable", err)
	}
	if r, _ := s.Get(ctx, "x"); r.State != inbox.StateNotFound {
		t.Fatalf("refused TryBegin created a record: %+v", r)
	}
	if st := s.Stats(); st.Entries != 2 || st.Evicted != 0 {
		t.Fatalf("stats %+v, want 2 entries and no eviction", st)
	}
	// Keys already held need no room.
	if c, err := s.TryBegin(ctx, "0", inbox.BeginOptions{}); err != nil || c.Status != inbox.Busy {
		t.Fatalf("TryBegin of a held key in a full store = %+v, %v; want Busy", c, err)
	}
	// A released lease makes its record evictable.
	if err := s.Release(ctx, "1", claims[1].LeaseID); err != nil {
		t.Fatal(err)
	}
	if c, err := s.TryBegin(ctx, "x", inbox.BeginOptions{}); err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin after a Release = %+v, %v; want Acquired", c, err)
	}
	if r, _ := s.Get(ctx, "1"); r.State != inbox.StateNotFound {
		t.Fatalf(`released "1" should have been evicted: %+v`, r)
	}
	if r, _ := s.Get(ctx, "0"); r.State != inbox.StateInProgress {
		t.Fatalf(`live lease "0" was touched: %+v`, r)
	}
	if st := s.Stats(); st.Entries != 2 || st.Evicted != 1 {
		t.Fatalf("stats %+v, want 2 entries and 1 eviction", st)
	}
}

// The store reports wall-clock times, without a monotonic reading, and
// FirstSeen <= LastSeen.
func TestTimes_are_wall_clock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now().Round(0)
	c, err := s.TryBegin(ctx, "k", inbox.BeginOptions{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	until, err := s.Extend(ctx, "k", c.LeaseID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now().Round(0)
	for name, tm := range map[string]time.Time{"ExpiresAt": c.ExpiresAt, "Extend": until, "FirstSeen": r.FirstSeen, "LastSeen": r.LastSeen, "LeaseUntil": r.LeaseUntil} {
		if tm != tm.Round(0) {
			t.Errorf("%s %v carries a monotonic reading", name, tm)
		}
	}
	// The clock at New plus monotonic time may drift from the wall clock by
	// a little; a second is far more than enough.
	if r.FirstSeen.Before(before.Add(-time.Second)) || r.LastSeen.After(after.Add(time.Second)) || r.LastSeen.Before(r.FirstSeen) {
		t.Errorf("FirstSeen %v, LastSeen %v, not within [%v, %v]", r.FirstSeen, r.LastSeen, before, after)
	}
	// Extend is no sighting: LastSeen stays the acquisition's.
	if !r.LeaseUntil.Equal(until) || !r.LastSeen.Equal(c.ExpiresAt.Add(-time.Minute)) || until.Sub(r.LastSeen) < time.Hour {
		t.Errorf("LeaseUntil %v, Extend %v, LastSeen %v: want the extended lease an hour after the Extend, LastSeen the acquisition's (%v)",
			r.LeaseUntil, until, r.LastSeen, c.ExpiresAt.Add(-time.Minute))
	}
}

// Leases and retention of centuries, beyond what the monotonic clock reading
// of a time.Time holds, still hold for their length.
func TestHuge_lease_and_retention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := memory.New(memory.Options{Retention: math.MaxInt64})
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.TryBegin(ctx, "k", inbox.BeginOptions{Lease: math.MaxInt64})
	if err != nil || c.Status != inbox.Acquired || !c.ExpiresAt.After(time.Now().AddDate(200, 0, 0)) {
		t.Fatalf("TryBegin with a lease of centuries = %+v, %v", c, err)
	}
	if b, err := s.TryBegin(ctx, "k", inbox.BeginOptions{}); err != nil || b.Status != inbox.Busy || b.RetryAfter < 200*365*24*time.Hour {
		t.Fatalf("TryBegin of the held key = %+v, %v; want Busy for centuries", b, err)
	}
	if err := s.Complete(ctx, "k", c.LeaseID); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.IsProcessed(ctx, "k"); err != nil || !ok {
		t.Fatalf("IsProcessed = %v, %v; want processed for centuries", ok, err)
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
	waitExpired(t, s, "b")
	if err := s.MarkProcessed(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Entries != 1 || st.Evicted != 0 {
		t.Fatalf("expired records should be dropped, not evicted: %+v", st)
	}
}

// Writes sweep expired records, so that they do not wait for MaxEntries to
// be dropped.
func TestExpired_records_are_swept_by_writes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := memory.New(memory.Options{Retention: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b"} {
		if err := s.MarkProcessed(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	waitExpired(t, s, "b") // drops b, which was looked up; a, written before, has expired too
	if st := s.Stats(); st.Entries != 1 {
		t.Fatalf("stats %+v, want the expired a still held", st)
	}
	if err := s.MarkProcessed(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Entries != 1 || st.Evicted != 0 {
		t.Fatalf("stats %+v, want a swept and only c held", st)
	}
}

// waitExpired polls until key is no longer processed: its retention ran out.
func waitExpired(t *testing.T, s *memory.Store, key string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ok, err := s.IsProcessed(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("retention of %q never ran out", key)
		}
		time.Sleep(time.Millisecond) // polling interval, not synchronisation: the condition decides
	}
}

// A key evicted and seen again starts a fresh record: nothing of the old one
// (owner, payload hash, attempts, lease) shows through, and the order of
// records stays consistent through many evictions.
func TestEvicted_key_starts_clean(t *testing.T) {
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

// A store that evicts thousands of records keeps exactly the newest
// MaxEntries of them, each with its own record.
func TestMaxEntries_keeps_the_newest(t *testing.T) {
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

// Lease ids are compared byte for byte: near misses (case, length, a last
// byte, a multi-byte rune) hold nothing.
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
	ctx := context.Background()
	s, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.MarkProcessed(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() error{
		"TryBegin":      func() error { _, err := s.TryBegin(ctx, "k", inbox.BeginOptions{}); return err },
		"Complete":      func() error { return s.Complete(ctx, "k", "lease") },
		"Release":       func() error { return s.Release(ctx, "k", "lease") },
		"Extend":        func() error { _, err := s.Extend(ctx, "k", "lease", time.Second); return err },
		"Get":           func() error { _, err := s.Get(ctx, "k"); return err },
		"IsProcessed":   func() error { _, err := s.IsProcessed(ctx, "k"); return err },
		"MarkProcessed": func() error { return s.MarkProcessed(ctx, "k") },
	} {
		if err := call(); !errors.Is(err, inbox.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if st := s.Stats(); st.Entries != 0 {
		t.Fatalf("Stats after Close: %+v", st)
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

// An order key's gate lives for the retention plus the default lease
// after its last change, then is gone: read as absent, and swept by the
// writes of other gates, so that gates do not pile up.
func TestOrder_gates_expire(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const life = 100 * time.Millisecond // Retention + Lease
	s, err := memory.New(memory.Options{Retention: life / 2, Lease: life / 2})
	if err != nil {
		t.Fatal(err)
	}
	failWith := func(key, orderKey string) {
		t.Helper()
		c, err := s.TryBegin(ctx, key, inbox.BeginOptions{OrderKey: orderKey})
		if err != nil || c.Status != inbox.Acquired {
			t.Fatalf("TryBegin(%s) = %+v, %v", key, c, err)
		}
		if err := s.Fail(ctx, key, c.LeaseID, inbox.FailOptions{OrderKey: orderKey}); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	failWith("head", "o1")
	failWith("head-2", "o2")
	if g := s.Stats().Gates; g != 2 {
		t.Fatalf("%d gates, want 2", g)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		g, err := s.Order(ctx, "o1")
		if err != nil {
			t.Fatal(err)
		}
		if g.Head == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gate of o1 is still %+v after %s", g, time.Since(start))
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
	if e := time.Since(start); e < life {
		t.Fatalf("the gate expired after %s, before its %s", e, life)
	}
	failWith("head-3", "o3") // sweeps the expired gate of o2
	if g := s.Stats().Gates; g != 1 {
		t.Fatalf("%d gates after a write, want 1: expired gates were not swept", g)
	}
}

// Forget of a key leaves the gate it heads: when its message comes back
// it runs, and the others still wait behind it.
func TestOrder_Forget_leaves_the_gate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	claim := func(key string, want inbox.Status) inbox.Claim {
		t.Helper()
		c, err := s.TryBegin(ctx, key, inbox.BeginOptions{OrderKey: "o"})
		if err != nil || c.Status != want {
			t.Fatalf("TryBegin(%s) = %+v, %v; want %v", key, c, err, want)
		}
		return c
	}
	c := claim("head", inbox.Acquired)
	if err := s.Fail(ctx, "head", c.LeaseID, inbox.FailOptions{Dead: true, OrderKey: "o"}); err != nil {
		t.Fatal(err)
	}
	claim("a", inbox.Behind)
	if err := s.Forget(ctx, "head"); err != nil {
		t.Fatal(err)
	}
	if g, err := s.Order(ctx, "o"); err != nil || g.Head != "head" || !slices.Equal(g.Waiting, []string{"a"}) {
		t.Fatalf("Order after Forget of the head = %+v, %v", g, err)
	}
	c = claim("head", inbox.Acquired)
	claim("a", inbox.Behind)
	if err := s.Complete(ctx, "head", c.LeaseID); err != nil {
		t.Fatal(err)
	}
	claim("a", inbox.Acquired)
}
