package inboxmw

import (
	"errors"
	"fmt"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/sched"
	"github.com/watermill-inbox/inbox/stores/driver"
)

// keeper keeps the live leases of an Inbox with one goroutine and one timer
// for all of them (internal/sched). It renews each lease every heartbeat
// interval while its handler runs (the Extends that fall due together go
// out together, through the store's batching), cancels the handler's
// context when the lease is lost, settles the lease of a handler that
// succeeded on the router's verdict (it looks at msg.Acked and msg.Nacked
// every millisecond while such leases wait), and sends again the marks and
// releases that failed. A handler that returns within its heartbeat
// interval costs it a heap push and a removal, and a place on the watch
// list until the verdict. The fields of msgCall marked "the keeper's"
// change under the Sched's lock.
type keeper struct {
	ib *Inbox
	s  *sched.Sched[*msgCall]
}

func newKeeper(ib *Inbox) *keeper {
	k := &keeper{ib: ib}
	k.s = sched.New(time.Millisecond, k.due, k.verdicts)
	return k
}

// hold starts the heartbeat of m, whose handler starts.
func (k *keeper) hold(m *msgCall) {
	k.s.Lock()
	k.s.AtLocked(m, time.Now().Add(m.interval))
	k.s.Unlock()
}

// await keeps m, whose handler succeeded, until the router's verdict
// (verdicts). The heartbeat goes on meanwhile.
func (k *keeper) await(m *msgCall) {
	k.s.Lock()
	k.s.WatchLocked(m)
	k.s.Unlock()
}

// drop stops keeping m, whose handler is over, and reports whether its
// lease was lost. The answer of an Extend in flight is ignored from now on.
func (k *keeper) drop(m *msgCall) (lost bool) {
	k.s.Lock()
	defer k.s.Unlock()
	k.s.UnscheduleLocked(m)
	m.settling = true
	return m.lost
}

// later has the keeper send m's settlement again at t. It refuses (false)
// once the Inbox was closed or abandoned.
func (k *keeper) later(m *msgCall, t time.Time) bool {
	k.s.Lock()
	defer k.s.Unlock()
	return k.s.AtLocked(m, t)
}

// close stops the keeper once Close has drained every pending mark, or,
// with abandon, when Close stops waiting: it then gives back the leases
// still waiting for a verdict or for their settlement to be sent again.
func (k *keeper) close(abandon bool) {
	if k == nil {
		return
	}
	scheduled, watched := k.s.Stop()
	if !abandon {
		return
	}
	const why = "middleware closed before the mark"
	for _, m := range scheduled { // first: settleLease below makes the watched settling
		switch {
		case !m.settling: // a heartbeat
		case m.id == "":
			m.ib.pending.Done()
		default:
			m.op, m.why, m.giveUp = driver.Release, why, time.Now()
			m.send()
		}
	}
	for _, m := range watched {
		m.settleLease(driver.Release, why)
	}
}

// verdicts settles the leases whose handler succeeded once the router
// acked (the mark) or nacked (a release) their message.
func (k *keeper) verdicts(ms []*msgCall) {
	for _, m := range ms {
		select {
		case <-m.msg.Acked():
			m.settleLease(driver.Complete, "")
		case <-m.msg.Nacked():
			m.settleLease(driver.Release, "message nacked")
		default:
		}
	}
}

// due acts on the leases whose time has come: a settlement is sent again;
// a heartbeat sends an Extend without waiting (its answer goes to
// extended). A lease past its deadline is lost, one whose Extend is still
// in flight at its deadline too.
func (k *keeper) due(now time.Time, ms []*msgCall) {
	for _, m := range ms {
		k.s.Lock()
		switch {
		case m.settling: // a settlement to send again
			k.s.Unlock()
			m.send()
			continue
		case m.lost:
			k.s.Unlock()
			continue
		case !now.Before(m.deadline):
			m.lost = true
			k.s.Unlock()
			m.lose(fmt.Errorf("%w: lease of key %q was not renewed before its deadline", inbox.ErrLeaseLost, m.key))
			continue
		}
		// Due again at the deadline: lost then, unless the Extend answered
		// (or, without Extend, to cancel the handler).
		k.s.AtLocked(m, m.deadline)
		renew := !m.renewing && !k.ib.extendOff.Load()
		m.renewing = m.renewing || renew
		k.s.Unlock()
		if renew {
			sent := time.Now()
			k.ib.async.Go(m.base, driver.Op{Kind: driver.Extend, Key: m.key, LeaseID: m.id, Lease: m.length},
				func(_ inbox.Claim, err error) { k.extended(m, sent, err) })
		}
	}
}

// extended gets the answer of m's Extend sent at sent.
func (k *keeper) extended(m *msgCall, sent time.Time, err error) {
	ib := k.ib
	m.called(m.base, OpExtend, sent, err)
	k.s.Lock()
	m.renewing = false
	if m.settling || m.lost {
		k.s.Unlock()
		return // the handler is done, or the deadline passed first
	}
	next := time.Now()
	switch {
	case err == nil:
		m.deadline, next = sent.Add(m.length), next.Add(m.interval)
	case errors.Is(err, inbox.ErrLeaseLost):
		m.lost = true
		k.s.Unlock()
		m.lose(fmt.Errorf("heartbeat of key %q: %w", m.key, err))
		return
	case errors.Is(err, inbox.ErrNotSupported):
		next = m.deadline
	default:
		next = earlier(next.Add(max(m.interval/4, 10*time.Millisecond)), m.deadline)
	}
	k.s.AtLocked(m, next)
	k.s.Unlock()
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
// It counts and logs first, so that whoever sees the context end (the
// handler, a test) also sees the lease_lost outcome.
func (m *msgCall) lose(cause error) {
	m.ib.m.Outcome(m.handler, OutcomeLeaseLost)
	m.ib.log.Error("Inbox lease lost; handler context canceled", cause, m.fields())
	m.cancel(cause)
}
