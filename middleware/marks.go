package middleware

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
type inlineMarks struct {
	ib    *Inbox
	n     atomic.Int32 // len(list), read without mu
	mu    sync.Mutex
	list  []*lease
	timer *time.Timer
	delay time.Duration // inlineSweep; tests lengthen it
	armed bool          // timer set
	shut  bool          // Close called: leases go to ack waiters
}

func newInlineMarks(ib *Inbox) *inlineMarks {
	p := &inlineMarks{ib: ib, delay: inlineSweep}
	p.timer = time.AfterFunc(time.Hour, p.sweep)
	p.timer.Stop()
	return p
}

// add queues l until the router's verdict.
func (p *inlineMarks) add(l *lease) {
	p.mu.Lock()
	if p.shut {
		p.mu.Unlock()
		p.ib.waiters.start(l)
		return
	}
	p.list = append(p.list, l)
	p.n.Store(int32(len(p.list)))
	if !p.armed {
		p.armed = true
		p.timer.Reset(p.delay)
	}
	p.mu.Unlock()
}

// settleDecided settles the queued leases whose message the router has
// acked or nacked. The middleware calls it before each message when leases
// are queued.
func (p *inlineMarks) settleDecided() {
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
	p.mu.Lock()
	p.armed = false
	list := p.take()
	p.mu.Unlock()
	p.dispatch(list)
}

// close stops queueing: the queued leases are settled or handed to ack
// waiters, and later ones go to ack waiters directly.
func (p *inlineMarks) close() {
	p.mu.Lock()
	p.shut = true
	p.armed = false
	p.timer.Stop()
	list := p.take()
	p.mu.Unlock()
	p.dispatch(list)
}

// take empties the queue. Call with mu held.
func (p *inlineMarks) take() []*lease {
	list := p.list
	p.list = nil
	p.n.Store(0)
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
