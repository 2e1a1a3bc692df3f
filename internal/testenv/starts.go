package testenv

import (
	"context"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Starts counts what f starts: goroutines (runtime/metrics'
// /sched/goroutines-created) and timers (the allocations of time.NewTimer,
// time.AfterFunc, time.After and context.WithDeadline and WithTimeout,
// which allocate one runtime timer each, found in the heap profile with
// every allocation sampled). Reset of a timer allocates none and is not
// counted. The counts cover the whole process while f runs: call it from a
// test that is not parallel.
func Starts(t testing.TB, f func()) (goroutines, timers int64) {
	t.Helper()
	startsMu.Lock()
	defer startsMu.Unlock()
	// A change of the rate takes effect at each P's next allocation.
	rate := runtime.MemProfileRate
	runtime.MemProfileRate = 1
	defer func() { runtime.MemProfileRate = rate }()
	g0, t0 := goroutinesCreated(), timersAllocated()
	f()
	return goroutinesCreated() - g0, timersAllocated() - t0
}

var startsMu sync.Mutex

func goroutinesCreated() int64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		panic("testenv: runtime/metrics has no /sched/goroutines-created (Go 1.26 or later needed)")
	}
	return int64(s[0].Value.Uint64())
}

// timersAllocated is the count of timers allocated so far, as the heap
// profile records them: two collections make it current.
func timersAllocated() int64 {
	runtime.GC()
	runtime.GC()
	var recs []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, true)
	for {
		recs = make([]runtime.MemProfileRecord, n+50)
		var ok bool
		if n, ok = runtime.MemProfile(recs, true); ok {
			recs = recs[:n]
			break
		}
	}
	var total int64
	for _, r := range recs {
		frames := runtime.CallersFrames(r.Stack())
		for {
			fr, more := frames.Next()
			if fr.Function == "time.newTimer" { // the runtime's, behind every timer the time package makes
				total += r.AllocObjects
				break
			}
			if !more {
				break
			}
		}
	}
	return total
}

// Deliver passes n messages through h as a router does: UUIDs prefix0,
// prefix1, ..., each with a context of its own that is canceled after the
// ack, as watermill-amqp and watermill-kafka give them. A handler error
// fails the test.
func Deliver(t testing.TB, h message.HandlerFunc, prefix string, n int) {
	t.Helper()
	for i := range n {
		m := message.NewMessage(prefix+strconv.Itoa(i), []byte("{}"))
		ctx, cancel := context.WithCancel(context.Background())
		m.SetContext(ctx)
		_, err := h(m)
		m.Ack()
		cancel()
		if err != nil {
			t.Fatalf("message %s: %v", m.UUID, err)
		}
	}
}
