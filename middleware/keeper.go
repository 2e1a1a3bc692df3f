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
// context when the lease is lost, ends the lease of a handler that
// succeeded on the router's verdict (it looks at msg.Acked and msg.Nacked
// every millisecond while such leases wait), and sends again the marks and
// releases that failed. A handler that returns within its heartbeat
// interval costs it a heap push and a removal, and a place on the watch
// list until the verdict. The fields of lease marked "the keeper's" change
// under the Sched's lock.
type keeper struct {
	ib *Inbox
	s  *sched.Sched[*lease]
}

func newKeeper(ib *Inbox) *keeper {
	k := &keeper{ib: ib}
	k.s = sched.New(time.Millisecond, k.onDue, k.pollVerdicts)
	return k
}

// hold starts the heartbeat of l, whose handler starts.
func (k *keeper) hold(l *lease) {
	k.s.Lock()
	k.s.AtLocked(l, time.Now().Add(l.interval))
	k.s.Unlock()
}

// awaitVerdict keeps l, whose handler succeeded, until the router's
// verdict (pollVerdicts). The heartbeat goes on meanwhile.
func (k *keeper) awaitVerdict(l *lease) {
	k.s.Lock()
	k.s.WatchLocked(l)
	k.s.Unlock()
}

// drop stops keeping l, whose handler is over, and hands back what the
// keeper knew of it: whether the lease was lost, and its deadline. The
// answer of an Extend in flight is ignored from now on.
func (k *keeper) drop(l *lease) (lost bool, deadline time.Time) {
	k.s.Lock()
	defer k.s.Unlock()
	k.s.UnscheduleLocked(l)
	l.settling = true
	return l.lost, l.deadline
}

// resendAt has the keeper send l's ending again at t. It refuses (false)
// once the Inbox was closed or abandoned.
func (k *keeper) resendAt(l *lease, t time.Time) bool {
	k.s.Lock()
	defer k.s.Unlock()
	return k.s.AtLocked(l, t)
}

// close stops the keeper once Close has drained every pending mark, or,
// with abandon, when Close stops waiting: it then gives back the leases
// still waiting for a verdict or for their ending to be sent again.
func (k *keeper) close(abandon bool) {
	if k == nil {
		return
	}
	scheduled, watched := k.s.Stop()
	if !abandon {
		return
	}
	const why = "middleware closed before the mark"
	for _, l := range scheduled { // first: endLease below makes the watched settling
		if l.settling { // else a heartbeat
			l.end.op, l.end.why, l.end.giveUp = driver.Release, why, time.Now()
			l.sendEnd()
		}
	}
	for _, l := range watched {
		l.endLease(driver.Release, why)
	}
}

// pollVerdicts ends the leases whose handler succeeded once the router
// acked (the mark) or nacked (a release) their message.
func (k *keeper) pollVerdicts(ls []*lease) {
	for _, l := range ls {
		select {
		case <-l.msg.Acked():
			l.endLease(driver.Complete, "")
		case <-l.msg.Nacked():
			l.endLease(driver.Release, "message nacked")
		default:
		}
	}
}

// onDue acts on the leases whose time has come: an ending is sent again;
// a heartbeat sends an Extend without waiting (its answer goes to
// extendAnswered). A lease past its deadline is lost, one whose Extend is
// still in flight at its deadline too.
func (k *keeper) onDue(now time.Time, ls []*lease) {
	for _, l := range ls {
		k.s.Lock()
		switch {
		case l.settling: // an ending to send again
			k.s.Unlock()
			l.sendEnd()
			continue
		case l.lost:
			k.s.Unlock()
			continue
		case !now.Before(l.deadline):
			l.lost = true
			k.s.Unlock()
			l.lose(fmt.Errorf("%w: lease of key %q was not renewed before its deadline", inbox.ErrLeaseLost, l.key))
			continue
		}
		// Due again at the deadline: lost then, unless the Extend answered
		// (or, without Extend, to cancel the handler).
		k.s.AtLocked(l, l.deadline)
		renew := !l.renewing && !k.ib.extendOff.Load()
		l.renewing = l.renewing || renew
		k.s.Unlock()
		if renew {
			sent := time.Now()
			k.ib.async.Go(l.base, driver.Op{Kind: driver.Extend, Key: l.key, LeaseID: l.id, Lease: l.length},
				func(_ inbox.Claim, err error) { k.extendAnswered(l, sent, err) })
		}
	}
}

// extendAnswered gets the answer of l's Extend sent at sent.
func (k *keeper) extendAnswered(l *lease, sent time.Time, err error) {
	ib := k.ib
	ib.reportCall(l.base, OpExtend, l.key, l.attempts, sent, err)
	k.s.Lock()
	l.renewing = false
	if l.settling || l.lost {
		k.s.Unlock()
		return // the handler is done, or the deadline passed first
	}
	next := time.Now()
	switch {
	case err == nil:
		l.deadline, next = sent.Add(l.length), next.Add(l.interval)
	case errors.Is(err, inbox.ErrLeaseLost):
		l.lost = true
		k.s.Unlock()
		l.lose(fmt.Errorf("heartbeat of key %q: %w", l.key, err))
		return
	case errors.Is(err, inbox.ErrNotSupported):
		next = l.deadline
	default:
		next = earlier(next.Add(max(l.interval/4, 10*time.Millisecond)), l.deadline)
	}
	k.s.AtLocked(l, next)
	k.s.Unlock()
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
