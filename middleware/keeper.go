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

// keeper keeps the live leases of an Inbox with one goroutine and one timer
// for all of them. It renews each lease every heartbeat interval while its
// handler runs (the Extends that fall due together go out together, through
// the store's batching), cancels the handler's context when the lease is
// lost, settles the lease of a handler that returned messages on the
// router's verdict (looking at msg.Acked and msg.Nacked every verdictPoll
// while such leases wait), and sends again the marks and releases that
// failed. A handler that returns within its heartbeat interval costs it a
// heap push and a removal.
type keeper struct {
	ib   *Inbox
	mu   sync.Mutex
	due  callHeap   // by due: heartbeats, and settlements to send again
	wait []*msgCall // handlers that returned messages, until the verdict
	at   time.Time  // when the loop wakes next; zero when nothing is due
	done bool       // closed or abandoned: nothing more is kept
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

// hold starts the heartbeat of m, whose handler starts.
func (k *keeper) hold(m *msgCall) {
	k.mu.Lock()
	m.due = time.Now().Add(m.interval)
	heap.Push(&k.due, m)
	k.wake(m.due)
	k.mu.Unlock()
}

// await keeps m, whose handler returned messages, until the router's
// verdict: then it settles the lease (a Complete on ack, a Release on
// nack). The heartbeat goes on meanwhile.
func (k *keeper) await(m *msgCall) {
	k.mu.Lock()
	m.verdict = true
	k.wait = append(k.wait, m)
	k.wake(time.Now().Add(verdictPoll))
	k.mu.Unlock()
}

// drop stops keeping m, whose handler is over, and reports whether its
// lease was lost. The answer of an Extend in flight is ignored from now on.
func (k *keeper) drop(m *msgCall) (lost bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if m.idx >= 0 {
		heap.Remove(&k.due, m.idx)
	}
	if m.verdict {
		m.verdict = false
		if i := index(k.wait, m); i >= 0 {
			k.wait = append(k.wait[:i], k.wait[i+1:]...)
		}
	}
	m.settling = true
	return m.lost
}

// later has the keeper send m's settlement again at t. It refuses (false)
// once the Inbox was closed or abandoned.
func (k *keeper) later(m *msgCall, t time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.done {
		return false
	}
	m.due = t
	heap.Push(&k.due, m)
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

// close stops the keeper, once Close has drained every pending mark.
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
	waiting, retries := k.wait, []*msgCall(nil)
	k.wait = nil
	for k.due.Len() > 0 {
		if m := heap.Pop(&k.due).(*msgCall); m.settling {
			retries = append(retries, m)
		}
	}
	k.mu.Unlock()
	k.close()
	for _, m := range waiting {
		m.settleLease(driver.Release, "middleware closed before the mark")
	}
	for _, m := range retries {
		if m.id == "" {
			m.ib.pending.Done()
			continue
		}
		m.op, m.why, m.giveUp = driver.Release, "middleware closed before the mark", time.Now()
		m.send()
	}
}

// loop is the keeper's goroutine.
func (k *keeper) loop() {
	t := time.NewTimer(time.Hour)
	t.Stop()
	var acks, nacks, beats, resends []*msgCall
	for {
		now := time.Now()
		k.mu.Lock()
		kept := k.wait[:0]
		for _, m := range k.wait {
			select {
			case <-m.msg.Acked():
				acks = append(acks, m)
			case <-m.msg.Nacked():
				nacks = append(nacks, m)
			default:
				kept = append(kept, m)
			}
		}
		clear(k.wait[len(kept):])
		k.wait = kept
		for k.due.Len() > 0 && !k.due[0].due.After(now) {
			if m := heap.Pop(&k.due).(*msgCall); m.settling {
				resends = append(resends, m)
			} else {
				beats = append(beats, m)
			}
		}
		var next time.Time
		if k.due.Len() > 0 {
			next = k.due[0].due
		}
		if len(k.wait) > 0 && (next.IsZero() || now.Add(verdictPoll).Before(next)) {
			next = now.Add(verdictPoll)
		}
		k.at = next
		k.mu.Unlock()

		for _, m := range acks {
			m.settleLease(driver.Complete, "")
		}
		for _, m := range nacks {
			m.settleLease(driver.Release, "message nacked")
		}
		for _, m := range beats {
			k.beat(m, now)
		}
		for _, m := range resends {
			m.send()
		}
		for _, s := range []*[]*msgCall{&acks, &nacks, &beats, &resends} {
			clear(*s)
			*s = (*s)[:0]
		}
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

// beat renews m, whose heartbeat is due: an Extend sent without waiting,
// whose answer goes to extended. A lease past its deadline is lost, one
// whose Extend is still in flight at its deadline too.
func (k *keeper) beat(m *msgCall, now time.Time) {
	k.mu.Lock()
	switch {
	case m.settling || m.lost:
		k.mu.Unlock()
		return
	case !now.Before(m.deadline):
		m.lost = true
		k.mu.Unlock()
		m.lose(fmt.Errorf("%w: lease of key %q was not renewed before its deadline", inbox.ErrLeaseLost, m.key))
		return
	}
	// Due again at the deadline: then lost, unless the Extend answered (or,
	// without Extend, to cancel the handler).
	m.due = m.deadline
	heap.Push(&k.due, m)
	renew := !m.renewing && !k.ib.extendOff.Load()
	m.renewing = m.renewing || renew
	k.mu.Unlock()
	if renew {
		sent := time.Now()
		k.ib.async.Go(m.base, driver.Op{Kind: driver.Extend, Key: m.key, LeaseID: m.id, Lease: m.length},
			func(_ inbox.Claim, err error) { k.extended(m, sent, err) })
	}
}

// extended gets the answer of m's Extend sent at sent.
func (k *keeper) extended(m *msgCall, sent time.Time, err error) {
	ib := k.ib
	m.called(m.base, OpExtend, sent, err)
	k.mu.Lock()
	m.renewing = false
	if m.settling || m.lost {
		k.mu.Unlock()
		return // the handler is done, or the deadline passed first
	}
	if m.idx >= 0 {
		heap.Remove(&k.due, m.idx)
	}
	switch now := time.Now(); {
	case err == nil:
		m.deadline, m.due = sent.Add(m.length), now.Add(m.interval)
	case errors.Is(err, inbox.ErrLeaseLost):
		m.lost = true
		k.mu.Unlock()
		m.lose(fmt.Errorf("heartbeat of key %q: %w", m.key, err))
		return
	case errors.Is(err, inbox.ErrNotSupported):
		m.due = m.deadline
	default:
		m.due = earlier(now.Add(max(m.interval/4, 10*time.Millisecond)), m.deadline)
	}
	heap.Push(&k.due, m)
	k.wake(m.due)
	k.mu.Unlock()
	switch {
	case err == nil:
		ib.health.OK()
	case errors.Is(err, inbox.ErrNotSupported):
		if ib.extendOff.CompareAndSwap(false, true) {
			ib.log.Info("Inbox store cannot extend leases: heartbeats off; a handler still running when its lease ends is canceled", nil)
		}
	default:
		ib.m.Outcome(m.handler, OutcomeStoreError)
		ib.health.Fail("Inbox heartbeat failed; retrying until the lease deadline", err, m.fields())
	}
}

// lose cancels the handler's context: this consumer no longer holds the key.
func (m *msgCall) lose(cause error) {
	m.cancel(cause)
	m.ib.m.Outcome(m.handler, OutcomeLeaseLost)
	m.ib.log.Error("Inbox lease lost; handler context canceled", cause, m.fields())
}

func index(s []*msgCall, m *msgCall) int {
	for i, x := range s {
		if x == m {
			return i
		}
	}
	return -1
}

// callHeap orders leases by due (container/heap).
type callHeap []*msgCall

func (h callHeap) Len() int           { return len(h) }
func (h callHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h callHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *callHeap) Push(x any) {
	m := x.(*msgCall)
	m.idx = len(*h)
	*h = append(*h, m)
}
func (h *callHeap) Pop() any {
	old := *h
	m := old[len(old)-1]
	old[len(old)-1] = nil
	m.idx = -1
	*h = old[:len(old)-1]
	return m
}
