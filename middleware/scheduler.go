package middleware

import (
	"container/heap"
	"sync"
	"time"
)

// scheduler runs the heartbeats of every lease of an Inbox from one goroutine
// and one timer: leases wait in a heap ordered by their next beat, and a due
// lease's beat runs on a goroutine of its own (a beat makes a store call, and
// one slow store call must not hold back the others). Short handlers never
// reach their first beat, so they cost a heap push and remove, not a timer.
type scheduler struct {
	mu    sync.Mutex
	h     leaseHeap
	armed time.Time // when the loop's timer fires; zero when it waits for a kick
	kick  chan struct{}
	stop  chan struct{}
	done  chan struct{}
}

func newScheduler() *scheduler {
	s := &scheduler{kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go s.loop()
	return s
}

// schedule (re)queues l to beat at at.
func (s *scheduler) schedule(l *lease, at time.Time) {
	s.mu.Lock()
	l.next = at
	if l.heapIdx >= 0 {
		heap.Fix(&s.h, l.heapIdx)
	} else {
		heap.Push(&s.h, l)
	}
	// Wake the loop only when this beat is due before its timer: in steady
	// state leases come and go well before their first beat, and the loop
	// sleeps through them.
	wake := s.armed.IsZero() || at.Before(s.armed)
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
	if l.heapIdx >= 0 {
		heap.Remove(&s.h, l.heapIdx)
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
		now := time.Now()
		for len(s.h) > 0 && !s.h[0].next.After(now) {
			l := heap.Pop(&s.h).(*lease)
			go l.beat()
		}
		var timerC <-chan time.Time
		if len(s.h) > 0 {
			s.armed = s.h[0].next
			t.Reset(s.armed.Sub(now))
			timerC = t.C
		} else {
			s.armed = time.Time{}
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

// leaseHeap is a min-heap of leases by next beat.
type leaseHeap []*lease

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].next.Before(h[j].next) }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx = i
	h[j].heapIdx = j
}
func (h *leaseHeap) Push(x any) {
	l := x.(*lease)
	l.heapIdx = len(*h)
	*h = append(*h, l)
}
func (h *leaseHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	l.heapIdx = -1
	*h = old[:len(old)-1]
	return l
}
