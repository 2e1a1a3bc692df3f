package inboxmw

import (
	"encoding/hex"
	"strings"
	"testing"
	"time"
)

// TestScheduler_list_order checks the scheduler's list stays ordered by beat
// time whatever order leases are scheduled, unscheduled and rescheduled in.
func TestScheduler_list_order(t *testing.T) {
	s := &scheduler{}
	base := monoNow()
	ls := make([]*lease, 50)
	for i := range ls {
		ls[i] = &lease{}
	}
	check := func() {
		t.Helper()
		n := 0
		var prev *lease
		for l := s.head; l != nil; l = l.nextBeat {
			if l.prevBeat != prev || (prev != nil && prev.next > l.next) {
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
		at := base.add(time.Duration(i) * time.Millisecond)
		if i%7 == 0 {
			at = base.add(-time.Duration(i) * time.Millisecond)
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
			l.next = base.add(time.Duration(100-i) * time.Millisecond)
			s.insert(l)
		}
		check()
	}
}

// newLeaseID returns appendLeaseID's digits as a string.
func newLeaseID() string { return string(appendLeaseID(nil)) }

// TestNewLeaseID_form checks the middleware's lease ids have the form of
// inbox.NewLeaseID (32 lowercase hex digits: stores may keep that form
// compactly) and do not repeat.
func TestNewLeaseID_form(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := newLeaseID()
		if len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "" {
			t.Fatalf("lease id %q is not 32 lowercase hex digits", id)
		}
		if _, err := hex.DecodeString(id); err != nil || seen[id] {
			t.Fatalf("lease id %q: repeated %v, %v", id, seen[id], err)
		}
		seen[id] = true
	}
}
