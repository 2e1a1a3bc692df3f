package inboxmw

import (
	"sync"
	"sync/atomic"
	"time"
)

// inlineSweep is how long a lease waits in inlineMarks for the next message
// before a timer settles it, or hands it to an ack waiter if the router has
// not decided yet.
const inlineSweep = 10 * time.Millisecond

// inlineMarks holds the leases whose handler succeeded and whose message
// awaits the router's ack or nack, on a store whose calls never block
// ([inbox.BoundedCalls] reporting zero: the memory store). The router acks
// right after the middleware returns, so instead of a goroutine waiting for
// each ack (a handoff between goroutines per message, which costs more than
// the store's own work), the next message the middleware sees settles the
// leases decided meanwhile, on its own goroutine: Complete on ack, Release on
// nack. When no message follows, a timer does it within inlineSweep, and
// passes the leases still undecided to ack waiters.
//
// One lease at a time (a handler, one message after another) waits in slot,
// without a lock; more wait in list.
type inlineMarks struct {
	ib    *Inbox
	slot  atomic.Pointer[lease]
	n     atomic.Int32 // len(list), read without mu
	armed atomic.Bool  // timer set
	shut  atomic.Bool  // Close called: leases go to ack waiters
	mu    sync.Mutex
	list  []*lease
	timer *time.Timer
	delay time.Duration // inlineSweep; tests lengthen it
}

func newInlineMarks(ib *Inbox) *inlineMarks {
	p := &inlineMarks{ib: ib, delay: inlineSweep}
	p.timer = time.AfterFunc(time.Hour, p.sweep)
	p.timer.Stop()
	return p
}

// pending reports whether leases are queued.
func (p *inlineMarks) pending() bool { return p.slot.Load() != nil || p.n.Load() != 0 }

// add queues l until the router's verdict.
func (p *inlineMarks) add(l *lease) {
	if p.slot.CompareAndSwap(nil, l) {
		if p.shut.Load() && p.slot.CompareAndSwap(l, nil) {
			p.ib.waiters.start(l) // Close took the queue before l came
			return
		}
		p.arm()
		return
	}
	p.mu.Lock()
	if p.shut.Load() {
		p.mu.Unlock()
		p.ib.waiters.start(l)
		return
	}
	p.list = append(p.list, l)
	p.n.Store(int32(len(p.list)))
	p.mu.Unlock()
	p.arm()
}

// arm sets the timer unless it is set.
func (p *inlineMarks) arm() {
	if !p.armed.Load() && p.armed.CompareAndSwap(false, true) {
		p.timer.Reset(p.delay)
	}
}

// settleDecided settles the queued leases whose message the router has
// acked or nacked. The middleware calls it before each message when leases
// are queued.
func (p *inlineMarks) settleDecided() {
	if l := p.slot.Load(); l != nil {
		if v := l.verdict(); v != undecided && p.slot.CompareAndSwap(l, nil) {
			l.settle(v, false)
		}
	}
	if p.n.Load() == 0 {
		return
	}
	for {
		var buf [16]*lease
		var verdicts [16]verdict
		n := 0
		p.mu.Lock()
		keep := p.list[:0]
		for _, l := range p.list {
			if v := l.verdict(); v != undecided && n < len(buf) {
				buf[n], verdicts[n] = l, v
				n++
				continue
			}
			keep = append(keep, l)
		}
		clear(p.list[len(keep):])
		p.list = keep
		p.n.Store(int32(len(keep)))
		p.mu.Unlock()
		for i := range n {
			buf[i].settle(verdicts[i], false)
		}
		if n < len(buf) {
			return
		}
	}
}

// sweep runs on the timer: it settles every queued lease that is decided
// and hands the others to ack waiters.
func (p *inlineMarks) sweep() {
	p.armed.Store(false)
	p.dispatch(p.take())
}

// close stops queueing: the queued leases are settled or handed to ack
// waiters, and later ones go to ack waiters directly.
func (p *inlineMarks) close() {
	p.shut.Store(true)
	p.timer.Stop()
	p.dispatch(p.take())
}

// take empties the queue.
func (p *inlineMarks) take() []*lease {
	p.mu.Lock()
	list := p.list
	p.list = nil
	p.n.Store(0)
	p.mu.Unlock()
	if l := p.slot.Swap(nil); l != nil {
		list = append(list, l)
	}
	return list
}

func (p *inlineMarks) dispatch(list []*lease) {
	for _, l := range list {
		if v := l.verdict(); v != undecided {
			l.settle(v, false)
		} else {
			p.ib.waiters.start(l)
		}
	}
}
