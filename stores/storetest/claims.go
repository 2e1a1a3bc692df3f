package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
)

// longLease is used where a case must not see the lease run out, however
// slow the machine. The cases that set up dozens of keys one by one before
// their concurrent calls need it long: on FerretDB under -race, with the
// two cores busy, such a setup took more than 30 s and the first keys'
// leases ran out before the calls. It stays under inboxd's default
// LeaseMax (120 s), which would clamp it.
const longLease = 90 * time.Second

func (s *suite) testNewKeyAcquires(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "new")
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, Owner: "o"}, inbox.Acquired)
	if c.LeaseID == "" {
		t.Fatal("Acquired claim has an empty LeaseID")
	}
	if c.ExpiresAt.IsZero() {
		t.Fatal("Acquired claim has a zero ExpiresAt")
	}
	if c.Lease != longLease {
		t.Fatalf("Acquired claim grants Lease %s, asked %s", c.Lease, longLease)
	}
	if c.RetryAfter != 0 || c.PayloadMismatch {
		t.Fatalf("Acquired claim has Busy-only or mismatch fields set: %+v", c)
	}
	r := mustGet(t, st, key)
	if r.State != inbox.StateInProgress || r.Attempts != 1 {
		t.Fatalf("after first TryBegin: Get = %v with %d attempts, want InProgress with 1", r.State, r.Attempts)
	}
}

func (s *suite) testGeneratedLeaseID(t *testing.T) {
	st := s.store(t)
	a := mustBegin(t, st, newKey(t, "gen-a"), inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	b := mustBegin(t, st, newKey(t, "gen-b"), inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	if a.LeaseID == "" || b.LeaseID == "" || a.LeaseID == b.LeaseID {
		t.Fatalf("generated lease ids %q and %q: want two distinct non-empty ids", a.LeaseID, b.LeaseID)
	}
	if err := inbox.ValidateLeaseID(a.LeaseID); err != nil {
		t.Fatalf("generated lease id is not valid input for Complete: %v", err)
	}
}

// racers is how many calls the concurrency cases release at once: enough
// that on a store batching its round trips they travel together.
const racers = 64

// raced is one racer's call and its answer.
type raced struct {
	opts  inbox.BeginOptions
	claim inbox.Claim
}

// raceBegin runs n concurrent TryBegin calls on key, each with a lease id of
// its own, released together, and returns their claims.
func raceBegin(t *testing.T, st inbox.LeaseStore, key string, n int) []raced {
	t.Helper()
	ctx := ctxT(t)
	rs := make([]raced, n)
	errs := make([]error, n)
	fns := make([]func(), n)
	for i := range n {
		rs[i].opts = inbox.BeginOptions{Lease: longLease, LeaseID: inbox.NewLeaseID(), Owner: fmt.Sprintf("racer-%d", i)}
		fns[i] = func() { rs[i].claim, errs[i] = st.TryBegin(ctx, key, rs[i].opts) }
	}
	together(fns...)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("racer %d: TryBegin: %v", i, err)
		}
	}
	return rs
}

// checkOneWinner asserts exactly one Acquired, under the lease id its caller
// chose, and that every other claim is Busy with the winner's deadline and
// no lease id.
func (s *suite) checkOneWinner(t *testing.T, rs []raced) raced {
	t.Helper()
	var winners []raced
	for _, r := range rs {
		if r.claim.Status == inbox.Acquired {
			winners = append(winners, r)
		}
	}
	if len(winners) != 1 {
		t.Fatalf("%d of %d concurrent TryBegin calls got Acquired, want exactly 1", len(winners), len(rs))
	}
	w := winners[0]
	if w.claim.LeaseID != w.opts.LeaseID || w.claim.Lease != longLease || w.claim.ExpiresAt.IsZero() {
		t.Fatalf("the winner asked for lease %q of %s and got %+v", w.opts.LeaseID, longLease, w.claim)
	}
	for i, r := range rs {
		c := r.claim
		if c.Status == inbox.Acquired {
			continue
		}
		if c.Status != inbox.Busy {
			t.Fatalf("racer %d: %v, want Busy", i, c.Status)
		}
		if c.LeaseID != "" {
			t.Fatalf("racer %d: Busy claim carries lease id %q", i, c.LeaseID)
		}
		if c.BackingOff {
			t.Fatalf("racer %d: Busy on the winner's live lease says BackingOff", i)
		}
		if !within(c.ExpiresAt, w.claim.ExpiresAt, s.h.TimePrecision) {
			t.Fatalf("racer %d: Busy ExpiresAt %s, want the winner's %s", i, c.ExpiresAt, w.claim.ExpiresAt)
		}
		// The lease was taken a moment ago: most of it is left.
		if c.RetryAfter <= longLease/2 || c.RetryAfter > longLease+s.h.TimePrecision {
			t.Fatalf("racer %d: Busy RetryAfter %s, want in (%s, %s]", i, c.RetryAfter, longLease/2, longLease)
		}
	}
	return w
}

// checkHeldBy asserts that Get shows key in progress under w's lease, after
// the given number of acquisitions.
func (s *suite) checkHeldBy(t *testing.T, st inbox.LeaseStore, key string, w raced, attempts int) {
	t.Helper()
	r := mustGet(t, st, key)
	if r.State != inbox.StateInProgress || r.Attempts != attempts || r.Owner != w.opts.Owner ||
		!within(r.LeaseUntil, w.claim.ExpiresAt, s.h.TimePrecision) {
		t.Fatalf("Get after the race = %v, %d attempts, owner %q, lease until %s; want InProgress, %d, %q, %s (the winner's)",
			r.State, r.Attempts, r.Owner, r.LeaseUntil, attempts, w.opts.Owner, w.claim.ExpiresAt)
	}
}

func (s *suite) skipIfNotAtomic(t *testing.T) {
	t.Helper()
	if s.h.NotAtomic != "" {
		t.Skip("concurrency case skipped: " + s.h.NotAtomic)
	}
}

func (s *suite) testConcurrentExactlyOne(t *testing.T) {
	s.skipIfNotAtomic(t)
	st := s.store(t)
	for round := range 3 {
		key := newKey(t, fmt.Sprintf("race-%d", round))
		w := s.checkOneWinner(t, raceBegin(t, st, key, racers))
		s.checkHeldBy(t, st, key, w, 1) // only the winner acquired
	}
}

func (s *suite) testConcurrentOnExpired(t *testing.T) {
	s.skipIfNotAtomic(t)
	st := s.store(t)
	key := newKey(t, "race-expired")
	old := mustBegin(t, st, key, inbox.BeginOptions{Lease: s.h.Lease}, inbox.Acquired)
	pollUntil(t, expireDeadline(s.h.Lease), "lease to expire", func() bool {
		return mustGet(t, st, key).State == inbox.StateAvailable
	})
	w := s.checkOneWinner(t, raceBegin(t, st, key, racers))
	if !w.claim.ExpiresAt.After(old.ExpiresAt) {
		t.Fatalf("the winner's deadline %s is not after the expired lease's %s", w.claim.ExpiresAt, old.ExpiresAt)
	}
	s.checkHeldBy(t, st, key, w, 2)
	wantErr(t, "Complete by the expired holder after the race", st.Complete(ctxT(t), key, old.LeaseID), inbox.ErrLeaseLost)
}

func (s *suite) testConcurrentAfterRelease(t *testing.T) {
	s.skipIfNotAtomic(t)
	st := s.store(t)
	key := newKey(t, "race-released")
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	if err := st.Release(ctxT(t), key, c.LeaseID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	w := s.checkOneWinner(t, raceBegin(t, st, key, racers))
	s.checkHeldBy(t, st, key, w, 2)
}

func (s *suite) testBusyFields(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "busy")
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	b := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Busy)
	if !within(b.ExpiresAt, c.ExpiresAt, s.h.TimePrecision) {
		t.Fatalf("Busy ExpiresAt %s, want the holder's %s", b.ExpiresAt, c.ExpiresAt)
	}
	if b.RetryAfter <= longLease/2 || b.RetryAfter > longLease+s.h.TimePrecision {
		t.Fatalf("Busy RetryAfter %s right after a %s lease began, want in (%s, %s]", b.RetryAfter, longLease, longLease/2, longLease)
	}
	if b.LeaseID != "" {
		t.Fatalf("Busy claim leaks the holder's lease id %q", b.LeaseID)
	}
	if b.BackingOff {
		t.Fatal("Busy on a live lease says BackingOff, want false (no failed attempt is waiting)")
	}
	if c.BackingOff {
		t.Fatal("Acquired claim says BackingOff")
	}
	if r := mustGet(t, st, key); r.Attempts != 1 {
		t.Fatalf("a Busy TryBegin changed Attempts to %d, want 1", r.Attempts)
	}
}

func (s *suite) testSameLeaseIDIdempotent(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "same-lease")
	id := inbox.NewLeaseID()
	c1 := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, LeaseID: id}, inbox.Acquired)
	if c1.LeaseID != id {
		t.Fatalf("TryBegin with LeaseID %q granted lease %q", id, c1.LeaseID)
	}
	c2 := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, LeaseID: id}, inbox.Acquired)
	if c2.LeaseID != id {
		t.Fatalf("retried TryBegin granted lease %q, want %q", c2.LeaseID, id)
	}
	if r := mustGet(t, st, key); r.Attempts != 1 {
		t.Fatalf("retried TryBegin with the same lease id made Attempts %d, want 1", r.Attempts)
	}
	mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, LeaseID: inbox.NewLeaseID()}, inbox.Busy)
	if err := st.Complete(ctxT(t), key, id); err != nil {
		t.Fatalf("Complete with the retried lease: %v", err)
	}
	mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, LeaseID: id}, inbox.Processed)
}

func (s *suite) testProcessedAfterComplete(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "processed")
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	if err := st.Complete(ctxT(t), key, c.LeaseID); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	for range 5 {
		p := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Processed)
		if p.LeaseID != "" {
			t.Fatalf("Processed claim carries lease id %q", p.LeaseID)
		}
	}
	// Processed must hold for concurrent callers too.
	if s.h.NotAtomic == "" {
		for i, r := range raceBegin(t, st, key, racers) {
			if r.claim.Status != inbox.Processed || r.claim.LeaseID != "" {
				t.Fatalf("concurrent TryBegin %d after Complete = %+v, want Processed without a lease id", i, r.claim)
			}
		}
	}
	r := mustGet(t, st, key)
	if r.State != inbox.StateProcessed || r.Attempts != 1 {
		t.Fatalf("after Complete: Get = %v with %d attempts, want Processed with 1", r.State, r.Attempts)
	}
	ok, err := st.IsProcessed(ctxT(t), key)
	if err != nil || !ok {
		t.Fatalf("IsProcessed after Complete = %v, %v; want true", ok, err)
	}
}

func (s *suite) testDefaultLease(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "default-lease")
	c := mustBegin(t, st, key, inbox.BeginOptions{}, inbox.Acquired)
	if c.Lease <= 0 {
		t.Fatalf("TryBegin with Lease 0 granted %s, want the store's positive default", c.Lease)
	}
	r := mustGet(t, st, key)
	if got := c.ExpiresAt.Sub(r.LastSeen); got < c.Lease-50*time.Millisecond || got > c.Lease+50*time.Millisecond {
		t.Fatalf("ExpiresAt - LastSeen = %s, want the granted lease %s", got, c.Lease)
	}
}
