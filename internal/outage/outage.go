// Package outage keeps the logs of a failing dependency readable: the first
// failure of an outage is logged with its cause, then at most one line per
// interval with the count of failures since the last line, and the recovery
// once. A consumer whose store is down handles many messages a second; one
// line each would bury everything else.
package outage

import (
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
