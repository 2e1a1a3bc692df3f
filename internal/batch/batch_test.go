package batch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a Func that echoes each request times ten, records the
// batches it was given and, while gate is not nil, waits for it before
// answering.
type recorder struct {
	mu      sync.Mutex
	batches [][]int
	gate    chan struct{}
	entered chan struct{}
	fail    error
}

func (r *recorder) fn(ctx context.Context, reqs []int, res []int, errs []error) error {
	r.mu.Lock()
	r.batches = append(r.batches, append([]int(nil), reqs...))
	gate, entered := r.gate, r.entered
	r.mu.Unlock()
	if entered != nil {
		entered <- struct{}{}
	}
	if gate != nil {
		<-gate
	}
	if r.fail != nil {
		return r.fail
	}
	for i, q := range reqs {
		if q < 0 {
			errs[i] = fmt.Errorf("negative %d", q)
			continue
		}
		res[i] = q * 10
	}
	return nil
}

func (r *recorder) get() [][]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]int(nil), r.batches...)
}

func waitQueued[Q, R any](t *testing.T, b *Batcher[Q, R], n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for b.Queued() != n {
		if time.Now().After(deadline) {
			t.Fatalf("queue has %d calls, want %d", b.Queued(), n)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

type result struct {
	v   int
	err error
}

// blocked starts a leader call of req 0 whose round trip waits for the
// returned gate, and waits until it is in flight.
func blocked(t *testing.T, r *recorder, b *Batcher[int, int]) (gate chan struct{}, leader chan result) {
	t.Helper()
	gate = make(chan struct{})
	r.gate, r.entered = gate, make(chan struct{}, 100)
	leader = make(chan result, 1)
	go func() {
		v, err := b.Do(context.Background(), 0)
		leader <- result{v, err}
	}()
	<-r.entered
	return gate, leader
}

func TestSingleCallerGoesAtOnce(t *testing.T) {
	r := &recorder{}
	b := New(r.fn, Options{MaxBatch: 0, MaxQueue: 0})
	for i := 1; i <= 3; i++ {
		v, err := b.Do(context.Background(), i)
		if err != nil || v != i*10 {
			t.Fatalf("Do(%d) = %d, %v", i, v, err)
		}
	}
	if got := r.get(); len(got) != 3 || len(got[0]) != 1 || len(got[1]) != 1 {
		t.Fatalf("batches %v, want three of one", got)
	}
	if b.inFlight != 0 || len(b.queue) != 0 {
		t.Fatal("batcher not idle after the calls")
	}
}

func TestSingleCallerRunsInItsGoroutineUnderItsContext(t *testing.T) {
	type key struct{}
	ctx := context.WithValue(context.Background(), key{}, "mine")
	var seen any
	b := New(func(ctx context.Context, reqs, res []int, errs []error) error {
		seen = ctx.Value(key{}) // no race: the same goroutine
		return nil
	}, Options{})
	if _, err := b.Do(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if seen != "mine" {
		t.Fatalf("round trip context value %v", seen)
	}
}

func TestConcurrentCallersBatchedInArrivalOrder(t *testing.T) {
	r := &recorder{}
	b := New(r.fn, Options{MaxBatch: 0, MaxQueue: 0})
	gate, leader := blocked(t, r, b)
	const n = 20
	results := make([]chan result, n)
	for i := range n {
		results[i] = make(chan result, 1)
		go func() {
			v, err := b.Do(context.Background(), i+1)
			results[i] <- result{v, err}
		}()
		waitQueued(t, b, i+1) // arrival order is i's order
	}
	close(gate)
	if res := <-leader; res.err != nil || res.v != 0 {
		t.Fatalf("leader %+v", res)
	}
	for i := range n {
		if res := <-results[i]; res.err != nil || res.v != (i+1)*10 {
			t.Fatalf("call %d: %+v", i+1, res)
		}
	}
	got := r.get()
	if len(got) != 2 {
		t.Fatalf("%d round trips for %d calls, want 2: %v", len(got), n+1, got)
	}
	for i, q := range got[1] {
		if q != i+1 {
			t.Fatalf("second batch %v is not in arrival order", got[1])
		}
	}
}

func TestBatchSizeBound(t *testing.T) {
	r := &recorder{}
	b := New(r.fn, Options{MaxBatch: 4, MaxQueue: 0})
	gate, leader := blocked(t, r, b)
	const n = 10
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if v, err := b.Do(context.Background(), i+1); err != nil || v != (i+1)*10 {
				t.Errorf("Do(%d) = %d, %v", i+1, v, err)
			}
		}()
		waitQueued(t, b, i+1)
	}
	close(gate)
	<-leader
	wg.Wait()
	got := r.get()
	sizes := []int{}
	total := 0
	for _, bt := range got {
		sizes = append(sizes, len(bt))
		total += len(bt)
		if len(bt) > 4 {
			t.Fatalf("batch of %d calls, bound 4: %v", len(bt), got)
		}
	}
	if total != n+1 || len(got) != 4 { // 1, then 4, 4, 2
		t.Fatalf("batches %v (sizes %v)", got, sizes)
	}
}

func TestPerCallErrors(t *testing.T) {
	r := &recorder{}
	b := New(r.fn, Options{MaxBatch: 0, MaxQueue: 0})
	gate, leader := blocked(t, r, b)
	res := make([]chan result, 3)
	for i, q := range []int{1, -2, 3} {
		res[i] = make(chan result, 1)
		go func() {
			v, err := b.Do(context.Background(), q)
			res[i] <- result{v, err}
		}()
		waitQueued(t, b, i+1)
	}
	close(gate)
	<-leader
	if a := <-res[0]; a.err != nil || a.v != 10 {
		t.Fatalf("1: %+v", a)
	}
	if a := <-res[1]; a.err == nil {
		t.Fatalf("-2: %+v, want its error", a)
	}
	if a := <-res[2]; a.err != nil || a.v != 30 {
		t.Fatalf("3: %+v", a)
	}
}

func TestTransportFailureFailsTheBatch(t *testing.T) {
	boom := errors.New("connection reset")
	r := &recorder{}
	b := New(r.fn, Options{MaxBatch: 0, MaxQueue: 0})
	gate, leader := blocked(t, r, b)
	res := make([]chan result, 5)
	for i := range res {
		res[i] = make(chan result, 1)
		go func() {
			v, err := b.Do(context.Background(), i+1)
			res[i] <- result{v, err}
		}()
		waitQueued(t, b, i+1)
	}
	r.mu.Lock()
	r.fail = boom
	r.mu.Unlock()
	close(gate)
	if a := <-leader; !errors.Is(a.err, boom) {
		t.Fatalf("leader: %+v", a)
	}
	for i := range res {
		if a := <-res[i]; !errors.Is(a.err, boom) || a.v != 0 {
			t.Fatalf("call %d: %+v, want the transport error", i, a)
		}
	}
	// The batcher recovers: the next call goes.
	r.mu.Lock()
	r.fail, r.gate, r.entered = nil, nil, nil
	r.mu.Unlock()
	if v, err := b.Do(context.Background(), 7); err != nil || v != 70 {
		t.Fatalf("after the failure: %d, %v", v, err)
	}
}

func TestContextEndsWhileQueued(t *testing.T) {
	r := &recorder{}
	b := New(r.fn, Options{MaxBatch: 0, MaxQueue: 0})
	gate, leader := blocked(t, r, b)
	ctx, cancel := context.WithCancel(context.Background())
	canceled := make(chan result, 1)
	go func() {
		v, err := b.Do(ctx, 99)
		canceled <- result{v, err}
	}()
	waitQueued(t, b, 1)
	other := make(chan result, 1)
	go func() {
		v, err := b.Do(context.Background(), 5)
		other <- result{v, err}
	}()
	waitQueued(t, b, 2)
	cancel()
	if a := <-canceled; !errors.Is(a.err, context.Canceled) {
		t.Fatalf("canceled call: %+v", a)
	}
	close(gate)
	<-leader
	if a := <-other; a.err != nil || a.v != 50 {
		t.Fatalf("other: %+v", a)
	}
	for _, bt := range r.get() {
		for _, q := range bt {
			if q == 99 {
				t.Fatalf("the canceled call was sent: %v", r.get())
			}
		}
	}
	if len(b.slots) != 0 {
		t.Fatalf("%d queue slots held", len(b.slots))
	}
}

func TestContextEndsAfterSendDropsResult(t *testing.T) {
	r := &recorder{}
	b := New(r.fn, Options{MaxBatch: 0, MaxQueue: 0})
	gate, leader := blocked(t, r, b)
	first := make(chan result, 1)
	go func() {
		v, err := b.Do(context.Background(), 2) // leads the next batch
		first <- result{v, err}
	}()
	waitQueued(t, b, 1)
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan result, 1)
	go func() {
		v, err := b.Do(ctx, 3)
		res <- result{v, err}
	}()
	waitQueued(t, b, 2)
	r.mu.Lock()
	gate2 := make(chan struct{})
	r.gate = gate2
	r.mu.Unlock()
	close(gate) // the first round trip ends; the batch of 2 and 3 goes
	<-leader
	<-r.entered // the batch of 2 and 3 is in flight
	cancel()
	if a := <-res; !errors.Is(a.err, context.Canceled) {
		t.Fatalf("%+v, want context.Canceled", a)
	}
	close(gate2)
	if a := <-first; a.err != nil || a.v != 20 {
		t.Fatalf("the batch's leader: %+v", a)
	}
	if got := r.get(); len(got) != 2 || len(got[1]) != 2 {
		t.Fatalf("batches %v", got)
	}
	r.mu.Lock()
	r.gate, r.entered = nil, nil
	r.mu.Unlock()
	if v, err := b.Do(context.Background(), 4); err != nil || v != 40 {
		t.Fatalf("next: %d, %v", v, err)
	}
}

func TestQueueBoundWaitsHonouringContext(t *testing.T) {
	r := &recorder{}
	b := New(r.fn, Options{MaxBatch: 0, MaxQueue: 2})
	gate, leader := blocked(t, r, b)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.Do(context.Background(), i+1); err != nil {
				t.Error(err)
			}
		}()
		waitQueued(t, b, i+1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := b.Do(ctx, 3); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("third call with a full queue: %v", err)
	}
	// One that waits for room gets it once the queue drains.
	later := make(chan result, 1)
	go func() {
		v, err := b.Do(context.Background(), 4)
		later <- result{v, err}
	}()
	time.Sleep(5 * time.Millisecond)
	if n := b.Queued(); n != 2 {
		t.Fatalf("queue has %d, bound 2", n)
	}
	r.mu.Lock()
	r.gate, r.entered = nil, nil
	r.mu.Unlock()
	close(gate)
	<-leader
	wg.Wait()
	if a := <-later; a.err != nil || a.v != 40 {
		t.Fatalf("waiting call: %+v", a)
	}
}

func TestBatchContextDetachedWithLatestDeadline(t *testing.T) {
	var mu sync.Mutex
	var deadlines []time.Time
	var errs []error
	gate := make(chan struct{})
	entered := make(chan struct{}, 10)
	first := true
	b := New(func(ctx context.Context, reqs, res []int, _ []error) error {
		mu.Lock()
		f := first
		first = false
		mu.Unlock()
		if f {
			entered <- struct{}{}
			<-gate
			return nil
		}
		dl, _ := ctx.Deadline()
		mu.Lock()
		deadlines = append(deadlines, dl)
		errs = append(errs, ctx.Err())
		mu.Unlock()
		return nil
	}, Options{})
	go b.Do(context.Background(), 0)
	<-entered
	short, c1 := context.WithTimeout(context.Background(), time.Minute)
	defer c1()
	long, c2 := context.WithTimeout(context.Background(), time.Hour)
	defer c2()
	// Shorter than long's, so that long's is the latest deadline whether or
	// not canceled is still in the batch when it goes out (created after
	// long with time.Hour, its deadline was a few µs later than long's).
	canceled, c3 := context.WithTimeout(context.Background(), 30*time.Minute)
	var wg sync.WaitGroup
	for i, ctx := range []context.Context{short, long, canceled} {
		wg.Add(1)
		go func() { defer wg.Done(); b.Do(ctx, i) }()
		waitQueued(t, b, i+1)
	}
	// 'canceled' ends after the batch is taken: it must not cut the others.
	close(gate)
	c3()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(deadlines) == 0 {
		t.Fatal("no second round trip")
	}
	if want, _ := long.Deadline(); len(deadlines) == 1 && !deadlines[0].Equal(want) {
		t.Fatalf("batch deadline %v, want the latest %v", deadlines[0], want)
	}
}

func TestPanicFailsTheBatchAndHandsOn(t *testing.T) {
	var n atomic.Int32
	gate := make(chan struct{})
	entered := make(chan struct{}, 1)
	b := New(func(ctx context.Context, reqs, res []int, _ []error) error {
		if n.Add(1) == 1 {
			entered <- struct{}{}
			<-gate
			panic("boom")
		}
		copy(res, reqs)
		return nil
	}, Options{})
	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		b.Do(context.Background(), 0)
	}()
	<-entered
	res := make(chan result, 1)
	go func() {
		v, err := b.Do(context.Background(), 1)
		res <- result{v, err}
	}()
	waitQueued(t, b, 1)
	close(gate)
	if p := <-panicked; p != "boom" {
		t.Fatalf("recovered %v", p)
	}
	if a := <-res; a.err != nil || a.v != 1 {
		t.Fatalf("queued call after the panic: %+v", a)
	}
}

func TestManyConcurrentCallers(t *testing.T) {
	var trips, calls atomic.Int64
	var inFlight atomic.Int32
	b := New(func(ctx context.Context, reqs, res []int, errs []error) error {
		if n := inFlight.Add(1); n > 2 {
			t.Errorf("%d round trips in flight at once, bound 2", n)
		}
		defer inFlight.Add(-1)
		trips.Add(1)
		calls.Add(int64(len(reqs)))
		time.Sleep(50 * time.Microsecond)
		for i, q := range reqs {
			res[i] = q + 1
		}
		return nil
	}, Options{MaxBatch: 16, MaxQueue: 64, MaxInFlight: 2})
	const g, per = 32, 200
	var wg sync.WaitGroup
	for w := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				q := w*per + i
				ctx := context.Background()
				var cancel context.CancelFunc = func() {}
				if i%7 == 0 {
					ctx, cancel = context.WithTimeout(ctx, time.Duration(i%3)*50*time.Microsecond)
				}
				v, err := b.Do(ctx, q)
				cancel()
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("Do(%d): %v", q, err)
					}
					continue
				}
				if v != q+1 {
					t.Errorf("Do(%d) = %d", q, v)
				}
			}
		}()
	}
	wg.Wait()
	if trips.Load() >= calls.Load() {
		t.Fatalf("%d round trips for %d calls: no batching", trips.Load(), calls.Load())
	}
	t.Logf("%d round trips for %d calls sent", trips.Load(), calls.Load())
	if b.inFlight != 0 || len(b.queue) != 0 || len(b.slots) != 0 {
		t.Fatalf("not idle at the end: in flight %d queue %d slots %d", b.inFlight, len(b.queue), len(b.slots))
	}
}

func TestMaxInFlight(t *testing.T) {
	r := &recorder{}
	b := New(r.fn, Options{MaxInFlight: 2})
	gate := make(chan struct{})
	r.gate, r.entered = gate, make(chan struct{}, 100)
	res := make(chan result, 4)
	do := func(q int) {
		v, err := b.Do(context.Background(), q)
		res <- result{v, err}
	}
	go do(1)
	<-r.entered
	go do(2) // a second round trip goes at once
	<-r.entered
	go do(3)
	waitQueued(t, b, 1)
	go do(4)
	waitQueued(t, b, 2)
	close(gate)
	for range 4 {
		if a := <-res; a.err != nil {
			t.Fatal(a.err)
		}
	}
	got := r.get()
	if len(got) != 3 || len(got[0]) != 1 || len(got[1]) != 1 || len(got[2]) != 2 {
		t.Fatalf("batches %v, want [1] [2] [3 4]", got)
	}
	if b.inFlight != 0 {
		t.Fatalf("%d round trips in flight at the end", b.inFlight)
	}
}

// goResult starts b.Go(ctx, q) and returns where its result arrives.
func goResult(b *Batcher[int, int], ctx context.Context, q int) chan result {
	ch := make(chan result, 1)
	b.Go(ctx, q, func(v int, err error) { ch <- result{v, err} })
	return ch
}

func TestGo_alone_does_not_wait_for_its_round_trip(t *testing.T) {
	r := &recorder{gate: make(chan struct{}), entered: make(chan struct{}, 10)}
	b := New(r.fn, Options{})
	defer b.Close()
	ch := goResult(b, context.Background(), 7) // returns while fn waits on gate
	<-r.entered
	select {
	case a := <-ch:
		t.Fatalf("result %+v before the round trip ended", a)
	default:
	}
	close(r.gate)
	if a := <-ch; a.err != nil || a.v != 70 {
		t.Fatalf("Go(7) = %+v", a)
	}
}

func TestGo_calls_queued_behind_a_round_trip_travel_together(t *testing.T) {
	r := &recorder{}
	b := New(r.fn, Options{})
	defer b.Close()
	gate, leader := blocked(t, r, b)
	a := goResult(b, context.Background(), 1)
	d := make(chan result, 1)
	go func() {
		v, err := b.Do(context.Background(), 2)
		d <- result{v, err}
	}()
	waitQueued(t, b, 2)
	c := goResult(b, context.Background(), -3)
	waitQueued(t, b, 3)
	close(gate)
	if x := <-leader; x.err != nil {
		t.Fatal(x.err)
	}
	if x := <-a; x.err != nil || x.v != 10 {
		t.Fatalf("Go(1) = %+v", x)
	}
	if x := <-d; x.err != nil || x.v != 20 {
		t.Fatalf("Do(2) = %+v", x)
	}
	if x := <-c; x.err == nil {
		t.Fatalf("Go(-3) = %+v, want its own error", x)
	}
	if got := r.get(); len(got) != 2 || fmt.Sprint(got[1]) != "[1 2 -3]" {
		t.Fatalf("batches %v, want [0] [1 2 -3]", got)
	}
}

func TestGo_batch_without_a_Do_runs_on_a_runner_and_hands_on(t *testing.T) {
	r := &recorder{}
	b := New(r.fn, Options{MaxBatch: 2})
	defer b.Close()
	gate, leader := blocked(t, r, b)
	var chs []chan result
	for q := 1; q <= 5; q++ {
		chs = append(chs, goResult(b, context.Background(), q))
	}
	waitQueued(t, b, 5)
	close(gate)
	<-leader
	for i, ch := range chs {
		if x := <-ch; x.err != nil || x.v != (i+1)*10 {
			t.Fatalf("Go(%d) = %+v", i+1, x)
		}
	}
	if got := fmt.Sprint(r.get()); got != "[[0] [1 2] [3 4] [5]]" {
		t.Fatalf("batches %v", got)
	}
	waitIdle(t, b)
}

func TestGo_context_ended_before_or_while_queued(t *testing.T) {
	r := &recorder{}
	b := New(r.fn, Options{})
	defer b.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if x := <-goResult(b, ctx, 1); !errors.Is(x.err, context.Canceled) {
		t.Fatalf("Go with an ended context = %+v", x)
	}
	gate, leader := blocked(t, r, b)
	ctx, cancel = context.WithCancel(context.Background())
	ch := goResult(b, ctx, 2)
	waitQueued(t, b, 1)
	cancel()
	close(gate)
	<-leader
	if x := <-ch; !errors.Is(x.err, context.Canceled) {
		t.Fatalf("Go canceled while queued = %+v", x)
	}
	if got := fmt.Sprint(r.get()); got != "[[0]]" {
		t.Fatalf("batches %v: the canceled call was sent", got)
	}
	waitIdle(t, b)
}

func TestTimeout_fails_queued_and_sent_calls_and_cancels_the_round_trip(t *testing.T) {
	entered := make(chan struct{}, 10)
	roundTripErr := make(chan error, 10)
	b := New(func(ctx context.Context, reqs, res []int, _ []error) error {
		entered <- struct{}{}
		<-ctx.Done() // a store that never answers
		roundTripErr <- ctx.Err()
		return ctx.Err()
	}, Options{Timeout: 50 * time.Millisecond})
	defer b.Close()
	start := time.Now()
	lead := make(chan result, 1)
	go func() {
		v, err := b.Do(context.Background(), 1)
		lead <- result{v, err}
	}()
	<-entered
	queuedDo := make(chan result, 1)
	go func() {
		v, err := b.Do(context.Background(), 2)
		queuedDo <- result{v, err}
	}()
	waitQueued(t, b, 1)
	queuedGo := goResult(b, context.Background(), 3)
	for name, ch := range map[string]chan result{"leader": lead, "queued Do": queuedDo, "queued Go": queuedGo} {
		if x := <-ch; !errors.Is(x.err, ErrTimeout) || !errors.Is(x.err, context.DeadlineExceeded) {
			t.Errorf("%s = %+v, want ErrTimeout", name, x)
		}
	}
	if err := <-roundTripErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("round trip's context ended with %v, want canceled", err)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("timed out after %v, before the timeout", d)
	}
	waitIdle(t, b)
}

func TestTimeout_a_call_answered_in_time_keeps_its_result(t *testing.T) {
	r := &recorder{}
	b := New(r.fn, Options{Timeout: time.Hour})
	defer b.Close()
	for q := range 100 {
		if v, err := b.Do(context.Background(), q); err != nil || v != q*10 {
			t.Fatalf("Do(%d) = %d, %v", q, v, err)
		}
		if x := <-goResult(b, context.Background(), q); x.err != nil || x.v != q*10 {
			t.Fatalf("Go(%d) = %+v", q, x)
		}
	}
}

// waitIdle waits until b has no round trip in flight and nothing queued.
func waitIdle[Q, R any](t *testing.T, b *Batcher[Q, R]) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b.mu.Lock()
		idle := b.inFlight == 0 && len(b.queue) == 0 && len(b.slots) == 0
		b.mu.Unlock()
		if idle {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the batcher did not become idle")
		}
		time.Sleep(100 * time.Microsecond)
	}
}
