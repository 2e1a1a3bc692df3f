package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
)

// The fault cases break the link between a store and its backend
// ([Harness.Faults]) while many calls are in flight, and check that every
// call ends within the store's bound with a right answer or an outage
// error, and that the records agree with what the callers were told.

// faultStore returns a store of Harness.Faults and its link, restored when
// the test ends, or skips the case.
func (s *suite) faultStore(t *testing.T) (inbox.LeaseStore, Link) {
	t.Helper()
	if s.h.Faults == nil {
		t.Skip("fault case skipped: the harness gives no Faults, so the suite cannot break the link between the store and its backend (an in-process store has none)")
	}
	st, link := s.h.Faults(t, Config{})
	t.Cleanup(link.Restore)
	return st, link
}

// callBound is the longest a call may take while the link is broken: the
// store's own bound, plus a margin for a loaded machine.
func (s *suite) callBound() time.Duration { return s.h.CallTimeout + 5*time.Second }

// Phases of testLinkCut.
const (
	phaseBefore int32 = iota
	phaseCut
	phaseRestored
	phaseStop
)

// cutTrace is what the callers of one key were told in testLinkCut.
type cutTrace struct {
	key, lease  string
	complete    bool // the holder completes (else it releases)
	claimFailed bool // TryBegin failed: it may or may not have taken effect
	acquired    bool // TryBegin answered Acquired under lease
	probeLease  string
	probeFailed bool // the second TryBegin, under probeLease, failed
	finished    bool // the Complete or Release returned nil
	wrong       bool // a wrong answer was reported already: not checked again
}

// cutWorker is one goroutine of testLinkCut.
type cutWorker struct {
	traces         []*cutTrace
	errsInCut      atomic.Int64 // calls that failed while the link was cut
	okAfterRestore atomic.Int64 // keys claimed and finished, every call answered, after Restore
}

type cutRun struct {
	s          *suite
	t          *testing.T
	st         inbox.LeaseStore
	base       string
	phase      atomic.Int32
	okCalls    atomic.Int64
	lateProbes atomic.Int64 // failed claims that took effect after a later Release

	mu          sync.Mutex
	slowest     time.Duration
	slowestCall string
}

// call runs one store call, checks it ended within the bound and that an
// error is an outage error (no other error is right in this case), and
// returns the error.
func (r *cutRun) call(w *cutWorker, name, key string, f func() error) error {
	start := time.Now()
	err := f()
	took := time.Since(start)
	r.mu.Lock()
	if took > r.slowest {
		r.slowest, r.slowestCall = took, name
	}
	r.mu.Unlock()
	if took > r.s.callBound() {
		r.t.Errorf("%s of %q took %s, longer than the store's bound %s (Harness.CallTimeout) and a margin", name, key, took, r.s.h.CallTimeout)
	}
	if err == nil {
		r.okCalls.Add(1)
		return nil
	}
	if r.phase.Load() == phaseCut {
		w.errsInCut.Add(1)
	}
	if !errors.Is(err, inbox.ErrStoreUnavailable) {
		r.t.Errorf("%s of %q with the link cut or just restored: %v, want nil or an error wrapping inbox.ErrStoreUnavailable", name, key, err)
	}
	return err
}

// work claims new keys one after the other until the run stops: the claim
// must be Acquired, a second claim Busy, then the holder completes (and a
// third claim must be Processed) or releases. Any call may fail with an
// outage error while the link is cut.
func (r *cutRun) work(ctx context.Context, w *cutWorker, id int) {
	for i := 0; r.phase.Load() != phaseStop; i++ {
		startPhase := r.phase.Load()
		tr := &cutTrace{key: fmt.Sprintf("%sw%d-%d", r.base, id, i), lease: inbox.NewLeaseID(), complete: i%2 == 0}
		w.traces = append(w.traces, tr)
		if !r.iteration(ctx, w, tr) {
			time.Sleep(20 * time.Millisecond) // pacing of a client whose store is down, not synchronisation
			continue
		}
		if startPhase == phaseRestored {
			w.okAfterRestore.Add(1)
		}
	}
}

// iteration runs the calls of one key and reports whether all of them were
// answered.
func (r *cutRun) iteration(ctx context.Context, w *cutWorker, tr *cutTrace) bool {
	var c inbox.Claim
	err := r.call(w, "TryBegin of a new key", tr.key, func() (err error) {
		c, err = r.st.TryBegin(ctx, tr.key, inbox.BeginOptions{Lease: longLease, LeaseID: tr.lease, Owner: "holder"})
		return err
	})
	if err != nil {
		tr.claimFailed = true
		return false
	}
	if c.Status != inbox.Acquired || c.LeaseID != tr.lease {
		r.t.Errorf("TryBegin of the new key %q around a cut link = %+v, want Acquired under %q", tr.key, c, tr.lease)
		tr.wrong = true
		return false
	}
	tr.acquired = true
	tr.probeLease = inbox.NewLeaseID()
	err = r.call(w, "TryBegin of a held key", tr.key, func() (err error) {
		c, err = r.st.TryBegin(ctx, tr.key, inbox.BeginOptions{Lease: longLease, LeaseID: tr.probeLease, Owner: "other"})
		return err
	})
	tr.probeFailed = err != nil
	answered := !tr.probeFailed
	if err == nil && c.Status != inbox.Busy {
		r.t.Errorf("TryBegin of the held key %q around a cut link = %+v, want Busy", tr.key, c)
		tr.wrong = true
		return false
	}
	if !tr.complete {
		err = r.call(w, "Release", tr.key, func() error { return r.st.Release(ctx, tr.key, tr.lease) })
		tr.finished = err == nil
		return answered && tr.finished
	}
	err = r.call(w, "Complete", tr.key, func() error { return r.st.Complete(ctx, tr.key, tr.lease) })
	if err != nil {
		return false
	}
	tr.finished = true
	err = r.call(w, "TryBegin of a completed key", tr.key, func() (err error) {
		c, err = r.st.TryBegin(ctx, tr.key, inbox.BeginOptions{Lease: longLease, LeaseID: inbox.NewLeaseID()})
		return err
	})
	if err == nil && c.Status != inbox.Processed {
		r.t.Errorf("TryBegin of the completed key %q around a cut link = %+v, want Processed", tr.key, c)
		tr.wrong = true
		return false
	}
	return answered && err == nil
}

// verify checks, with the link restored, that the record of tr's key agrees
// with what its callers were told, and that a holder can still finish.
func (r *cutRun) verify(ctx context.Context, tr *cutTrace) {
	t, st := r.t, r.st
	if tr.wrong {
		return
	}
	rec, err := st.Get(ctx, tr.key)
	if err != nil {
		t.Errorf("Get(%q) after Restore: %v", tr.key, err)
		return
	}
	// A failed call may still take effect after its caller's later calls:
	// its request may have reached the server, which can run it after the
	// caller was told it failed and had sent its next call on another
	// connection (seen once on PostgreSQL: a second claim that failed
	// held the key after the holder's Release, sent after that failure,
	// had succeeded). Here that means a failed second claim may have
	// acquired the key after its holder released it: the key is then held
	// under that claim's lease, which its caller's retry reclaims.
	lateProbe := !tr.complete && tr.probeFailed && rec.State == inbox.StateInProgress && rec.Owner == "other" && rec.Attempts == 2
	if rec.Attempts > 1 && !lateProbe {
		t.Errorf("key %q was acquired %d times, but only its first claim could acquire it: %+v", tr.key, rec.Attempts, rec)
	}
	switch {
	case lateProbe:
		c, err := st.TryBegin(ctx, tr.key, inbox.BeginOptions{Lease: longLease, LeaseID: tr.probeLease, Owner: "other"})
		if err != nil || c.Status != inbox.Acquired || c.LeaseID != tr.probeLease {
			t.Errorf("key %q, held after Restore by its failed second claim (%+v): the retry with that claim's lease id = %+v, %v; want Acquired", tr.key, rec, c, err)
		}
		if err := st.Complete(ctx, tr.key, tr.lease); !errors.Is(err, inbox.ErrLeaseLost) {
			t.Errorf("key %q, taken by a late claim after its holder released it: the holder's Complete: %v, want ErrLeaseLost", tr.key, err)
		}
		r.lateProbes.Add(1)
	case tr.claimFailed:
		// The claim may have taken effect before the link broke: the key is
		// then held under the caller's lease, which a retry reclaims.
		if rec.State != inbox.StateNotFound && rec.State != inbox.StateInProgress {
			t.Errorf("key %q, whose only TryBegin failed: %v after Restore, want NotFound or InProgress", tr.key, rec.State)
			return
		}
		c, err := st.TryBegin(ctx, tr.key, inbox.BeginOptions{Lease: longLease, LeaseID: tr.lease, Owner: "holder"})
		if err != nil || c.Status != inbox.Acquired || c.LeaseID != tr.lease {
			t.Errorf("key %q, whose TryBegin failed (record %v): the retry with the same lease id = %+v, %v; want Acquired", tr.key, rec.State, c, err)
		}
	case tr.complete && tr.finished:
		if rec.State != inbox.StateProcessed {
			t.Errorf("key %q was reported completed but is %v after Restore", tr.key, rec.State)
		}
	case tr.complete:
		if rec.State != inbox.StateInProgress && rec.State != inbox.StateProcessed {
			t.Errorf("key %q, acquired and its Complete failed: %v after Restore, want InProgress or Processed", tr.key, rec.State)
			return
		}
		if err := st.Complete(ctx, tr.key, tr.lease); err != nil {
			t.Errorf("key %q, acquired and its Complete failed (record %v): Complete again after Restore: %v", tr.key, rec.State, err)
		} else if rec := mustGetE(ctx, t, st, tr.key); rec.State != inbox.StateProcessed {
			t.Errorf("key %q: %v after the holder's Complete, want Processed", tr.key, rec.State)
		}
	case tr.finished:
		if rec.State != inbox.StateAvailable {
			t.Errorf("key %q was reported released but is %v after Restore, want Available", tr.key, rec.State)
		}
	default:
		if rec.State != inbox.StateInProgress && rec.State != inbox.StateAvailable {
			t.Errorf("key %q, acquired and its Release failed: %v after Restore, want InProgress or Available (never Processed without a Complete)", tr.key, rec.State)
			return
		}
		err := st.Release(ctx, tr.key, tr.lease)
		if err != nil && (rec.State == inbox.StateInProgress || !errors.Is(err, inbox.ErrLeaseLost)) {
			t.Errorf("key %q, acquired and its Release failed (record %v): Release again after Restore: %v", tr.key, rec.State, err)
		}
	}
}

func mustGetE(ctx context.Context, t *testing.T, st inbox.LeaseStore, key string) inbox.Record {
	r, err := st.Get(ctx, key)
	if err != nil {
		t.Errorf("Get(%q): %v", key, err)
	}
	return r
}

// testLinkCut runs workers claiming, completing and releasing keys of their
// own, cuts the link while their calls are in flight, and restores it.
// Every call ends within the store's bound, with a right answer or an
// outage error; afterwards the store works again, and each record agrees
// with what its callers were told: a key reported Acquired is in progress
// or finished by its holder, a failed claim left nothing or a lease its
// caller's retry reclaims, and no key is processed without a Complete.
func (s *suite) testLinkCut(t *testing.T) {
	st, link := s.faultStore(t)
	run := &cutRun{s: s, t: t, st: st, base: newKey(t, "")}
	ws := make([]*cutWorker, s.h.FaultCallers)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	defer func() { // also when a poll below fails the test
		run.phase.Store(phaseStop)
		link.Restore()
		wg.Wait()
	}()
	for i := range ws {
		ws[i] = &cutWorker{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			run.work(ctx, ws[i], i)
		}()
	}
	pollUntil(t, 30*time.Second, "the workers' calls to succeed before the cut", func() bool {
		return run.okCalls.Load() >= int64(4*len(ws))
	})
	link.Cut()
	run.phase.Store(phaseCut)
	// Two failures each: a store whose client retries within a call may
	// bridge a short cut; the second failure comes from a call made while
	// the link was down.
	pollUntil(t, 3*s.callBound(), "calls of every worker to fail with the link cut (does Link.Cut break the link?)", func() bool {
		for _, w := range ws {
			if w.errsInCut.Load() < 2 {
				return false
			}
		}
		return true
	})
	link.Restore()
	run.phase.Store(phaseRestored)
	pollUntil(t, 30*time.Second+2*s.callBound(), "every worker to claim and finish a key after Restore", func() bool {
		for _, w := range ws {
			if w.okAfterRestore.Load() == 0 {
				return false
			}
		}
		return true
	})
	run.phase.Store(phaseStop)
	wg.Wait()

	var keys, failedClaims, unfinished, errs int64
	for _, w := range ws {
		keys += int64(len(w.traces))
		errs += w.errsInCut.Load()
		for _, tr := range w.traces {
			if tr.claimFailed {
				failedClaims++
			} else if tr.acquired && !tr.finished {
				unfinished++
			}
		}
	}
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, tr := range w.traces {
				run.verify(ctx, tr)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d workers, %d keys: %d calls failed with the link cut, %d claims failed, %d holders' Complete or Release failed, %d failed claims took effect after the holder's Release; slowest call %s (%s)",
		len(ws), keys, errs, failedClaims, unfinished, run.lateProbes.Load(), run.slowest, run.slowestCall)
}

// waitOp is one call of testCanceledWhileWaiting.
type waitOp struct {
	name    string
	key     string
	lease   string // the lease the call uses
	isClaim bool   // a TryBegin (else a Complete)
	call    func(ctx context.Context) (inbox.Claim, error)
	want    func(c inbox.Claim) error // nil for a victim: canceled
	ctx     context.Context
	cancel  context.CancelFunc

	claim inbox.Claim
	err   error
	start time.Time
	took  time.Duration
	ended time.Time
}

// testCanceledWhileWaiting slows the link so that round trips take a while,
// keeps some in flight, then makes more calls, which wait for a round trip
// (queued, on a store batching its round trips), and cancels some of them.
// The canceled calls return promptly with their context's error; the others
// get their results; a canceled claim left nothing, or a lease that its
// caller's retry reclaims; a canceled Complete can be repeated.
func (s *suite) testCanceledWhileWaiting(t *testing.T) {
	st, link := s.faultStore(t)
	slow, ok := link.(SlowLink)
	if !ok {
		t.Skip("fault case skipped: the harness's Link is not a SlowLink (no Delay), so round trips cannot be made to take long enough for calls to wait")
	}
	const (
		delay  = 300 * time.Millisecond // a round trip takes at least 2*delay
		prompt = 3 * delay / 4          // a canceled call must return within this
	)
	base := newKey(t, "")
	hold := func(key string) inbox.Claim {
		return mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, Owner: "holder"}, inbox.Acquired)
	}
	claimOp := func(name, key string, want func(c inbox.Claim) error) *waitOp {
		o := &waitOp{name: name, key: key, lease: inbox.NewLeaseID(), isClaim: true, want: want}
		o.call = func(ctx context.Context) (inbox.Claim, error) {
			return st.TryBegin(ctx, o.key, inbox.BeginOptions{Lease: longLease, LeaseID: o.lease, Owner: "caller"})
		}
		return o
	}
	status := func(want inbox.Status) func(c inbox.Claim) error {
		return func(c inbox.Claim) error {
			if c.Status != want {
				return fmt.Errorf("claim %+v, want %v", c, want)
			}
			return nil
		}
	}
	completeOp := func(name, key, lease string, want func(inbox.Claim) error) *waitOp {
		return &waitOp{name: name, key: key, lease: lease, want: want, call: func(ctx context.Context) (inbox.Claim, error) {
			return inbox.Claim{}, st.Complete(ctx, key, lease)
		}}
	}
	none := func(inbox.Claim) error { return nil }

	// Set up at full speed: held and processed keys.
	var blockers, others, victims []*waitOp
	for i := range 8 {
		blockers = append(blockers, claimOp("TryBegin of a new key", fmt.Sprintf("%sblocker-%d", base, i), status(inbox.Acquired)))
		others = append(others, claimOp("TryBegin of a new key", fmt.Sprintf("%snew-%d", base, i), status(inbox.Acquired)))
		victims = append(victims, claimOp("canceled TryBegin of a new key", fmt.Sprintf("%svictim-%d", base, i), nil))
	}
	for i := range 4 {
		key := fmt.Sprintf("%sheld-%d", base, i)
		hold(key)
		others = append(others, claimOp("TryBegin of a held key", key, status(inbox.Busy)))
		key = fmt.Sprintf("%sprocessed-%d", base, i)
		if err := st.Complete(ctxT(t), key, hold(key).LeaseID); err != nil {
			t.Fatalf("setup: Complete(%q): %v", key, err)
		}
		others = append(others, claimOp("TryBegin of a processed key", key, status(inbox.Processed)))
	}
	for i := range 2 {
		key := fmt.Sprintf("%scomplete-%d", base, i)
		others = append(others, completeOp("Complete by the holder", key, hold(key).LeaseID, none))
		key = fmt.Sprintf("%scanceled-complete-%d", base, i)
		victims = append(victims, completeOp("canceled Complete by the holder", key, hold(key).LeaseID, nil))
	}

	ctx := ctxT(t)
	var wg sync.WaitGroup
	launch := func(ops []*waitOp) {
		for _, o := range ops {
			if o.ctx == nil {
				o.ctx = ctx
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				o.start = time.Now()
				o.claim, o.err = o.call(o.ctx)
				o.ended = time.Now()
				o.took = o.ended.Sub(o.start)
			}()
		}
	}
	for _, v := range victims {
		v.ctx, v.cancel = context.WithCancel(ctx)
	}
	slow.Delay(delay)
	launch(blockers)
	// The waits below set when the next calls are made, not when an
	// outcome is read: the blockers' round trips take 2*delay, so the
	// calls made at delay/2 wait for them, and are canceled at delay.
	<-time.After(delay / 2)
	launch(others)
	launch(victims)
	<-time.After(delay / 2)
	canceledAt := time.Now()
	for _, v := range victims {
		v.cancel()
	}
	wg.Wait()
	slow.Restore()

	var longest time.Duration
	for _, o := range append(blockers, others...) {
		longest = max(longest, o.took)
		switch {
		case o.err != nil:
			t.Errorf("%s %q, made with calls that were canceled while waiting: %v", o.name, o.key, o.err)
		case o.want(o.claim) != nil:
			t.Errorf("%s %q, made with calls that were canceled while waiting: %v", o.name, o.key, o.want(o.claim))
		case o.took > s.callBound():
			t.Errorf("%s %q took %s over a link slowed by %s, longer than the store's bound %s", o.name, o.key, o.took, delay, s.h.CallTimeout)
		}
	}
	var slowest time.Duration
	for _, v := range victims {
		if !errors.Is(v.err, context.Canceled) {
			t.Errorf("%s %q: %v (claim %+v), want an error wrapping context.Canceled", v.name, v.key, v.err, v.claim)
			continue
		}
		if late := v.ended.Sub(canceledAt); late > prompt {
			t.Errorf("%s %q returned %s after its context was canceled, want within %s (a round trip takes %s)", v.name, v.key, late, prompt, 2*delay)
		}
		slowest = max(slowest, v.ended.Sub(canceledAt))
		s.checkCanceled(t, st, v)
	}
	t.Logf("%d calls, %d canceled while waiting for round trips of at least %s: the slowest canceled call returned %s after its cancel; the longest other call took %s",
		len(blockers)+len(others)+len(victims), len(victims), 2*delay, slowest, longest)
}

// checkCanceled checks, at full speed again, the key of a call canceled
// while it waited: a claim took effect or not, and its caller's retry with
// the same lease id acquires; a Complete took effect or not, and repeating
// it succeeds.
func (s *suite) checkCanceled(t *testing.T, st inbox.LeaseStore, v *waitOp) {
	t.Helper()
	rec := mustGet(t, st, v.key)
	if v.isClaim {
		if (rec.State != inbox.StateNotFound && rec.State != inbox.StateInProgress) || rec.Attempts > 1 {
			t.Errorf("%s %q: record %+v afterwards, want NotFound or InProgress with 1 attempt", v.name, v.key, rec)
			return
		}
		c, err := st.TryBegin(ctxT(t), v.key, inbox.BeginOptions{Lease: longLease, LeaseID: v.lease, Owner: "caller"})
		if err != nil || c.Status != inbox.Acquired || c.LeaseID != v.lease {
			t.Errorf("%s %q (record %v afterwards): the retry with the same lease id = %+v, %v; want Acquired", v.name, v.key, rec.State, c, err)
		} else if r := mustGet(t, st, v.key); r.Attempts != 1 {
			t.Errorf("%s %q: the retry made %d attempts, want 1", v.name, v.key, r.Attempts)
		}
		return
	}
	if rec.State != inbox.StateInProgress && rec.State != inbox.StateProcessed {
		t.Errorf("%s %q: the held key is %v afterwards, want InProgress or Processed", v.name, v.key, rec.State)
		return
	}
	if err := st.Complete(ctxT(t), v.key, v.lease); err != nil {
		t.Errorf("%s %q (record %v afterwards): Complete again: %v", v.name, v.key, rec.State, err)
	} else if r := mustGet(t, st, v.key); r.State != inbox.StateProcessed {
		t.Errorf("%s %q: %v after Complete again, want Processed", v.name, v.key, r.State)
	}
}

// testUnansweredCalls makes calls over a link that answers nothing (a
// server that hangs), under contexts without a deadline: the store bounds
// each call itself, so every call fails within its bound (CallTimeout) with
// an error wrapping inbox.ErrStoreUnavailable, and the store works again
// once the link is restored.
func (s *suite) testUnansweredCalls(t *testing.T) {
	st, link := s.faultStore(t)
	slow, ok := link.(SlowLink)
	if !ok {
		t.Skip("fault case skipped: the harness's Link is not a SlowLink (no Delay), so the suite cannot make the backend stop answering")
	}
	held := newKey(t, "held")
	c := mustBegin(t, st, held, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	slow.Delay(time.Hour)
	calls := map[string]func(ctx context.Context) error{
		"TryBegin": func(ctx context.Context) error {
			_, err := st.TryBegin(ctx, newKey(t, "new"), inbox.BeginOptions{Lease: longLease})
			return err
		},
		"Complete": func(ctx context.Context) error { return st.Complete(ctx, held, c.LeaseID) },
		"Get": func(ctx context.Context) error {
			_, err := st.Get(ctx, held)
			return err
		},
	}
	start := time.Now()
	errs := make(map[string]error, len(calls))
	var mu sync.Mutex
	var fns []func()
	for name, call := range calls {
		fns = append(fns, func() {
			err := call(context.Background())
			mu.Lock()
			errs[name] = err
			mu.Unlock()
		})
	}
	together(fns...)
	if d := time.Since(start); d > s.callBound() {
		t.Errorf("the calls over a link that answers nothing returned after %v, more than the bound of %v", d, s.callBound())
	}
	for name, err := range errs {
		if !errors.Is(err, inbox.ErrStoreUnavailable) {
			t.Errorf("%s over a link that answers nothing = %v, want an error wrapping inbox.ErrStoreUnavailable", name, err)
		}
	}
	link.Restore()
	pollUntil(t, 30*time.Second+s.callBound(), "the store to answer again after Restore", func() bool {
		_, err := st.Get(ctxT(t), held)
		return err == nil
	})
}
