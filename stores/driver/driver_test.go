package driver_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
)

// fake is a Driver that records what it is given. apply, when set, answers
// each batch; gate, when set, holds every Apply until it is closed.
type fake struct {
	mu      sync.Mutex
	batches [][]driver.Op
	closed  int
	gate    chan struct{}
	entered chan struct{}
	apply   func(ops []driver.Op, res []inbox.Claim, errs []error) error
	extend  func(ctx context.Context) (time.Time, error)
	get     func(ctx context.Context) (inbox.Record, error)
}

func (f *fake) Apply(ctx context.Context, ops []driver.Op, res []inbox.Claim, errs []error) error {
	f.mu.Lock()
	f.batches = append(f.batches, append([]driver.Op(nil), ops...))
	gate, entered, apply := f.gate, f.entered, f.apply
	f.mu.Unlock()
	if entered != nil {
		entered <- struct{}{}
	}
	if gate != nil {
		<-gate
	}
	if apply != nil {
		return apply(ops, res, errs)
	}
	for i, op := range ops {
		if op.Kind == driver.Claim {
			res[i] = inbox.Claim{Status: inbox.Acquired, LeaseID: op.LeaseID, Lease: op.Lease}
		}
	}
	return nil
}

func (f *fake) Extend(ctx context.Context, _, _ string, _ time.Duration) (time.Time, error) {
	if f.extend != nil {
		return f.extend(ctx)
	}
	return time.Unix(1, 0), nil
}

func (f *fake) Get(ctx context.Context, _ string) (inbox.Record, error) {
	if f.get != nil {
		return f.get(ctx)
	}
	return inbox.Record{State: inbox.StateProcessed}, nil
}

func (f *fake) List(context.Context, inbox.ListOptions) (inbox.ListPage, error) {
	return inbox.ListPage{}, nil
}

func (f *fake) Forget(context.Context, string) error { return nil }

func (f *fake) ForceRelease(context.Context, string) error { return nil }

func (f *fake) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed++
	return nil
}

func (f *fake) got() [][]driver.Op {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]driver.Op(nil), f.batches...)
}

func newStore(t *testing.T, f *fake, cfg driver.Config) *driver.Store {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "fake store"
	}
	if cfg.Lease == 0 {
		cfg.Lease = 30 * time.Second
	}
	s, err := driver.New(f, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNew_refuses_bad_config(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]driver.Config{
		"no name":          {Lease: time.Second},
		"lease over max":   {Name: "x", Lease: time.Hour, MaxLease: time.Minute},
		"negative max":     {Name: "x", Lease: time.Second, MaxLease: -1},
		"negative default": {Name: "x", Lease: -time.Second},
	} {
		if _, err := driver.New(&fake{}, c); !errors.Is(err, inbox.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := driver.New(nil, driver.Config{Name: "x", Lease: time.Second}); !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Errorf("nil driver: %v", err)
	}
}

func TestStore_fills_in_lease_and_lease_id(t *testing.T) {
	t.Parallel()
	f := &fake{}
	s := newStore(t, f, driver.Config{Lease: 7 * time.Second})
	c, err := s.TryBegin(context.Background(), "k", inbox.BeginOptions{Owner: "me", PayloadHash: "h"})
	if err != nil {
		t.Fatal(err)
	}
	op := f.got()[0][0]
	if op.Kind != driver.Claim || op.Key != "k" || op.Lease != 7*time.Second || op.LeaseID == "" || op.Owner != "me" || op.PayloadHash != "h" {
		t.Fatalf("op %+v", op)
	}
	if c.LeaseID != op.LeaseID {
		t.Fatalf("claim lease id %q, op's %q", c.LeaseID, op.LeaseID)
	}
	if _, err := s.TryBegin(context.Background(), "k", inbox.BeginOptions{LeaseID: "mine", Lease: time.Second}); err != nil {
		t.Fatal(err)
	}
	if op := f.got()[1][0]; op.LeaseID != "mine" || op.Lease != time.Second {
		t.Fatalf("op %+v", op)
	}
}

// Bad input is refused before the driver sees anything, wrapping the
// sentinel that names the problem.
func TestStore_validates_before_the_driver(t *testing.T) {
	t.Parallel()
	f := &fake{}
	s := newStore(t, f, driver.Config{MaxLease: time.Hour})
	ctx := context.Background()
	long := strings.Repeat("k", inbox.MaxKeyLen+1)
	for name, err := range map[string]error{
		"empty key":     errOf(s.TryBegin(ctx, "", inbox.BeginOptions{})),
		"long key":      errOf(s.Get(ctx, long)),
		"neg lease":     errOf(s.TryBegin(ctx, "k", inbox.BeginOptions{Lease: -1})),
		"lease too big": errOf(s.TryBegin(ctx, "k", inbox.BeginOptions{Lease: 2 * time.Hour})),
		"extend zero":   errOf(s.Extend(ctx, "k", "l", 0)),
		"extend big":    errOf(s.Extend(ctx, "k", "l", 2*time.Hour)),
		"empty lease":   s.Complete(ctx, "k", ""),
		"release nul":   s.Release(ctx, "k\x00", "l"),
		"mark empty":    s.MarkProcessed(ctx, ""),
		"is processed":  errOf(s.IsProcessed(ctx, "")),
		"fail negative": s.Fail(ctx, "k", "l", inbox.FailOptions{RetryAfter: -1}),
		"fail reason":   s.Fail(ctx, "k", "l", inbox.FailOptions{Reason: strings.Repeat("r", inbox.MaxReasonLen+1)}),
		"fail nul":      s.Fail(ctx, "k", "l", inbox.FailOptions{Reason: "a\x00"}),
		"list limit":    errOf(s.List(ctx, inbox.ListOptions{Limit: inbox.MaxListLimit + 1})),
		"list state":    errOf(s.List(ctx, inbox.ListOptions{State: 99})),
		"forget empty":  s.Forget(ctx, ""),
		"force empty":   s.ForceRelease(ctx, ""),
	} {
		if !errors.Is(err, inbox.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", name, err)
		}
	}
	if b := f.got(); len(b) != 0 {
		t.Fatalf("the driver was called: %v", b)
	}
}

func errOf[T any](_ T, err error) error { return err }

func TestStore_closed_and_canceled(t *testing.T) {
	t.Parallel()
	f := &fake{}
	s := newStore(t, f, driver.Config{})
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.TryBegin(canceled, "k", inbox.BeginOptions{}); !errors.Is(err, context.Canceled) || errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Fatalf("canceled: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil || f.closed != 1 {
		t.Fatalf("second Close: %v, driver closed %d times", err, f.closed)
	}
	for name, err := range map[string]error{
		"TryBegin": errOf(s.TryBegin(context.Background(), "k", inbox.BeginOptions{})),
		"Complete": s.Complete(context.Background(), "k", "l"),
		"Get":      errOf(s.Get(context.Background(), "k")),
		"Extend":   errOf(s.Extend(context.Background(), "k", "l", time.Second)),
	} {
		if !errors.Is(err, inbox.ErrClosed) || !strings.Contains(err.Error(), `fake store: `+name+` "k"`) {
			t.Errorf("%s after Close: %v", name, err)
		}
	}
	if len(f.got()) != 0 {
		t.Fatal("the driver was called")
	}
}

// Errors name the store, the operation and the key; the driver's inbox
// sentinels are kept, anything else is ErrStoreUnavailable.
func TestStore_maps_driver_errors(t *testing.T) {
	t.Parallel()
	boom := errors.New("connection reset")
	f := &fake{apply: func(ops []driver.Op, res []inbox.Claim, errs []error) error {
		switch ops[0].Key {
		case "lost":
			errs[0] = fmt.Errorf("%w: not held", inbox.ErrLeaseLost)
		case "odd":
			errs[0] = errors.New("odd reply")
		case "down":
			return boom
		}
		return nil
	}}
	s := newStore(t, f, driver.Config{})
	ctx := context.Background()
	if err := s.Complete(ctx, "lost", "l"); !errors.Is(err, inbox.ErrLeaseLost) || errors.Is(err, inbox.ErrStoreUnavailable) ||
		err.Error() != `fake store: Complete "lost": inbox: lease lost: not held` {
		t.Errorf("lost: %v", err)
	}
	if err := s.Release(ctx, "odd", "l"); !errors.Is(err, inbox.ErrStoreUnavailable) || !strings.Contains(err.Error(), "odd reply") {
		t.Errorf("odd: %v", err)
	}
	if err := s.MarkProcessed(ctx, "down"); !errors.Is(err, inbox.ErrStoreUnavailable) || !errors.Is(err, boom) ||
		!strings.Contains(err.Error(), `fake store: MarkProcessed "down"`) {
		t.Errorf("down: %v", err)
	}
	// A driver answering no status is a fault, not an acquisition.
	f.apply = func([]driver.Op, []inbox.Claim, []error) error { return nil }
	if _, err := s.TryBegin(ctx, "k", inbox.BeginOptions{}); !errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Errorf("no status: %v", err)
	}
}

// Timeout bounds a call the driver does not answer: the error wraps both
// ErrStoreUnavailable and DeadlineExceeded. A caller's own earlier deadline
// is used as it is.
func TestStore_timeout(t *testing.T) {
	t.Parallel()
	f := &fake{get: func(ctx context.Context) (inbox.Record, error) {
		<-ctx.Done()
		return inbox.Record{}, ctx.Err()
	}}
	s := newStore(t, f, driver.Config{Timeout: 50 * time.Millisecond})
	start := time.Now()
	_, err := s.Get(context.Background(), "k")
	if !errors.Is(err, inbox.ErrStoreUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %s", d)
	}
	var seen time.Time
	f.extend = func(ctx context.Context) (time.Time, error) {
		seen, _ = ctx.Deadline()
		return time.Unix(1, 0), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	want, _ := ctx.Deadline()
	if _, err := s.Extend(ctx, "k", "l", time.Second); err != nil || !seen.Equal(want) {
		t.Fatalf("Extend: %v; deadline %v, want the caller's %v", err, seen, want)
	}
}

// Calls that arrive while a round trip is in flight travel together in the
// next, in the order they were made; BatchStats counts them.
func TestStore_batches_calls_made_during_a_round_trip(t *testing.T) {
	t.Parallel()
	f := &fake{gate: make(chan struct{}), entered: make(chan struct{}, 16)}
	s := newStore(t, f, driver.Config{Batch: driver.Batch{MaxBatch: 8}})
	ctx := context.Background()
	var wg sync.WaitGroup
	call := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				t.Error(err)
			}
		}()
	}
	call(func() error { return s.Complete(ctx, "first", "l") })
	<-f.entered // the first round trip is in flight, holding the gate
	call(func() error { return s.Release(ctx, "a", "l") })
	waitBatched(t, s, 1)
	call(func() error { return errOf(s.TryBegin(ctx, "a", inbox.BeginOptions{})) })
	waitBatched(t, s, 2)
	call(func() error { return s.MarkProcessed(ctx, "b") })
	waitBatched(t, s, 3)
	close(f.gate)
	wg.Wait()
	b := f.got()
	if len(b) != 2 || len(b[1]) != 3 {
		t.Fatalf("batches %v", b)
	}
	if k := [3]driver.Kind{b[1][0].Kind, b[1][1].Kind, b[1][2].Kind}; k != [3]driver.Kind{driver.Release, driver.Claim, driver.Mark} {
		t.Fatalf("second batch out of order: %v", k)
	}
	st := s.BatchStats()
	if st.RoundTrips != 2 || st.Calls != 4 || st.Sizes[0] != 1 || st.Sizes[2] != 1 || st.Mean() != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// Each caller of a batch gets its own claim, every field as the driver set
// it: Busy on a backoff says BackingOff, Busy on a live lease does not.
func TestStore_batched_claims_keep_their_fields(t *testing.T) {
	t.Parallel()
	f := &fake{gate: make(chan struct{}), entered: make(chan struct{}, 16)}
	f.apply = func(ops []driver.Op, res []inbox.Claim, errs []error) error {
		for i, op := range ops {
			switch op.Key {
			case "backoff":
				res[i] = inbox.Claim{Status: inbox.Busy, ExpiresAt: time.Unix(20, 0), RetryAfter: 20 * time.Second, BackingOff: true, Attempts: 2}
			case "held":
				res[i] = inbox.Claim{Status: inbox.Busy, ExpiresAt: time.Unix(10, 0), RetryAfter: 10 * time.Second, Attempts: 1}
			default:
				res[i] = inbox.Claim{Status: inbox.Acquired, LeaseID: op.LeaseID, Lease: op.Lease}
			}
		}
		return nil
	}
	s := newStore(t, f, driver.Config{Batch: driver.Batch{MaxBatch: 8}})
	ctx := context.Background()
	first := make(chan error, 1)
	go func() { first <- errOf(s.TryBegin(ctx, "first", inbox.BeginOptions{})) }()
	<-f.entered // the first round trip is in flight, holding the gate
	keys := []string{"backoff", "held", "backoff", "held"}
	claims := make([]inbox.Claim, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			claims[i], errs[i] = s.TryBegin(ctx, k, inbox.BeginOptions{})
		}()
		waitBatched(t, s, i+1)
	}
	close(f.gate)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if b := f.got(); len(b) != 2 || len(b[1]) != len(keys) {
		t.Fatalf("batches %v, want the claims in one batch after the first", b)
	}
	for i, k := range keys {
		c := claims[i]
		if errs[i] != nil {
			t.Fatalf("TryBegin(%q): %v", k, errs[i])
		}
		want := k == "backoff"
		if c.Status != inbox.Busy || c.BackingOff != want || (want && (c.RetryAfter != 20*time.Second || c.Attempts != 2)) ||
			(!want && (c.RetryAfter != 10*time.Second || c.Attempts != 1)) {
			t.Fatalf("TryBegin(%q) = %+v, want the driver's Busy claim of that key (BackingOff %v)", k, c, want)
		}
	}
}

// waitBatched waits until n calls are queued behind the round trip in flight.
func waitBatched(t *testing.T, s *driver.Store, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for driver.Queued(s) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", driver.Queued(s), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A transport failure fails every call of its batch.
func TestStore_transport_failure_fails_the_batch(t *testing.T) {
	t.Parallel()
	f := &fake{gate: make(chan struct{}), entered: make(chan struct{}, 16)}
	s := newStore(t, f, driver.Config{Batch: driver.Batch{MaxBatch: 8}})
	ctx := context.Background()
	first := make(chan error, 1)
	go func() { first <- s.Complete(ctx, "first", "l") }()
	<-f.entered
	errs := make(chan error, 3)
	for i := range 3 {
		go func() { errs <- s.Release(ctx, fmt.Sprint("k", i), "l") }()
		waitBatched(t, s, i+1)
	}
	f.mu.Lock()
	f.apply = func(ops []driver.Op, _ []inbox.Claim, _ []error) error {
		if len(ops) > 1 {
			return errors.New("connection reset")
		}
		return nil
	}
	f.mu.Unlock()
	close(f.gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := <-errs; !errors.Is(err, inbox.ErrStoreUnavailable) || !strings.Contains(err.Error(), "connection reset") {
			t.Fatalf("err = %v", err)
		}
	}
}

func TestBatchStats_buckets(t *testing.T) {
	t.Parallel()
	f := &fake{}
	s := newStore(t, f, driver.Config{})
	for range 3 {
		if err := s.MarkProcessed(context.Background(), "k"); err != nil {
			t.Fatal(err)
		}
	}
	st := s.BatchStats()
	if st.RoundTrips != 3 || st.Calls != 3 || st.Sizes[0] != 3 {
		t.Fatalf("%+v", st)
	}
	if d := st.Sub(driver.BatchStats{RoundTrips: 1, Calls: 1}); d.RoundTrips != 2 || d.Calls != 2 {
		t.Fatalf("Sub: %+v", d)
	}
	for n, want := range map[int]int{1: 0, 2: 1, 3: 2, 4: 2, 5: 3, 128: 7, 129: 8, 1000: 8} {
		if got := driver.Bucket(n); got != want {
			t.Errorf("bucket of %d = %d, want %d", n, got, want)
		}
	}
}

// oneByOne records the calls ApplyEach makes.
type oneByOne struct{ calls []string }

func (o *oneByOne) Claim(_ context.Context, op driver.Op) (inbox.Claim, error) {
	o.calls = append(o.calls, "claim "+op.Key)
	return inbox.Claim{Status: inbox.Acquired, LeaseID: op.LeaseID}, nil
}
func (o *oneByOne) Complete(_ context.Context, key, _ string) error {
	o.calls = append(o.calls, "complete "+key)
	return fmt.Errorf("%w: not held", inbox.ErrLeaseLost)
}
func (o *oneByOne) Release(_ context.Context, key, _ string) error {
	o.calls = append(o.calls, "release "+key)
	return nil
}
func (o *oneByOne) Mark(_ context.Context, key string) error {
	o.calls = append(o.calls, "mark "+key)
	return nil
}
func (o *oneByOne) Fail(_ context.Context, key, _ string, f inbox.FailOptions) error {
	o.calls = append(o.calls, "fail "+key+" "+f.Reason)
	return nil
}

// ApplyEach applies the ops in order, each with its own result and error.
func TestApplyEach_in_order_with_results(t *testing.T) {
	t.Parallel()
	o := &oneByOne{}
	ops := []driver.Op{{Kind: driver.Release, Key: "a"}, {Kind: driver.Claim, Key: "a", LeaseID: "l"}, {Kind: driver.Complete, Key: "b"},
		{Kind: driver.Mark, Key: "c"}, {Kind: driver.Fail, Key: "d", Failure: inbox.FailOptions{Reason: "r"}}, {Kind: 99, Key: "e"}}
	res, errs := make([]inbox.Claim, len(ops)), make([]error, len(ops))
	driver.ApplyEach(context.Background(), o, ops, res, errs)
	want := []string{"release a", "claim a", "complete b", "mark c", "fail d r"}
	if strings.Join(o.calls, ",") != strings.Join(want, ",") {
		t.Fatalf("calls %q, want %q", o.calls, want)
	}
	if res[1].LeaseID != "l" || !errors.Is(errs[2], inbox.ErrLeaseLost) || errs[0] != nil || !errors.Is(errs[5], inbox.ErrNotSupported) {
		t.Fatalf("results %+v, errors %v", res, errs)
	}
}

// A store that neither batches nor runs in process makes the calls of Go
// on a fixed set of workers (Config.Workers), one call each at a time, the
// others queued: never a goroutine per call. Every call gets its answer.
func TestStore_Go_without_batching_runs_on_a_fixed_set_of_workers(t *testing.T) {
	t.Parallel()
	f := &fake{gate: make(chan struct{}), entered: make(chan struct{}, 64)}
	s := newStore(t, f, driver.Config{Workers: 3})
	t.Cleanup(func() { _ = s.Close() })
	const n = 20
	answers := make(chan error, n)
	for i := range n {
		s.Go(context.Background(), driver.Op{Kind: driver.Mark, Key: fmt.Sprintf("k%d", i)}, func(_ inbox.Claim, err error) { answers <- err })
	}
	for range 3 {
		<-f.entered
	}
	waitBatched(t, s, n-3) // three in flight, the rest queued
	select {
	case <-f.entered:
		t.Fatal("a fourth call entered the driver while three workers were busy")
	default:
	}
	close(f.gate)
	for range n {
		if err := <-answers; err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range f.got() {
		if len(b) != 1 {
			t.Fatalf("a worker sent %d calls in one Apply, want one", len(b))
		}
	}
}

func TestNew_refuses_negative_workers(t *testing.T) {
	t.Parallel()
	if _, err := driver.New(&fake{}, driver.Config{Name: "x", Workers: -1}); !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Fatalf("Workers -1: %v, want ErrInvalidArgument", err)
	}
}

// orderFake is a fake that keeps order: it answers claims with an OrderKey
// Behind and records the Order and ReleaseOrder calls.
type orderFake struct {
	fake
	orders []string
}

func (f *orderFake) Order(_ context.Context, orderKey string) (inbox.OrderGate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.orders = append(f.orders, "Order "+orderKey)
	return inbox.OrderGate{Head: "h", Waiting: []string{"w"}}, nil
}

func (f *orderFake) ReleaseOrder(_ context.Context, orderKey, head string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.orders = append(f.orders, "ReleaseOrder "+orderKey+" "+head)
	if head != "h" {
		return fmt.Errorf("%w: head is h", inbox.ErrLeaseLost)
	}
	return nil
}

// A store whose driver keeps no order refuses order keys, Order and
// ReleaseOrder with ErrNotSupported naming the store, after validating
// them, without calling the driver.
func TestStore_order_keys_not_kept(t *testing.T) {
	t.Parallel()
	f := &fake{}
	s := newStore(t, f, driver.Config{})
	ctx := context.Background()
	if s.KeepsOrder() {
		t.Fatal("KeepsOrder without Config.Order")
	}
	for name, err := range map[string]error{
		"TryBegin":     errOf(s.TryBegin(ctx, "k", inbox.BeginOptions{OrderKey: "o"})),
		"Fail":         s.Fail(ctx, "k", "l", inbox.FailOptions{OrderKey: "o"}),
		"Order":        errOf(s.Order(ctx, "o")),
		"ReleaseOrder": s.ReleaseOrder(ctx, "o", "k"),
	} {
		if !errors.Is(err, inbox.ErrNotSupported) || !strings.Contains(err.Error(), "fake store: "+name) {
			t.Errorf("%s: %v, want ErrNotSupported naming the store and the call", name, err)
		}
	}
	long := strings.Repeat("o", inbox.MaxKeyLen+1)
	for name, err := range map[string]error{
		"TryBegin long": errOf(s.TryBegin(ctx, "k", inbox.BeginOptions{OrderKey: long})),
		"Fail nul":      s.Fail(ctx, "k", "l", inbox.FailOptions{OrderKey: "o\x00"}),
		"Order utf8":    errOf(s.Order(ctx, "o\xff")),
		"Order empty":   errOf(s.Order(ctx, "")),
		"Release head":  s.ReleaseOrder(ctx, "o", ""),
	} {
		if !errors.Is(err, inbox.ErrInvalidKey) {
			t.Errorf("%s: %v, want ErrInvalidKey", name, err)
		}
	}
	_, err := s.TryBegin(ctx, "k", inbox.BeginOptions{OrderKey: long})
	if msg := err.Error(); !strings.Contains(msg, "OrderKey is 1025 bytes") || len(msg) > 200 {
		t.Errorf("long OrderKey: %q, want the field named and the value cut", msg)
	}
	if b := f.got(); len(b) != 0 {
		t.Fatalf("the driver was called: %v", b)
	}
}

// A store whose driver keeps order passes order keys on, lets its driver
// answer Behind to a claim with one (and only then), and makes Order and
// ReleaseOrder calls of the driver.
func TestStore_order_keys_kept(t *testing.T) {
	t.Parallel()
	if _, err := driver.New(&fake{}, driver.Config{Name: "x", Order: true}); !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Errorf("Config.Order over a driver that is no Orderer: %v", err)
	}
	f := &orderFake{}
	f.apply = func(ops []driver.Op, res []inbox.Claim, errs []error) error {
		for i, op := range ops {
			if op.Kind == driver.Claim {
				res[i] = inbox.Claim{Status: inbox.Behind, RetryAfter: time.Second}
			}
		}
		return nil
	}
	s, err := driver.New(f, driver.Config{Name: "order store", Lease: time.Minute, Order: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if !s.KeepsOrder() {
		t.Fatal("KeepsOrder false with Config.Order")
	}
	c, err := s.TryBegin(ctx, "k", inbox.BeginOptions{OrderKey: "o"})
	if err != nil || c.Status != inbox.Behind || c.RetryAfter != time.Second {
		t.Fatalf("claim with an OrderKey = %+v, %v; want the driver's Behind", c, err)
	}
	if _, err := s.TryBegin(ctx, "k", inbox.BeginOptions{}); !errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Fatalf("Behind to a claim without an OrderKey: %v, want ErrStoreUnavailable", err)
	}
	if err := s.Fail(ctx, "k", "l", inbox.FailOptions{OrderKey: "o", RetryAfter: time.Second}); err != nil {
		t.Fatal(err)
	}
	b := f.got()
	if len(b) != 3 || b[0][0].OrderKey != "o" || b[1][0].OrderKey != "" || b[2][0].Failure.OrderKey != "o" {
		t.Fatalf("ops %+v; want the order keys passed on", b)
	}
	if g, err := s.Order(ctx, "o"); err != nil || g.Head != "h" || len(g.Waiting) != 1 {
		t.Fatalf("Order = %+v, %v", g, err)
	}
	if err := s.ReleaseOrder(ctx, "o", "h"); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseOrder(ctx, "o", "x"); !errors.Is(err, inbox.ErrLeaseLost) || !strings.Contains(err.Error(), `order store: ReleaseOrder "o"`) {
		t.Fatalf("ReleaseOrder past another head: %v", err)
	}
	if !slices.Equal(f.orders, []string{"Order o", "ReleaseOrder o h", "ReleaseOrder o x"}) {
		t.Fatalf("driver calls %q", f.orders)
	}
}
