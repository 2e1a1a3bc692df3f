package inboxmw

import (
	"sync"
	"time"
)

// scheduler runs the heartbeats of every lease of an Inbox from one goroutine
// and one timer: leases wait in a list ordered by their next beat, and a due
// lease's beat runs on a goroutine of its own (a beat makes a store call, and
// one slow store call must not hold back the others). Short handlers never
// reach their first beat, so they cost a list insert and unlink, not a timer.
// Beats are nearly always due in the order they are scheduled (now plus a
// fixed interval), so inserting from the tail is O(1) in practice.
type scheduler struct {
	mu         sync.Mutex
	head, tail *lease // earliest and latest beat
	armed      mono   // when the loop's timer fires; zero when it waits for a kick
	kick       chan struct{}
	stop       chan struct{}
	done       chan struct{}
}

func newScheduler() *scheduler {
	s := &scheduler{kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go s.loop()
	return s
}

// schedule (re)queues l to beat at at.
func (s *scheduler) schedule(l *lease, at mono) {
	s.mu.Lock()
	if l.queued {
		s.unlink(l)
	}
	l.next = at
	s.insert(l)
	// Wake the loop only when this beat is due before its timer: in steady
	// state leases come and go well before their first beat, and the loop
	// sleeps through them.
	wake := s.armed == 0 || at < s.armed
	if wake {
		s.armed = at
	}
	s.mu.Unlock()
	if wake {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// unschedule removes l if it is queued.
func (s *scheduler) unschedule(l *lease) {
	s.mu.Lock()
	if l.queued {
		s.unlink(l)
	}
	s.mu.Unlock()
}

// close stops the loop; queued beats are dropped.
func (s *scheduler) close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

func (s *scheduler) loop() {
	defer close(s.done)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		s.mu.Lock()
		now := monoNow()
		for s.head != nil && s.head.next <= now {
			l := s.head
			s.unlink(l)
			go l.beat()
		}
		var timerC <-chan time.Time
		if s.head != nil {
			s.armed = s.head.next
			t.Reset(time.Duration(s.armed - now))
			timerC = t.C
		} else {
			s.armed = 0
			t.Stop()
		}
		s.mu.Unlock()
		select {
		case <-timerC:
		case <-s.kick:
		case <-s.stop:
			return
		}
	}
}

// insert puts l in time order, searching from the tail.
func (s *scheduler) insert(l *lease) {
	after := s.tail
	for after != nil && after.next > l.next {
		after = after.prevBeat
	}
	l.prevBeat = after
	if after == nil {
		l.nextBeat = s.head
		s.head = l
	} else {
		l.nextBeat = after.nextBeat
		after.nextBeat = l
	}
	if l.nextBeat == nil {
		s.tail = l
	} else {
		l.nextBeat.prevBeat = l
	}
	l.queued = true
}

func (s *scheduler) unlink(l *lease) {
	if l.prevBeat == nil {
		s.head = l.nextBeat
	} else {
		l.prevBeat.nextBeat = l.nextBeat
	}
	if l.nextBeat == nil {
		s.tail = l.prevBeat
	} else {
		l.nextBeat.prevBeat = l.prevBeat
	}
	l.prevBeat, l.nextBeat = nil, nil
	l.queued = false
}
