package memory_test

import (
	"context"
	"errors"
	"fmt"
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
