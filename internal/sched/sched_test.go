package sched

import (
	"slices"
	"sync"
	"testing"
	"time"
)

type item struct {
	Entry
	name string
}

type recorder struct {
	mu      sync.Mutex
	due     []string
	polled  map[string]int
	dueSeen chan struct{}
}

func (r *recorder) onDue(_ time.Time, items []*item) {
	r.mu.Lock()
	for _, it := range items {
		r.due = append(r.due, it.name)
	}
	r.mu.Unlock()
	r.dueSeen <- struct{}{}
}

func (r *recorder) onPoll(items []*item) {
	r.mu.Lock()
	for _, it := range items {
		r.polled[it.name]++
	}
	r.mu.Unlock()
}

func newRecorder() *recorder {
	return &recorder{polled: map[string]int{}, dueSeen: make(chan struct{}, 100)}
}

// Items fall due in the order of their times, each once, and an item
// scheduled again moves.
func TestSched_items_fall_due_in_order(t *testing.T) {
	t.Parallel()
	r := newRecorder()
	s := New(time.Millisecond, r.onDue, r.onPoll)
	defer s.Stop()
	now := time.Now()
	a, b, c := &item{name: "a"}, &item{name: "b"}, &item{name: "c"}
	s.Lock()
	s.AtLocked(c, now.Add(30*time.Millisecond))
	s.AtLocked(a, now.Add(10*time.Millisecond))
	s.AtLocked(b, now.Add(time.Hour))
	s.AtLocked(b, now.Add(20*time.Millisecond)) // moved
	s.Unlock()
	deadline := time.After(10 * time.Second)
	for {
		r.mu.Lock()
		n := len(r.due)
		r.mu.Unlock()
		if n == 3 {
			break
		}
		select {
		case <-r.dueSeen:
		case <-deadline:
			t.Fatalf("due so far: %v", r.due)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if got := r.due; got[0] != "a" || got[1] != "b" || got[2] != "c" {
		t.Fatalf("fell due in the order %v, want a b c", got)
	}
	if a.idx > 0 || b.idx > 0 || c.idx > 0 {
		t.Fatal("an item that fell due is still scheduled")
	}
}

// A watched item is polled until it is unscheduled; Stop returns what is
// left and refuses more.
func TestSched_watch_and_stop(t *testing.T) {
	t.Parallel()
	r := newRecorder()
	s := New(time.Millisecond, r.onDue, r.onPoll)
	w, later := &item{name: "w"}, &item{name: "later"}
	s.Lock()
	s.WatchLocked(w)
	s.AtLocked(later, time.Now().Add(time.Hour))
	s.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.mu.Lock()
		n := r.polled["w"]
		r.mu.Unlock()
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("polled %d times", n)
		}
		time.Sleep(time.Millisecond)
	}
	s.Lock()
	s.UnscheduleLocked(w)
	s.Unlock()
	scheduled, watched := s.Stop()
	if len(scheduled) != 1 || scheduled[0] != later || len(watched) != 0 || later.idx > 0 {
		t.Fatalf("Stop left %v scheduled and %v watched, want [later] and none", scheduled, watched)
	}
	s.Lock()
	refused := !s.AtLocked(w, time.Now())
	s.Unlock()
	if !refused {
		t.Fatal("AtLocked after Stop did not refuse")
	}
}

// The watch list keeps each item once, and an item unscheduled from any
// place of it leaves the others watched.
func TestSched_watch_list_removal(t *testing.T) {
	t.Parallel()
	r := newRecorder()
	s := New(time.Hour, r.onDue, r.onPoll)
	a, b, c, d := &item{name: "a"}, &item{name: "b"}, &item{name: "c"}, &item{name: "d"}
	s.Lock()
	for _, it := range []*item{a, b, c, a, d} {
		s.WatchLocked(it)
	}
	s.UnscheduleLocked(b) // from the middle
	s.UnscheduleLocked(d) // the last
	s.UnscheduleLocked(b) // again: nothing
	s.Unlock()
	_, watched := s.Stop()
	var names []string
	for _, w := range watched {
		names = append(names, w.name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"a", "c"}) {
		t.Fatalf("watched after removals: %v, want [a c]", names)
	}
	for _, it := range []*item{a, b, c, d} {
		if it.widx != 0 {
			t.Errorf("%s still marked watched after Stop", it.name)
		}
	}
}
