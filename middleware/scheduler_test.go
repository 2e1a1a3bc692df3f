package middleware

import (
	"testing"
	"time"
)

// TestScheduler_list_order checks the scheduler's list stays ordered by beat
// time whatever order leases are scheduled, unscheduled and rescheduled in.
func TestScheduler_list_order(t *testing.T) {
	s := &scheduler{}
	base := time.Now()
	ls := make([]*lease, 50)
	for i := range ls {
		ls[i] = &lease{}
	}
	check := func() {
		t.Helper()
		n := 0
		var prev *lease
		for l := s.head; l != nil; l = l.nextBeat {
			if l.prevBeat != prev || (prev != nil && prev.next.After(l.next)) {
				t.Fatalf("list out of order or badly linked at element %d", n)
			}
			prev = l
			n++
		}
		if s.tail != prev {
			t.Fatal("tail is not the last element")
		}
	}
	for i, l := range ls { // mostly increasing, some out of order
		at := base.Add(time.Duration(i) * time.Millisecond)
		if i%7 == 0 {
			at = base.Add(-time.Duration(i) * time.Millisecond)
		}
		s.mu.Lock()
		l.next = at
		s.insert(l)
		s.mu.Unlock()
		check()
	}
	for i, l := range ls {
		switch i % 3 {
		case 0:
			s.unlink(l)
		case 1:
			s.unlink(l)
			l.next = base.Add(time.Duration(100-i) * time.Millisecond)
			s.insert(l)
		}
		check()
	}
}
