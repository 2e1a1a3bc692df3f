// Package outage keeps a failing dependency from turning its callers into a
// load generator. [Pacer] spaces the calls of all callers during an outage;
// [Log] keeps the logs readable: the first failure of an outage is logged
// with its cause, then at most one line per interval with the count of
// failures since the last line, and the recovery once. A consumer whose
// store is down sees many messages a second; a call and a line each would
// load the store and bury everything else.
package outage

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// Every is the least time between two lines of one outage.
const Every = 10 * time.Second

// Log rate-limits the error lines of an outage. It is safe for concurrent
// use; OK is one atomic load while nothing fails.
type Log struct {
	log       watermill.LoggerAdapter
	recovered string // the recovery line
	every     time.Duration
	failing   atomic.Bool
	mu        sync.Mutex
	since     time.Time // the outage's first failure
	logged    time.Time // its latest line
	total     int       // failures of the outage
	quiet     int       // failures since its latest line
}

// NewLog returns a Log writing to log, whose recovery line reads recovered.
func NewLog(log watermill.LoggerAdapter, recovered string) *Log {
	return &Log{log: log, recovered: recovered, every: Every}
}

// Fail counts a failure, and logs msg with err and f at error level when it
// starts an outage or Every has passed since the outage's latest line; that
// line also says how many failures went unlogged and for how long the
// dependency has been failing.
func (l *Log) Fail(msg string, err error, f watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	l.total++
	if !l.failing.Load() {
		l.failing.Store(true)
		l.since, l.total, l.quiet = now, 1, 0
	} else if now.Sub(l.logged) < l.every {
		l.quiet++
		return
	}
	if l.quiet > 0 {
		f = f.Add(watermill.LogFields{"failures_not_logged": l.quiet, "failing_for": now.Sub(l.since).Round(time.Millisecond).String()})
	}
	l.logged, l.quiet = now, 0
	l.log.Error(msg, err, f)
}

// OK ends the outage, if any, with one info line giving its failures and
// length.
func (l *Log) OK() {
	if !l.failing.Load() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failing.Load() {
		l.failing.Store(false)
		l.log.Info(l.recovered, watermill.LogFields{
			"failures": l.total, "failing_for": time.Since(l.since).Round(time.Millisecond).String()})
	}
}

// Backoff is the jittered exponential backoff of every retry loop of the
// library: the pause before retry n (n from 0) is drawn uniformly from
// [d/2, d], where d = min(Min × 2^n, Max). The loops and their values:
//
//	loop                                         Min      Max
//	inboxmw: polling a busy key                  20 ms    1 s
//	inboxmw: a failing store's claims (Pacer),
//	         a mark or release after the handler 50 ms    2 s
//	remote client: retrying a call               50 ms    1 s  (or the server's Retry-After, up to 5 s)
//	SQL store: retrying a deadlocked statement   2 ms     256 ms (8 attempts)
type Backoff struct {
	Min, Max time.Duration
}

// Pause returns the pause before retry n (0 for the first retry).
func (b Backoff) Pause(n int) time.Duration {
	d := b.Max
	if n >= 0 && n < 62 && b.Min <= b.Max>>n {
		d = b.Min << n
	}
	return Jitter(d)
}

// Pacer spaces the calls to a failing dependency across all its callers:
// after a failure the next call may go only after the Backoff's pause for
// the number of failures so far; a success ends the outage. An outage then
// costs about one call per pause, however many callers wait. The zero
// value is not usable: set Backoff.
type Pacer struct {
	Backoff
	failing atomic.Bool // fails > 0: Reserve and OK are one load while nothing fails
	mu      sync.Mutex
	fails   int       // failures since the last success
	next    time.Time // the earliest time of the next call
}

// Reserve returns how long the caller must wait before its call: zero
// while nothing fails. During an outage it reserves the next free slot
// (pushing the slot after it one pause later), unless that slot is in the
// future and after deadline: it then returns false and reserves nothing. A
// slot free now is granted whatever the deadline, so a caller that cannot
// wait still probes the dependency once a pause has passed.
func (p *Pacer) Reserve(deadline time.Time) (time.Duration, bool) {
	if !p.failing.Load() {
		return 0, true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fails == 0 {
		return 0, true
	}
	now := time.Now()
	at := p.next
	if at.Before(now) {
		at = now // a slot free now is granted whatever the deadline
	} else if at.After(deadline) {
		return 0, false
	}
	p.next = at.Add(p.Pause(p.fails - 1))
	return at.Sub(now), true
}

// Failed records a failed call: the pause doubles (Min after a success).
func (p *Pacer) Failed() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fails++
	p.failing.Store(true)
	if next := time.Now().Add(p.Pause(p.fails - 1)); next.After(p.next) {
		p.next = next
	}
}

// OK records a call that succeeded: the outage is over.
func (p *Pacer) OK() {
	if !p.failing.Load() {
		return
	}
	p.mu.Lock()
	p.fails, p.next = 0, time.Time{}
	p.failing.Store(false)
	p.mu.Unlock()
}

// Jitter returns a duration drawn uniformly from [d/2, d].
func Jitter(d time.Duration) time.Duration { return d/2 + rand.N(d/2+1) }
