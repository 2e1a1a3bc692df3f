package inboxmw

import (
	"container/heap"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
)

// keeper keeps the live leases of an Inbox with one goroutine and one
// timer for all of them: it renews each lease every heartbeat interval
// while its handler runs (the Extends that fall due together go out
// together, through the store's batching), cancels the handler's context
// when the lease is lost, settles a lease whose handler returned messages
// on the router's verdict (it looks at msg.Acked and msg.Nacked every
// verdictPoll while such leases wait), and sends again the marks and
// releases that failed. A handler that returns within the heartbeat
// interval costs it nothing but a heap push and a remove.
type keeper struct {
	ib   *Inbox
	mu   sync.Mutex
	due  leaseHeap // by due: heartbeats, and settlements to send again
	wait []*lease  // handlers that returned messages: settled on the verdict
	at   time.Time // when the loop wakes next; zero when nothing is due
	done bool      // closed or abandoned: nothing more is kept
	kick chan struct{}
	stop chan struct{}
}

// verdictPoll is how often the keeper looks for the router's verdict on
// the messages whose handler returned messages.
const verdictPoll = time.Millisecond

func newKeeper(ib *Inbox) *keeper {
	k := &keeper{ib: ib, kick: make(chan struct{}, 1), stop: make(chan struct{})}
	go k.loop()
	return k
}

// hold starts the heartbeat of l, whose handler starts.
func (k *keeper) hold(l *lease) {
	k.mu.Lock()
	l.due = time.Now().Add(l.interval)
	heap.Push(&k.due, l)
	k.wake(l.due)
	k.mu.Unlock()
}

// await keeps l, whose handler returned messages, until the router's
// verdict: the keeper then settles it (a Complete on ack, a Release on
// nack). Its heartbeat goes on meanwhile.
func (k *keeper) await(l *lease) {
	k.mu.Lock()
	l.verdict = true
	k.wait = append(k.wait, l)
	k.wake(time.Now().Add(verdictPoll))
	k.mu.Unlock()
}

// drop stops keeping l, whose handler is over, and reports whether its
// lease was lost. The answer of an Extend in flight is ignored from now on.
func (k *keeper) drop(l *lease) (lost bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l.idx >= 0 {
		heap.Remove(&k.due, l.idx)
	}
	if l.verdict {
		l.verdict = false
		for i, w := range k.wait {
			if w == l {
				k.wait = append(k.wait[:i], k.wait[i+1:]...)
				break
			}
		}
	}
	l.settling = true
	return l.lost
}

// later has the keeper send l's settlement again at t. It refuses (false)
// once the Inbox was closed or abandoned.
func (k *keeper) later(l *lease, t time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.done {
		return false
	}
	l.due = t
	heap.Push(&k.due, l)
	k.wake(t)
	return true
}

// wake makes the loop wake by t. Call with mu held.
func (k *keeper) wake(t time.Time) {
	if k.at.IsZero() || t.Before(k.at) {
		k.at = t
		select {
		case k.kick <- struct{}{}:
		default:
		}
	}
}

// close stops the keeper once Close has drained every pending mark.
func (k *keeper) close() {
	if k == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.done {
		k.done = true
		close(k.stop)
	}
}

// abandon gives back the leases still waiting for a verdict or for a
// settlement to be sent again, when Close stops waiting for them, and
// stops the keeper.
func (k *keeper) abandon() {
	if k == nil {
		return
	}
	k.mu.Lock()
	waiting := k.wait
	k.wait = nil
	var retries []*lease
	for _, l := range k.due {
		if l.settling {
			retries = append(retries, l)
		}
	}
	k.mu.Unlock()
	for _, l := range waiting {
		l.settle(driver.Release, "middleware closed before the mark")
	}
	k.close()
	for _, l := range retries {
		k.mu.Lock()
		if l.idx >= 0 {
			heap.Remove(&k.due, l.idx)
		}
		k.mu.Unlock()
		if l.id != "" {
			l.op, l.why, l.giveUp = driver.Release, "middleware closed before the mark", time.Now()
			l.send()
		} else {
			l.ib.pending.Done()
		}
	}
}

// loop is the keeper's goroutine.
func (k *keeper) loop() {
	t := time.NewTimer(time.Hour)
	t.Stop()
	var beats, resends []*lease
	type verdict struct {
		l   *lease
		ack bool
	}
	var verdicts []verdict
	for {
		now := time.Now()
		k.mu.Lock()
		kept := k.wait[:0]
		for _, l := range k.wait {
			select {
			case <-l.msg.Acked():
				verdicts = append(verdicts, verdict{l, true})
			case <-l.msg.Nacked():
				verdicts = append(verdicts, verdict{l, false})
			default:
				kept = append(kept, l)
			}
		}
		clear(k.wait[len(kept):])
		k.wait = kept
		for len(k.due) > 0 && !k.due[0].due.After(now) {
			l := heap.Pop(&k.due).(*lease)
			if l.settling {
				resends = append(resends, l)
			} else {
				beats = append(beats, l)
			}
		}
		var next time.Time
		if len(k.due) > 0 {
			next = k.due[0].due
		}
		if len(k.wait) > 0 && (next.IsZero() || now.Add(verdictPoll).Before(next)) {
			next = now.Add(verdictPoll)
		}
		k.at = next
		k.mu.Unlock()

		for _, v := range verdicts {
			if v.ack {
				v.l.settle(driver.Complete, "")
			} else {
				v.l.settle(driver.Release, "message nacked")
			}
		}
		for _, l := range beats {
			k.beat(l, now)
		}
		for _, l := range resends {
			l.send()
		}
		clear(verdicts)
		clear(beats)
		clear(resends)
		verdicts, beats, resends = verdicts[:0], beats[:0], resends[:0]
		if next.IsZero() {
			t.Stop()
		} else {
			t.Reset(time.Until(next))
		}
		select {
		case <-t.C:
		case <-k.kick:
		case <-k.stop:
			t.Stop()
			return
		}
	}
}

// beat renews l, whose heartbeat is due: an Extend sent without waiting,
// whose answer goes to extended. A lease past its deadline is lost; one
// whose Extend is still in flight at its deadline too.
func (k *keeper) beat(l *lease, now time.Time) {
	ib := k.ib
	k.mu.Lock()
	switch {
	case l.settling || l.lost:
		k.mu.Unlock()
		return
	case !now.Before(l.deadline):
		l.lost = true
		k.mu.Unlock()
		l.lose(fmt.Errorf("%w: lease of key %q was not renewed before its deadline", inbox.ErrLeaseLost, l.key))
		return
	case ib.extendOff.Load() || l.renewing:
		// Wake at the deadline to cancel the handler.
		l.due = l.deadline
		heap.Push(&k.due, l)
		k.mu.Unlock()
		return
	}
	l.renewing = true
	l.due = l.deadline // lost then, unless the Extend has answered
	heap.Push(&k.due, l)
	k.mu.Unlock()
	sent := time.Now()
	ib.async.Go(l.base, driver.Op{Kind: driver.Extend, Key: l.key, LeaseID: l.id, Lease: l.length}, func(_ inbox.Claim, err error) {
		k.extended(l, sent, err)
	})
}

// extended gets the answer of l's Extend sent at sent.
func (k *keeper) extended(l *lease, sent time.Time, err error) {
	ib := k.ib
	l.called(l.base, OpExtend, sent, err)
	k.mu.Lock()
	l.renewing = false
	if l.settling || l.lost {
		k.mu.Unlock()
		return // the handler is done, or the deadline passed first
	}
	if l.idx >= 0 {
		heap.Remove(&k.due, l.idx)
	}
	now := time.Now()
	switch {
	case err == nil:
		l.deadline = sent.Add(l.length)
		l.due = now.Add(l.interval)
	case errors.Is(err, inbox.ErrLeaseLost):
		l.lost = true
		k.mu.Unlock()
		l.lose(fmt.Errorf("heartbeat of key %q: %w", l.key, err))
		return
	case errors.Is(err, inbox.ErrNotSupported):
		l.due = l.deadline
	default:
		l.due = earlier(now.Add(max(l.interval/4, 10*time.Millisecond)), l.deadline)
	}
	heap.Push(&k.due, l)
	k.wake(l.due)
	k.mu.Unlock()
	switch {
	case err == nil:
		ib.health.OK()
	case errors.Is(err, inbox.ErrNotSupported):
		if ib.extendOff.CompareAndSwap(false, true) {
			ib.log.Info("Inbox store cannot extend leases: heartbeats off; a handler still running when its lease ends is canceled", nil)
		}
	default:
		ib.m.Outcome(l.handler, OutcomeStoreError)
		ib.health.Fail("Inbox heartbeat failed; retrying until the lease deadline", err, l.fields())
	}
}

// lose cancels the handler's context: this consumer no longer holds the key.
func (l *lease) lose(cause error) {
	l.cancel(cause)
	l.ib.m.Outcome(l.handler, OutcomeLeaseLost)
	l.ib.log.Error("Inbox lease lost; handler context canceled", cause, l.fields())
}

// leaseHeap orders leases by due (container/heap).
type leaseHeap []*lease

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *leaseHeap) Push(x any) {
	l := x.(*lease)
	l.idx = len(*h)
	*h = append(*h, l)
}
func (h *leaseHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	l.idx = -1
	*h = old[:len(old)-1]
	return l
}
