// Package batch is a group-commit batcher without timers: calls that arrive
// while a round trip is in flight travel together in the next one.
//
// # Design
//
// A call is made with Do, which waits for its result, or with Go, which
// does not: its result goes to a function of the caller's.
//
// A Do that finds fewer than MaxInFlight round trips in flight (by default
// one: the batcher idle) becomes a leader and sends its call at once,
// alone, in the calling goroutine (a single sequential caller therefore
// waits no longer than without the batcher). A Go that finds a round trip
// free hands its call, alone, to one of the batcher's runners: at most
// MaxInFlight goroutines of its own, started on first use and parked while
// idle, so that a caller that does not wait never runs a round trip. Calls
// that arrive while MaxInFlight round trips are in flight are queued. When
// a round trip ends, its goroutine delivers each call's result and, if the
// queue is not empty, takes the next batch (in arrival order, at most
// MaxBatch calls) and hands it to the goroutine of the first Do in it, which
// runs it and hands on in turn, or to a runner when the batch holds no Do;
// so no caller runs more than its own batch, and a round trip's slot is
// freed when the queue is empty.
//
// The queue is bounded (MaxQueue calls): a caller that finds it full waits
// for room, honouring its context. A caller whose context ends while its
// call is queued gets its context's error and the call is not sent; one
// whose context ends after its call was sent gets its context's error at
// once and the result is dropped (except the leader of a batch, which
// returns when its round trip ends).
//
// A round trip is one call of the Func with the batch's requests in arrival
// order. It runs under a context detached from the calls' cancellation
// (the context of its call when the batch has one Do that leads it), with
// the latest of the calls' own deadlines when each has one, so that a
// caller that goes away does not cut the round trip of the others. The
// Func sets a result and an error per call; an error it returns (a
// transport failure) becomes the error of every call of the batch.
//
// # Timeout
//
// Options.Timeout bounds each call, from Do or Go until its result, the
// wait in the queue included, without a timer per call: every call keeps
// its deadline as a value, and one timer of the batcher, armed for the
// earliest deadline outstanding, fails the calls whose deadline has passed
// ([ErrTimeout]) and cancels the context of a round trip once the deadlines
// of all its calls have passed. Calls are made in order and share one
// Timeout, so the timer fires about once a Timeout while calls flow.
package batch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Func sends reqs in one round trip under ctx and fills res[i] and errs[i]
// for reqs[i] (len(res) == len(errs) == len(reqs)). A non-nil return fails
// every call of the batch with that error.
type Func[Q, R any] func(ctx context.Context, reqs []Q, res []R, errs []error) error

// Defaults of Options.
const (
	DefaultMaxBatch    = 128
	DefaultMaxQueue    = 1024
	DefaultMaxInFlight = 1
)

// Options bound a Batcher. Zero or negative fields take their default.
type Options struct {
	// MaxBatch bounds the calls of one round trip. Default DefaultMaxBatch.
	MaxBatch int
	// MaxQueue bounds the calls waiting; callers beyond it wait for room.
	// Default DefaultMaxQueue.
	MaxQueue int
	// MaxInFlight is how many round trips may be in flight at once; a call
	// that finds fewer goes out at once. Default DefaultMaxInFlight (1:
	// pure group commit). Two lets, for example, a latency-critical call
	// start while one in the background is in flight.
	MaxInFlight int
	// Timeout bounds each call until its result (see "Timeout" in the
	// package documentation). Default none.
	Timeout time.Duration
}

// ErrTimeout is the error of a call that had no result within
// Options.Timeout. It wraps context.DeadlineExceeded.
var ErrTimeout = fmt.Errorf("batch: no result within the timeout: %w", context.DeadlineExceeded)

// Batcher groups calls of Do and Go into round trips of a Func. It is safe
// for concurrent use.
type Batcher[Q, R any] struct {
	fn          Func[Q, R]
	maxBatch    int
	maxInFlight int
	timeout     time.Duration
	slots       chan struct{} // one per queued call: the queue's bound

	runq    chan []*call[Q, R] // batches for the runners
	runners sync.Once
	quit    chan struct{} // closed by Close: the runners stop

	mu       sync.Mutex
	inFlight int // round trips in flight or about to be
	queue    []*call[Q, R]
	flights  []*flight[Q, R] // the round trips running, for the timer
	timer    *time.Timer     // Options.Timeout's; nil without one
	armedAt  time.Time       // when timer fires; zero when it is not armed
}

type state uint8

const (
	queued  state = iota // in the queue
	leading              // taken into a batch that this call's goroutine must run
	sent                 // taken into a batch that someone runs
	done                 // result delivered
	dropped              // taken from the queue with its context ended: not sent
	expired              // its deadline passed first: ErrTimeout delivered
)

type call[Q, R any] struct {
	ctx      context.Context
	req      Q
	res      R
	err      error
	deadline time.Time      // Options.Timeout's; zero without one
	state    state          // under Batcher.mu
	batch    []*call[Q, R]  // the batch to run, when state is leading
	wake     chan struct{}  // capacity 1; nil for a call that led at once, and for Go
	then     func(R, error) // Go's; nil for Do
	flight   *flight[Q, R]  // the round trip it is in, once sent
}

// flight is a round trip in progress.
type flight[Q, R any] struct {
	calls    []*call[Q, R]
	deadline time.Time // the latest of its calls' Timeout deadlines
	cancel   context.CancelFunc
}

// New returns a batcher over fn bounded by o.
func New[Q, R any](fn Func[Q, R], o Options) *Batcher[Q, R] {
	if o.MaxBatch <= 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.MaxQueue <= 0 {
		o.MaxQueue = DefaultMaxQueue
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	b := &Batcher[Q, R]{
		fn: fn, maxBatch: o.MaxBatch, maxInFlight: o.MaxInFlight, timeout: max(o.Timeout, 0),
		slots: make(chan struct{}, o.MaxQueue),
		runq:  make(chan []*call[Q, R], o.MaxInFlight),
		quit:  make(chan struct{}),
	}
	if b.timeout > 0 {
		b.timer = time.AfterFunc(time.Hour, b.expire)
		b.timer.Stop()
	}
	return b
}

// Close stops the runners once the batches handed to them are done, and
// the timer. Calls made after Close still get their result: a batch that
// needs a runner then runs in a goroutine of its own.
func (b *Batcher[Q, R]) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-b.quit:
	default:
		close(b.quit)
	}
	if b.timer != nil {
		b.timer.Stop()
		b.armedAt = time.Time{}
	}
}

// Do sends req, alone if the batcher is idle, else with the other calls
// that arrive during the round trip in flight, and returns its result. It
// returns ctx.Err() if ctx ends before the result is known, and
// [ErrTimeout] after Options.Timeout.
func (b *Batcher[Q, R]) Do(ctx context.Context, req Q) (R, error) {
	var zero R
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	c := &call[Q, R]{ctx: ctx, req: req}
	if b.timeout > 0 {
		c.deadline = time.Now().Add(b.timeout)
	}
	b.mu.Lock()
	if b.inFlight < b.maxInFlight {
		b.inFlight++
		b.mu.Unlock()
		return b.lead(c)
	}
	b.mu.Unlock()
	select {
	case b.slots <- struct{}{}:
	case <-ctx.Done():
		return zero, ctx.Err()
	}
	c.wake = make(chan struct{}, 1)
	b.mu.Lock()
	if b.inFlight < b.maxInFlight {
		// A round trip ended while this call waited for room.
		b.inFlight++
		b.mu.Unlock()
		<-b.slots
		return b.lead(c)
	}
	b.enqueue(c)
	b.mu.Unlock()
	select {
	case <-c.wake:
		b.mu.Lock()
		st, batch := c.state, c.batch
		if st == leading {
			c.state, c.batch = sent, nil
		}
		b.mu.Unlock()
		switch st {
		case leading:
			b.run(batch)
			return b.result(c)
		case dropped:
			return zero, ctx.Err()
		}
		return b.result(c)
	case <-ctx.Done():
		b.mu.Lock()
		switch c.state {
		case queued:
			b.unqueue(c)
			b.mu.Unlock()
			<-b.slots
		case leading:
			batch := c.batch
			c.state, c.batch = sent, nil
			b.mu.Unlock()
			go b.run(batch) // the others of the batch still need their round trip
		case done, expired:
			b.mu.Unlock()
			return b.result(c)
		default:
			b.mu.Unlock()
		}
		return zero, ctx.Err()
	}
}

// Go sends req as Do does, without waiting: then is called once with its
// result, from the goroutine that ends its round trip (a runner's or a
// caller's of Do), from the batcher's timer, or before Go returns when ctx
// has ended. then must be quick and must not block: it runs where other
// calls' results wait for it. Go blocks only while the queue is full.
func (b *Batcher[Q, R]) Go(ctx context.Context, req Q, then func(R, error)) {
	var zero R
	if err := ctx.Err(); err != nil {
		then(zero, err)
		return
	}
	c := &call[Q, R]{ctx: ctx, req: req, then: then}
	if b.timeout > 0 {
		c.deadline = time.Now().Add(b.timeout)
	}
	b.mu.Lock()
	if b.inFlight < b.maxInFlight {
		b.inFlight++
		b.mu.Unlock()
		b.dispatch([]*call[Q, R]{c})
		return
	}
	b.mu.Unlock()
	select {
	case b.slots <- struct{}{}:
	case <-ctx.Done():
		then(zero, ctx.Err())
		return
	}
	b.mu.Lock()
	if b.inFlight < b.maxInFlight {
		b.inFlight++
		b.mu.Unlock()
		<-b.slots
		b.dispatch([]*call[Q, R]{c})
		return
	}
	b.enqueue(c)
	b.mu.Unlock()
}

// result returns c's result, or ErrTimeout if its deadline passed first.
func (b *Batcher[Q, R]) result(c *call[Q, R]) (R, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.state == expired {
		var zero R
		return zero, ErrTimeout
	}
	return c.res, c.err
}

// enqueue appends c to the queue. Call with mu held.
func (b *Batcher[Q, R]) enqueue(c *call[Q, R]) {
	c.state = queued
	b.queue = append(b.queue, c)
	b.arm(c.deadline)
}

// unqueue removes c from the queue. Call with mu held.
func (b *Batcher[Q, R]) unqueue(c *call[Q, R]) {
	for i, q := range b.queue {
		if q == c {
			b.queue = append(b.queue[:i], b.queue[i+1:]...)
			return
		}
	}
}

// lead runs c's call alone, as the leader, and hands on.
func (b *Batcher[Q, R]) lead(c *call[Q, R]) (R, error) {
	c.state = sent
	b.run([]*call[Q, R]{c})
	return b.result(c)
}

// dispatch hands batch, which holds no Do waiting to lead it, to a runner.
func (b *Batcher[Q, R]) dispatch(batch []*call[Q, R]) {
	b.runners.Do(func() {
		for range b.maxInFlight {
			go b.runner()
		}
	})
	select {
	case <-b.quit:
		go b.run(batch)
	default:
		// Never blocks: at most maxInFlight batches are in flight, and
		// each runner takes one at a time.
		b.runq <- batch
	}
}

// runner runs the batches handed to it until Close.
func (b *Batcher[Q, R]) runner() {
	for {
		select {
		case batch := <-b.runq:
			b.run(batch)
		case <-b.quit:
			select {
			case batch := <-b.runq:
				b.run(batch)
				continue
			default:
			}
			return
		}
	}
}

// run sends batch in one round trip and finishes it.
func (b *Batcher[Q, R]) run(batch []*call[Q, R]) {
	ok := false
	f := b.takeOff(batch)
	defer func() {
		if !ok {
			// fn panicked: fail the batch and hand on, so that no caller
			// waits forever; the panic goes on.
			for _, c := range batch {
				var zero R
				c.res, c.err = zero, errPanicked
			}
			b.finish(f)
		}
	}()
	b.roundTrip(f)
	ok = true
	b.finish(f)
}

// takeOff registers the round trip of batch for the timer.
func (b *Batcher[Q, R]) takeOff(batch []*call[Q, R]) *flight[Q, R] {
	f := &flight[Q, R]{calls: batch}
	if b.timeout <= 0 {
		return f
	}
	b.mu.Lock()
	for _, c := range batch {
		c.flight = f
		if c.deadline.After(f.deadline) {
			f.deadline = c.deadline
		}
	}
	b.flights = append(b.flights, f)
	b.arm(f.deadline)
	b.mu.Unlock()
	return f
}

// finish delivers the results of f's calls, then hands the next batch, if
// any, to the goroutine of its first Do, or to a runner, or makes the
// batcher idle.
func (b *Batcher[Q, R]) finish(f *flight[Q, R]) {
	var thens []*call[Q, R]
	b.mu.Lock()
	if f.cancel != nil {
		f.cancel()
	}
	for i, g := range b.flights {
		if g == f {
			b.flights = append(b.flights[:i], b.flights[i+1:]...)
			break
		}
	}
	for i, c := range f.calls {
		f.calls[i] = nil
		if c.state == expired {
			continue // its caller has had ErrTimeout
		}
		c.state = done
		if c.then != nil {
			thens = append(thens, c)
		} else if c.wake != nil {
			select {
			case c.wake <- struct{}{}:
			default:
			}
		}
	}
	next, ended := b.take()
	thens = append(thens, ended...)
	var leader *call[Q, R]
	for _, c := range next {
		if c.wake != nil {
			leader = c
			break
		}
	}
	switch {
	case next == nil:
		b.inFlight--
	case leader != nil:
		leader.state, leader.batch = leading, next
	}
	b.mu.Unlock()
	switch {
	case leader != nil:
		select {
		case leader.wake <- struct{}{}:
		default:
		}
	case next != nil:
		b.dispatch(next)
	}
	for _, c := range thens {
		c.then(c.res, c.err)
	}
}

// take removes the next batch from the queue: at most maxBatch calls whose
// context has not ended, in arrival order; calls found ended are dropped
// (those of Go are returned in ended, their error set, for the caller to
// report outside mu). It returns a nil batch when no call is left. Call
// with mu held.
func (b *Batcher[Q, R]) take() (next, ended []*call[Q, R]) {
	n := 0
	for n < len(b.queue) && len(next) < b.maxBatch {
		c := b.queue[n]
		b.queue[n] = nil
		n++
		<-b.slots
		if err := c.ctx.Err(); err != nil {
			c.state = dropped
			if c.then != nil {
				c.err = err
				ended = append(ended, c)
			} else {
				select {
				case c.wake <- struct{}{}:
				default:
				}
			}
			continue
		}
		c.state = sent
		next = append(next, c)
	}
	rest := copy(b.queue, b.queue[n:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	return next, ended
}

// roundTrip calls fn once for f's calls and sets each call's result.
func (b *Batcher[Q, R]) roundTrip(f *flight[Q, R]) {
	batch := f.calls
	n := len(batch)
	ctx := batch[0].ctx
	if n > 1 || batch[0].then != nil {
		var cancel context.CancelFunc
		ctx, cancel = batchContext(batch)
		defer cancel()
	}
	if b.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		b.mu.Lock()
		f.cancel = cancel
		b.mu.Unlock()
	}
	reqs, res, errs := make([]Q, n), make([]R, n), make([]error, n)
	for i, c := range batch {
		reqs[i] = c.req
	}
	err := b.fn(ctx, reqs, res, errs)
	for i, c := range batch {
		if err != nil {
			c.res, c.err = res[i], err
		} else {
			c.res, c.err = res[i], errs[i]
		}
	}
}

// errPanicked fails the calls of a round trip whose Func panicked; the
// panic goes on in the goroutine that ran it.
var errPanicked = errors.New("batch: the round trip panicked")

// batchContext is the context of a round trip of several calls, or of a
// call of Go: detached from their cancellation, with the latest of their
// deadlines when each has one.
func batchContext[Q, R any](batch []*call[Q, R]) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, c := range batch {
		dl, ok := c.ctx.Deadline()
		if !ok {
			return context.WithoutCancel(batch[0].ctx), func() {}
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	return context.WithDeadline(context.WithoutCancel(batch[0].ctx), latest)
}

// arm makes the timer fire by d, the deadline of a call just queued or of
// a round trip just started. Deadlines come in the order of the calls, so
// an armed timer is nearly always early enough already. Call with mu held.
func (b *Batcher[Q, R]) arm(d time.Time) {
	if b.timer == nil || d.IsZero() || (!b.armedAt.IsZero() && !d.Before(b.armedAt)) {
		return
	}
	select {
	case <-b.quit:
		return
	default:
	}
	b.armedAt = d
	b.timer.Reset(time.Until(d))
}

// expire is the timer's: it fails the calls whose deadline has passed,
// cancels the round trips whose calls' deadlines have all passed, and arms
// the timer for the earliest deadline left.
func (b *Batcher[Q, R]) expire() {
	var thens []*call[Q, R]
	now := time.Now()
	b.mu.Lock()
	b.armedAt = time.Time{}
	var next time.Time
	earliest := func(d time.Time) {
		if next.IsZero() || d.Before(next) {
			next = d
		}
	}
	timeout := func(c *call[Q, R]) {
		c.state = expired
		if c.then != nil {
			thens = append(thens, c)
		} else if c.wake != nil {
			select {
			case c.wake <- struct{}{}:
			default:
			}
		}
	}
	kept := b.queue[:0]
	for _, c := range b.queue {
		if now.Before(c.deadline) {
			kept = append(kept, c)
			earliest(c.deadline)
			continue
		}
		<-b.slots
		timeout(c)
	}
	clear(b.queue[len(kept):])
	b.queue = kept
	for _, f := range b.flights {
		for _, c := range f.calls {
			switch {
			case c == nil || c.state != sent:
			case now.Before(c.deadline):
				earliest(c.deadline)
			default:
				timeout(c)
			}
		}
		if !now.Before(f.deadline) && f.cancel != nil {
			f.cancel()
		}
	}
	if !next.IsZero() {
		b.arm(next)
	}
	b.mu.Unlock()
	var zero R
	for _, c := range thens {
		c.then(zero, ErrTimeout)
	}
}

// Queued returns the number of calls waiting for a round trip.
func (b *Batcher[Q, R]) Queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}
