// Package sched runs the actions of many items, each due at a time of its
// own, with one goroutine and one timer for all of them, and polls a watch
// list while it is not empty: the inbox middleware's keeper of leases
// (heartbeats, resends, the router's verdicts) starts nothing per message.
//
// The owner changes items under the Sched's lock (Lock, then the *Locked
// methods), so that its own state of an item changes together with its
// schedule; the Sched calls the owner's functions from its goroutine, with
// the lock released.
package sched

import (
	"container/heap"
	"sync"
	"time"
)

// Entry is what a Sched keeps of an item: embed it in the item's type.
type Entry struct {
	due  time.Time
	idx  int // index in the heap + 1; 0 when not in it
	widx int // index in the watch list + 1; 0 when not watched
}

// Sched keeps items of type T (pointers that embed an Entry).
type Sched[T Item] struct {
	mu    sync.Mutex
	items items[T]
	watch []T
	at    time.Time // when the loop wakes next; zero when nothing is due
	done  bool
	kick  chan struct{}
	stop  chan struct{}

	poll  time.Duration
	due   func(now time.Time, items []T) // the items due, unscheduled
	polls func(items []T)                // the items watched
}

// Item is an item of a Sched: a pointer to a type that embeds an Entry.
type Item interface{ entry() *Entry }

func (e *Entry) entry() *Entry { return e }

// New starts a Sched that calls due with the items whose time has come,
// unscheduled, and, every poll while items are watched, polls with them
// (an item stays watched until UnscheduleLocked).
func New[T Item](poll time.Duration, due func(now time.Time, items []T), polls func(items []T)) *Sched[T] {
	s := &Sched[T]{poll: poll, due: due, polls: polls, kick: make(chan struct{}, 1), stop: make(chan struct{})}
	go s.loop()
	return s
}

// Lock and Unlock guard the Sched and the owner's state of its items.
func (s *Sched[T]) Lock()   { s.mu.Lock() }
func (s *Sched[T]) Unlock() { s.mu.Unlock() }

// AtLocked schedules t at at (again, if it was). It refuses (false) once
// the Sched is stopped. Call with the lock held.
func (s *Sched[T]) AtLocked(t T, at time.Time) bool {
	if s.done {
		return false
	}
	e := t.entry()
	e.due = at
	if e.idx > 0 {
		heap.Fix(&s.items, e.idx-1)
	} else {
		heap.Push(&s.items, t)
	}
	s.wake(at)
	return true
}

// UnscheduleLocked unschedules t and stops watching it. Call with the lock
// held.
func (s *Sched[T]) UnscheduleLocked(t T) {
	e := t.entry()
	if e.idx > 0 {
		heap.Remove(&s.items, e.idx-1)
	}
	if i := e.widx - 1; i >= 0 { // the last one takes its place
		last := len(s.watch) - 1
		s.watch[i] = s.watch[last]
		s.watch[i].entry().widx = i + 1
		var zero T
		s.watch[last] = zero
		s.watch = s.watch[:last]
		e.widx = 0
	}
}

// WatchLocked adds t to the watch list. Call with the lock held.
func (s *Sched[T]) WatchLocked(t T) {
	if t.entry().widx > 0 {
		return
	}
	s.watch = append(s.watch, t)
	t.entry().widx = len(s.watch)
	s.wake(time.Now().Add(s.poll))
}

// Stop stops the Sched and returns the items it still held, scheduled and
// watched (an item may be both), none of them scheduled or watched any
// more.
func (s *Sched[T]) Stop() (scheduled, watched []T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return nil, nil
	}
	s.done = true
	close(s.stop)
	for s.items.Len() > 0 {
		scheduled = append(scheduled, heap.Pop(&s.items).(T))
	}
	for _, w := range s.watch {
		w.entry().widx = 0
	}
	watched, s.watch = s.watch, nil
	return scheduled, watched
}

// wake makes the loop wake by t. Call with the lock held.
func (s *Sched[T]) wake(t time.Time) {
	if s.at.IsZero() || t.Before(s.at) {
		s.at = t
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

func (s *Sched[T]) loop() {
	t := time.NewTimer(time.Hour)
	t.Stop()
	var due, watched []T
	for {
		now := time.Now()
		s.mu.Lock()
		for s.items.Len() > 0 && !s.items[0].entry().due.After(now) {
			due = append(due, heap.Pop(&s.items).(T))
		}
		watched = append(watched, s.watch...)
		s.mu.Unlock()
		if len(due) > 0 {
			s.due(now, due)
		}
		if len(watched) > 0 {
			s.polls(watched)
		}
		clear(due)
		clear(watched)
		due, watched = due[:0], watched[:0]
		s.mu.Lock()
		var next time.Time
		if s.items.Len() > 0 {
			next = s.items[0].entry().due
		}
		if len(s.watch) > 0 && (next.IsZero() || now.Add(s.poll).Before(next)) {
			next = now.Add(s.poll)
		}
		s.at = next
		s.mu.Unlock()
		if next.IsZero() {
			t.Stop()
		} else {
			t.Reset(time.Until(next))
		}
		select {
		case <-t.C:
		case <-s.kick:
		case <-s.stop:
			t.Stop()
			return
		}
	}
}

// items is a heap of items by due (container/heap).
type items[T Item] []T

func (h items[T]) Len() int           { return len(h) }
func (h items[T]) Less(i, j int) bool { return h[i].entry().due.Before(h[j].entry().due) }
func (h items[T]) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].entry().idx, h[j].entry().idx = i+1, j+1
}
func (h *items[T]) Push(x any) {
	t := x.(T)
	*h = append(*h, t)
	t.entry().idx = len(*h)
}
func (h *items[T]) Pop() any {
	old := *h
	t := old[len(old)-1]
	var zero T
	old[len(old)-1] = zero
	t.entry().idx = 0
	*h = old[:len(old)-1]
	return t
}
