package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
)

// Failed attempts (LeaseStore.Fail): the attempt count every claim returns,
// the backoff a failure sets, and the Dead state.

func (s *suite) testAttemptsReturned(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "attempts")
	c1 := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	if c1.Attempts != 1 {
		t.Fatalf("first claim: Attempts %d, want 1", c1.Attempts)
	}
	if b := mustBegin(t, st, key, inbox.BeginOptions{}, inbox.Busy); b.Attempts != 1 {
		t.Fatalf("busy claim: Attempts %d, want 1", b.Attempts)
	}
	if err := st.Release(ctxT(t), key, c1.LeaseID); err != nil {
		t.Fatal(err)
	}
	c2 := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	if c2.Attempts != 2 {
		t.Fatalf("claim after a release: Attempts %d, want 2", c2.Attempts)
	}
	if again := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, LeaseID: c2.LeaseID}, inbox.Acquired); again.Attempts != 2 {
		t.Fatalf("retry by the holder: Attempts %d, want 2 (not a new acquisition)", again.Attempts)
	}
	if err := st.Complete(ctxT(t), key, c2.LeaseID); err != nil {
		t.Fatal(err)
	}
	if p := mustBegin(t, st, key, inbox.BeginOptions{}, inbox.Processed); p.Attempts != 2 {
		t.Fatalf("processed claim: Attempts %d, want 2", p.Attempts)
	}
}

// testRetryHint runs a key's life with BeginOptions.Retry set on every
// claim, a hint that may change how a store claims but none of its
// answers: a new key is acquired, the holder's retry acquired again,
// another lease busy until the holder's deadline, a key in a failed
// attempt's backoff busy and backing off; a released key is acquired with
// its attempts counted, and a completed one is processed.
func (s *suite) testRetryHint(t *testing.T) {
	st := s.store(t)
	opts := func(id string) inbox.BeginOptions {
		return inbox.BeginOptions{Lease: longLease, LeaseID: id, Owner: "retrier", Retry: true}
	}
	key := newKey(t, "retry-new")
	c := mustBegin(t, st, key, opts("lease-1"), inbox.Acquired)
	if c.LeaseID != "lease-1" || c.Attempts != 1 || c.ExpiresAt.IsZero() {
		t.Fatalf("claim of a new key with Retry = %+v; want Acquired under lease-1, 1 attempt, a deadline", c)
	}
	// The holder's retry may renew the lease: the Busy claim below reports
	// the retry's deadline.
	if c = mustBegin(t, st, key, opts("lease-1"), inbox.Acquired); c.Attempts != 1 {
		t.Fatalf("the holder's retry with Retry: Attempts %d, want 1", c.Attempts)
	}
	b := mustBegin(t, st, key, opts("lease-2"), inbox.Busy)
	if b.BackingOff || b.LeaseID != "" || !within(b.ExpiresAt, c.ExpiresAt, s.h.TimePrecision) {
		t.Fatalf("claim of a held key with Retry = %+v; want Busy until the holder's %s, not BackingOff", b, c.ExpiresAt)
	}
	if err := st.Fail(ctxT(t), key, c.LeaseID, inbox.FailOptions{RetryAfter: longLease, Reason: "boom"}); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	if b := mustBegin(t, st, key, opts("lease-3"), inbox.Busy); !b.BackingOff || b.Attempts != 1 {
		t.Fatalf("claim in a failed attempt's backoff with Retry = %+v; want Busy, BackingOff, 1 attempt", b)
	}

	key = newKey(t, "retry-released")
	c = mustBegin(t, st, key, opts("lease-4"), inbox.Acquired)
	if err := st.Release(ctxT(t), key, c.LeaseID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	c = mustBegin(t, st, key, opts("lease-5"), inbox.Acquired)
	if c.Attempts != 2 {
		t.Fatalf("claim of a released key with Retry: Attempts %d, want 2", c.Attempts)
	}
	if err := st.Complete(ctxT(t), key, c.LeaseID); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if p := mustBegin(t, st, key, opts("lease-6"), inbox.Processed); p.Attempts != 2 || p.LeaseID != "" {
		t.Fatalf("claim of a processed key with Retry = %+v; want Processed, 2 attempts, no lease id", p)
	}
}

func (s *suite) testFailBackoff(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "backoff")
	backoff := 2 * s.h.Lease
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, Owner: "first"}, inbox.Acquired)
	failed := time.Now()
	if err := st.Fail(ctxT(t), key, c.LeaseID, inbox.FailOptions{RetryAfter: backoff, Reason: "boom: it broke"}); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	// during reports whether the backoff surely still runs (measured from
	// before the Fail was sent).
	during := func() bool { return time.Since(failed) < backoff }
	r := mustGet(t, st, key)
	if r.State != inbox.StateAvailable || r.Reason != "boom: it broke" || r.Attempts != 1 || !r.LeaseUntil.IsZero() {
		t.Fatalf("after Fail: %+v; want Available, the reason, 1 attempt, no lease", r)
	}
	if r.RetryAt.IsZero() && during() {
		t.Fatalf("after Fail with a backoff of %s: no RetryAt", backoff)
	}
	// Busy with the time left until the backoff ends, BackingOff, whatever
	// lease id the claim carries (the failed lease's id is no exception:
	// its attempt is over), then acquirable once.
	var got inbox.Claim
	var gotID string
	calls := 0
	pollUntil(t, expireDeadline(backoff), "the backoff to end", func() bool {
		id := c.LeaseID
		if calls++; calls%2 == 0 {
			id = inbox.NewLeaseID()
		}
		cl, err := st.TryBegin(ctxT(t), key, inbox.BeginOptions{Lease: longLease, LeaseID: id, Owner: "second"})
		if err != nil {
			t.Fatalf("TryBegin during the backoff: %v", err)
		}
		// Read after the answer: the store took its decision before it, so
		// an acquisition answered within the backoff was surely early. (Read
		// before the call, a call that waits to be served could be decided
		// once the backoff is over.)
		early := during()
		switch cl.Status {
		case inbox.Busy:
			if cl.RetryAfter <= 0 || cl.RetryAfter > backoff+s.h.TimePrecision {
				t.Fatalf("Busy during the backoff: RetryAfter %s, want within (0, %s]", cl.RetryAfter, backoff)
			}
			if !r.RetryAt.IsZero() && !within(cl.ExpiresAt, r.RetryAt, s.h.TimePrecision) {
				t.Fatalf("Busy during the backoff: ExpiresAt %s, want the record's RetryAt %s", cl.ExpiresAt, r.RetryAt)
			}
			if !cl.BackingOff || cl.LeaseID != "" {
				t.Fatalf("Busy during the backoff, claim with lease id %q: %+v; want BackingOff and no lease id", id, cl)
			}
		case inbox.Acquired:
			if early {
				t.Fatalf("acquired %s after a Fail with a backoff of %s", time.Since(failed), backoff)
			}
			if cl.BackingOff || cl.LeaseID != id {
				t.Fatalf("acquired after the backoff: %+v; want the lease %q asked for, not BackingOff", cl, id)
			}
			gotID = id
		default:
			t.Fatalf("TryBegin during the backoff = %v, want Busy or Acquired", cl.Status)
		}
		got = cl
		return cl.Status == inbox.Acquired
	})
	if got.Attempts != 2 {
		t.Fatalf("claim after the backoff: Attempts %d, want 2", got.Attempts)
	}
	after := mustGet(t, st, key)
	if after.State != inbox.StateInProgress || !after.RetryAt.IsZero() || after.Owner != "second" {
		t.Fatalf("after the backoff: %+v; want InProgress under the second owner, no RetryAt", after)
	}
	// The key that backed off is leased now: others (the failed lease among
	// them, unless it is the one that acquired) are Busy on the live lease,
	// not BackingOff.
	others := []string{"", inbox.NewLeaseID()}
	if gotID != c.LeaseID {
		others = append(others, c.LeaseID)
	}
	for _, id := range others {
		b := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, LeaseID: id}, inbox.Busy)
		if b.BackingOff || !within(b.ExpiresAt, got.ExpiresAt, s.h.TimePrecision) {
			t.Fatalf("claim with lease id %q on the lease taken after the backoff: %+v; want Busy until %s, not BackingOff", id, b, got.ExpiresAt)
		}
	}
	if err := st.Complete(ctxT(t), key, gotID); err != nil {
		t.Fatalf("Complete after the backoff: %v", err)
	}
}

// testFailBackoffConcurrent claims a key in backoff with many calls at once
// (in one batch, on a store that batches), some under the failed lease's
// id: each is Busy and BackingOff with the backoff's deadline, and the
// record is left as it was. The claims on a live lease, in one batch, are
// the concurrency cases' (never BackingOff).
func (s *suite) testFailBackoffConcurrent(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "backoff-race")
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, Owner: "first"}, inbox.Acquired)
	if err := st.Fail(ctxT(t), key, c.LeaseID, inbox.FailOptions{RetryAfter: longLease, Reason: "later"}); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	before := mustGet(t, st, key)
	if before.State != inbox.StateAvailable || before.RetryAt.IsZero() {
		t.Fatalf("after Fail with a backoff of %s: %+v; want Available with a RetryAt", longLease, before)
	}
	ctx := ctxT(t)
	claims := make([]inbox.Claim, racers)
	errs := make([]error, racers)
	ids := make([]string, racers)
	fns := make([]func(), racers)
	for i := range fns {
		ids[i] = inbox.NewLeaseID()
		if i%4 == 0 {
			ids[i] = c.LeaseID
		}
		fns[i] = func() {
			claims[i], errs[i] = st.TryBegin(ctx, key, inbox.BeginOptions{Lease: longLease, LeaseID: ids[i], Owner: fmt.Sprint("racer-", i)})
		}
	}
	together(fns...)
	for i, cl := range claims {
		if errs[i] != nil {
			t.Fatalf("racer %d: TryBegin: %v", i, errs[i])
		}
		if cl.Status != inbox.Busy || !cl.BackingOff || cl.LeaseID != "" || cl.Attempts != 1 {
			t.Fatalf("racer %d (lease id %q, the failed one: %v): %+v; want Busy, BackingOff, no lease id, 1 attempt",
				i, ids[i], ids[i] == c.LeaseID, cl)
		}
		if cl.RetryAfter <= longLease/2 || cl.RetryAfter > longLease+s.h.TimePrecision {
			t.Fatalf("racer %d: RetryAfter %s a moment after a backoff of %s began, want in (%s, %s]", i, cl.RetryAfter, longLease, longLease/2, longLease)
		}
		if !within(cl.ExpiresAt, before.RetryAt, s.h.TimePrecision) {
			t.Fatalf("racer %d: ExpiresAt %s, want the record's RetryAt %s", i, cl.ExpiresAt, before.RetryAt)
		}
	}
	if after := mustGet(t, st, key); !s.sameRecord(after, before) {
		t.Fatalf("claims during the backoff changed the record: %+v, was %+v", after, before)
	}
}

func (s *suite) testFailNoBackoff(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "fail-now")
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	if err := st.Fail(ctxT(t), key, c.LeaseID, inbox.FailOptions{Reason: "transient"}); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	if r := mustGet(t, st, key); r.State != inbox.StateAvailable || !r.RetryAt.IsZero() || r.Reason != "transient" {
		t.Fatalf("after Fail without backoff: %+v; want Available, no RetryAt, the reason", r)
	}
	c2 := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	if c2.Attempts != 2 {
		t.Fatalf("Attempts %d, want 2", c2.Attempts)
	}
	// The failed lease is fenced: Fail, Complete, Release and Extend with it
	// are lease lost, and change nothing.
	wantErr(t, "Fail with a failed lease", st.Fail(ctxT(t), key, c.LeaseID, inbox.FailOptions{}), inbox.ErrLeaseLost)
	wantErr(t, "Complete with a failed lease", st.Complete(ctxT(t), key, c.LeaseID), inbox.ErrLeaseLost)
	if r := mustGet(t, st, key); r.State != inbox.StateInProgress || r.Attempts != 2 {
		t.Fatalf("fenced calls changed the record: %+v", r)
	}
	if err := st.Complete(ctxT(t), key, c2.LeaseID); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "Fail after Complete", st.Fail(ctxT(t), key, c2.LeaseID, inbox.FailOptions{Dead: true}), inbox.ErrLeaseLost)
	mustBegin(t, st, key, inbox.BeginOptions{}, inbox.Processed)
}

func (s *suite) testFailDead(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "dead")
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	reason := "handler: order 42 refused: invalid currency \"XYZ\" ✗"
	if err := st.Fail(ctxT(t), key, c.LeaseID, inbox.FailOptions{Dead: true, RetryAfter: time.Hour, Reason: reason}); err != nil {
		t.Fatalf("Fail with Dead: %v", err)
	}
	for _, id := range []string{"", c.LeaseID} {
		d := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, LeaseID: id}, inbox.Dead)
		if d.Reason != reason || d.Attempts != 1 || d.LeaseID != "" {
			t.Fatalf("dead claim %+v; want the reason %q, 1 attempt, no lease", d, reason)
		}
	}
	r := mustGet(t, st, key)
	if r.State != inbox.StateDead || r.Reason != reason || r.Attempts != 1 || !r.LeaseUntil.IsZero() || !r.RetryAt.IsZero() {
		t.Fatalf("dead record %+v", r)
	}
	if ok, err := st.IsProcessed(ctxT(t), key); err != nil || ok {
		t.Fatalf("IsProcessed of a dead key = %v, %v; want false", ok, err)
	}
	wantErr(t, "Complete of a dead key", st.Complete(ctxT(t), key, c.LeaseID), inbox.ErrLeaseLost)
	wantErr(t, "Release of a dead key", st.Release(ctxT(t), key, c.LeaseID), inbox.ErrLeaseLost)
	wantErr(t, "Fail of a dead key", st.Fail(ctxT(t), key, c.LeaseID, inbox.FailOptions{}), inbox.ErrLeaseLost)
	if _, err := st.Extend(ctxT(t), key, c.LeaseID, longLease); !s.h.NoExtend {
		wantErr(t, "Extend of a dead key", err, inbox.ErrLeaseLost)
	}
	if after := mustGet(t, st, key); !s.sameRecord(after, r) {
		t.Fatalf("fenced calls changed the dead record: %+v, was %+v", after, r)
	}
	// The plain contract marks whatever the state.
	if err := st.MarkProcessed(ctxT(t), key); err != nil {
		t.Fatal(err)
	}
	mustBegin(t, st, key, inbox.BeginOptions{}, inbox.Processed)
}

func (s *suite) testDeadRetention(t *testing.T) {
	st := s.h.New(t, Config{Retention: s.h.Retention})
	key := newKey(t, "dead-retention")
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: s.h.Lease}, inbox.Acquired)
	start := time.Now()
	if err := st.Fail(ctxT(t), key, c.LeaseID, inbox.FailOptions{Dead: true, Reason: "bad"}); err != nil {
		t.Fatal(err)
	}
	// Dead until the retention has run out. On a loaded machine the
	// retention (a second) may run out before the first check: only an
	// answer that comes before it is checked.
	d, err := st.TryBegin(ctxT(t), key, inbox.BeginOptions{})
	if err != nil {
		t.Fatal(err)
	}
	switch e := time.Since(start); {
	case d.Status == inbox.Dead:
	case d.Status == inbox.Acquired && e >= s.h.Retention-s.expiryTolerance():
		t.Logf("the retention ran out before the first check, %s after Fail: expired", e)
		return
	default:
		t.Fatalf("TryBegin %s after Fail with Dead = %v, want Dead for the retention (%s)", e, d.Status, s.h.Retention)
	}
	pollUntil(t, expireDeadline(s.h.Retention), "the dead key to expire with the retention", func() bool {
		c, err := st.TryBegin(ctxT(t), key, inbox.BeginOptions{Lease: longLease})
		if err != nil {
			t.Fatal(err)
		}
		if c.Status != inbox.Dead && c.Status != inbox.Acquired {
			t.Fatalf("TryBegin = %v, want Dead then Acquired", c.Status)
		}
		return c.Status == inbox.Acquired
	})
}
