package inboxmw

import (
	"runtime"
	"sync/atomic"
)

// maxIdleWaiters bounds the ack waiters kept parked for the next message:
// enough for the marks pending at once in most deployments (about one per
// message in flight). Waiters beyond it exit once their lease is done.
const maxIdleWaiters = 64

// ackWaiters runs [lease.awaitAck] for the leases whose handler succeeded.
// A waiter that has finished one lease parks for the next instead of
// exiting, so that the ack path costs a channel handoff rather than a new
// goroutine, and keeps its stack: a new goroutine starts with a small stack
// and, on a store whose client calls run deep (go-redis), grows and copies
// it on every Complete.
type ackWaiters struct {
	work    chan *lease  // unbuffered: a send succeeds only when a waiter is idle; nil means exit
	idle    atomic.Int32 // waiters parked on work, or about to be
	closed  atomic.Bool
	spawned atomic.Int64 // waiters started, for tests
}

func newAckWaiters() *ackWaiters { return &ackWaiters{work: make(chan *lease)} }

// handoffTries bounds the attempts of start to hand a lease to a waiter
// that has counted itself idle but not yet reached its receive.
const handoffTries = 3

// start has l's ack awaited by an idle waiter, or by a new one. A waiter
// that has just finished a mark counts itself idle a moment before it parks
// on work; start then yields, so that it parks, and tries again, instead of
// starting a goroutine: with messages coming faster than marks land, about
// a third of messages started one before (measured in the micro benchmark
// of cmd/inboxbench). Every attempt is non-blocking, so start never waits
// for a waiter that is busy or exiting.
func (w *ackWaiters) start(l *lease) {
	for try := 1; ; try++ {
		select {
		case w.work <- l:
			return
		default:
		}
		if try == handoffTries || w.idle.Load() == 0 {
			break
		}
		runtime.Gosched()
	}
	w.spawned.Add(1)
	go w.loop(l)
}

func (w *ackWaiters) loop(l *lease) {
	for l != nil {
		l.awaitAck()
		l = nil // do not keep the message alive while idle
		// Count this waiter idle before looking at closed: close, which sets
		// closed before it reads idle, then either sees it or is seen.
		if w.idle.Add(1) > maxIdleWaiters || w.closed.Load() {
			w.idle.Add(-1)
			return
		}
		l = <-w.work
		w.idle.Add(-1)
	}
}

// close makes the idle waiters exit; waiters busy with a lease exit when
// done.
func (w *ackWaiters) close() {
	w.closed.Store(true)
	for w.idle.Load() > 0 {
		select {
		case w.work <- nil:
		default:
			runtime.Gosched() // a waiter is between counting itself and parking
		}
	}
}
