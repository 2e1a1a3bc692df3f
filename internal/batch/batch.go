// Package batch is a group-commit batcher without timers: calls that arrive
// while a round trip is in flight travel together in the next one.
//
// # Design
//
// No goroutine of its own: a caller that finds fewer than MaxInFlight round
// trips in flight (by default one: the batcher idle) becomes a leader and
// sends its call at once, alone, in the calling goroutine (a single
// sequential caller therefore waits no longer than without the batcher).
// Calls that arrive while MaxInFlight round trips are in flight are queued.
// When the round trip ends, the leader delivers each call's result and, if
// the queue is not empty, takes the next batch (in arrival order, at most
// MaxBatch calls) and hands it to the goroutine of that batch's first call,
// which runs it and hands on in turn; so no caller runs more than its own
// batch, and a round trip's slot is freed when the queue is empty. The only
// goroutine ever started carries a batch whose designated leader's context
// ended before it could run it.
//
// The queue is bounded (MaxQueue calls): a caller that finds it full waits
// for room, honouring its context. A caller whose context ends while its
// call is queued gets its context's error and the call is not sent; one
// whose context ends after its call was sent gets its context's error at
// once and the result is dropped (except the leader of a batch, which
// returns when its round trip ends).
//
// A round trip is one call of the Func with the batch's requests in arrival
// order. It runs under the context of its call when the batch has one call,
// else under a context detached from the calls' cancellation whose deadline
// is the latest of theirs (none if one of them has none), so that a caller
// that goes away does not cut the round trip of the others. The Func sets a
// result and an error per call; an error it returns (a transport failure)
// becomes the error of every call of the batch.
package batch

import (
	"context"
	"errors"
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
}

// Batcher groups calls of Do into round trips of a Func. It is safe for
// concurrent use.
type Batcher[Q, R any] struct {
	fn          Func[Q, R]
	maxBatch    int
	maxInFlight int
	slots       chan struct{} // one per queued call: the queue's bound

	mu       sync.Mutex
	inFlight int // round trips in flight or about to be
	queue    []*call[Q, R]
}

type state uint8

const (
	queued  state = iota // in the queue
	leading              // taken into a batch that this call's goroutine must run
	sent                 // taken into a batch that someone runs
	done                 // result delivered
	dropped              // taken from the queue with its context ended: not sent
)

type call[Q, R any] struct {
	ctx   context.Context
	req   Q
	res   R
	err   error
	state state         // under Batcher.mu
	batch []*call[Q, R] // the batch to run, when state is leading
	wake  chan struct{} // capacity 1; nil for a call that led at once
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
	return &Batcher[Q, R]{fn: fn, maxBatch: o.MaxBatch, maxInFlight: o.MaxInFlight, slots: make(chan struct{}, o.MaxQueue)}
}

// Do sends req, alone if the batcher is idle, else with the other calls
// that arrive during the round trip in flight, and returns its result. It
// returns ctx.Err() if ctx ends before the result is known.
func (b *Batcher[Q, R]) Do(ctx context.Context, req Q) (R, error) {
	var zero R
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	c := &call[Q, R]{ctx: ctx, req: req}
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
	b.queue = append(b.queue, c)
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
			return c.res, c.err
		case dropped:
			return zero, ctx.Err()
		}
		return c.res, c.err
	case <-ctx.Done():
		b.mu.Lock()
		switch c.state {
		case queued:
			for i, q := range b.queue {
				if q == c {
					b.queue = append(b.queue[:i], b.queue[i+1:]...)
					break
				}
			}
			b.mu.Unlock()
			<-b.slots
		case leading:
			batch := c.batch
			c.state, c.batch = sent, nil
			b.mu.Unlock()
			go b.run(batch) // the others of the batch still need their round trip
		case done:
			b.mu.Unlock()
			return c.res, c.err
		default:
			b.mu.Unlock()
		}
		return zero, ctx.Err()
	}
}

// lead runs c's call alone, as the leader, and hands on.
func (b *Batcher[Q, R]) lead(c *call[Q, R]) (R, error) {
	c.state = sent
	b.run([]*call[Q, R]{c})
	return c.res, c.err
}

// run sends batch in one round trip and finishes it.
func (b *Batcher[Q, R]) run(batch []*call[Q, R]) {
	ok := false
	defer func() {
		if !ok {
			// fn panicked: fail the batch and hand on, so that no caller
			// waits forever; the panic goes on.
			for _, c := range batch {
				var zero R
				c.res, c.err = zero, errPanicked
			}
			b.finish(batch)
		}
	}()
	b.roundTrip(batch)
	ok = true
	b.finish(batch)
}

// finish delivers the results of batch, then hands the next batch, if any,
// to its first call's goroutine, or makes the batcher idle.
func (b *Batcher[Q, R]) finish(batch []*call[Q, R]) {
	b.mu.Lock()
	for i, c := range batch {
		c.state = done
		batch[i] = nil
		if c.wake != nil {
			select {
			case c.wake <- struct{}{}:
			default:
			}
		}
	}
	next := b.take()
	if next == nil {
		b.inFlight--
		b.mu.Unlock()
		return
	}
	l := next[0]
	l.state, l.batch = leading, next
	b.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// take removes the next batch from the queue: at most maxBatch calls whose
// context has not ended, in arrival order; calls found ended are dropped.
// It returns nil when no call is left. Call with mu held.
func (b *Batcher[Q, R]) take() []*call[Q, R] {
	var next []*call[Q, R]
	n := 0
	for n < len(b.queue) && len(next) < b.maxBatch {
		c := b.queue[n]
		b.queue[n] = nil
		n++
		<-b.slots
		if c.ctx.Err() != nil {
			c.state = dropped
			select {
			case c.wake <- struct{}{}:
			default:
			}
			continue
		}
		c.state = sent
		next = append(next, c)
	}
	rest := copy(b.queue, b.queue[n:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	return next
}

// roundTrip calls fn once for batch and sets each call's result.
func (b *Batcher[Q, R]) roundTrip(batch []*call[Q, R]) {
	n := len(batch)
	ctx := batch[0].ctx
	if n > 1 {
		var cancel context.CancelFunc
		ctx, cancel = batchContext(batch)
		defer cancel()
	}
	reqs, res, errs := make([]Q, n), make([]R, n), make([]error, n)
	for i, c := range batch {
		reqs[i] = c.req
	}
	err := b.fn(ctx, reqs, res, errs)
	for i, c := range batch {
		if err != nil {
			c.err = err
		} else {
			c.res, c.err = res[i], errs[i]
		}
	}
}

// errPanicked fails the calls of a round trip whose Func panicked; the
// panic goes on in the goroutine that ran it.
var errPanicked = errors.New("batch: the round trip panicked")

// batchContext is the context of a round trip of several calls: detached
// from their cancellation, with the latest of their deadlines.
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

// Queued returns the number of calls waiting for a round trip.
func (b *Batcher[Q, R]) Queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}
