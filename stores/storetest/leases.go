package storetest

import (
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
)

func (s *suite) testLeaseExpiryFencing(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "expiry")
	old := mustBegin(t, st, key, inbox.BeginOptions{Lease: s.h.Lease, Owner: "stalled"}, inbox.Acquired)

	// Poll with a fixed lease id: Busy until the old lease ends, then Acquired
	// exactly once.
	newID := inbox.NewLeaseID()
	var cur inbox.Claim
	pollUntil(t, expireDeadline(s.h.Lease), "expired lease to be re-acquired", func() bool {
		c, err := st.TryBegin(ctxT(t), key, inbox.BeginOptions{Lease: longLease, LeaseID: newID, Owner: "successor"})
		if err != nil {
			t.Fatalf("TryBegin while waiting for expiry: %v", err)
		}
		if c.Status != inbox.Busy && c.Status != inbox.Acquired {
			t.Fatalf("TryBegin while waiting for expiry = %v, want Busy or Acquired", c.Status)
		}
		if c.BackingOff {
			t.Fatalf("TryBegin while a lease runs out = %+v: BackingOff without a failed attempt", c)
		}
		cur = c
		return c.Status == inbox.Acquired
	})
	if cur.LeaseID != newID {
		t.Fatalf("re-acquired with lease %q, want %q", cur.LeaseID, newID)
	}
	r := mustGet(t, st, key)
	if r.State != inbox.StateInProgress || r.Attempts != 2 || r.Owner != "successor" {
		t.Fatalf("after re-acquire: %v, %d attempts, owner %q; want InProgress, 2, successor", r.State, r.Attempts, r.Owner)
	}

	// The stalled holder is fenced off.
	wantErr(t, "Complete with the expired lease", st.Complete(ctxT(t), key, old.LeaseID), inbox.ErrLeaseLost)
	wantErr(t, "Release with the expired lease", st.Release(ctxT(t), key, old.LeaseID), inbox.ErrLeaseLost)
	_, err := st.Extend(ctxT(t), key, old.LeaseID, longLease)
	if s.h.NoExtend {
		wantErr(t, "Extend on a store without Extend", err, inbox.ErrNotSupported)
	} else {
		wantErr(t, "Extend with the expired lease", err, inbox.ErrLeaseLost)
	}
	after := mustGet(t, st, key)
	if after.State != inbox.StateInProgress || after.Attempts != 2 || !within(after.LeaseUntil, r.LeaseUntil, s.h.TimePrecision) {
		t.Fatalf("the fenced calls changed the record: %+v, was %+v", after, r)
	}
	if err := st.Complete(ctxT(t), key, newID); err != nil {
		t.Fatalf("Complete by the successor: %v", err)
	}
	mustBegin(t, st, key, inbox.BeginOptions{}, inbox.Processed)
}

// A holder whose lease ran out may still complete while nobody took the key
// over: nobody else ran the handler, so marking is safe and saves a rerun.
func (s *suite) testCompleteAfterExpiryUntaken(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "late-complete")
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: s.h.Lease}, inbox.Acquired)
	pollUntil(t, expireDeadline(s.h.Lease), "lease to expire", func() bool {
		return mustGet(t, st, key).State == inbox.StateAvailable
	})
	if err := st.Complete(ctxT(t), key, c.LeaseID); err != nil {
		t.Fatalf("Complete after the lease ran out, nobody having taken over: %v", err)
	}
	mustBegin(t, st, key, inbox.BeginOptions{}, inbox.Processed)
}

func (s *suite) testCompleteRepeated(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "complete-twice")
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	for i := range 3 {
		if err := st.Complete(ctxT(t), key, c.LeaseID); err != nil {
			t.Fatalf("Complete #%d with the completing lease: %v", i+1, err)
		}
	}
	if r := mustGet(t, st, key); r.State != inbox.StateProcessed || r.Attempts != 1 {
		t.Fatalf("after repeated Complete: %v with %d attempts, want Processed with 1", r.State, r.Attempts)
	}
}

func (s *suite) testCompleteForeign(t *testing.T) {
	st := s.store(t)
	ctx := ctxT(t)
	unknown := newKey(t, "unknown")
	wantErr(t, "Complete on an unknown key", st.Complete(ctx, unknown, inbox.NewLeaseID()), inbox.ErrLeaseLost)
	wantErr(t, "Release on an unknown key", st.Release(ctx, unknown, inbox.NewLeaseID()), inbox.ErrLeaseLost)
	if !s.h.NoExtend {
		_, err := st.Extend(ctx, unknown, inbox.NewLeaseID(), longLease)
		wantErr(t, "Extend on an unknown key", err, inbox.ErrLeaseLost)
	}
	if r := mustGet(t, st, unknown); r.State != inbox.StateNotFound {
		t.Fatalf("calls with a foreign lease created a record: %+v", r)
	}

	key := newKey(t, "foreign")
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	wantErr(t, "Complete with a foreign lease", st.Complete(ctx, key, inbox.NewLeaseID()), inbox.ErrLeaseLost)
	if r := mustGet(t, st, key); r.State != inbox.StateInProgress {
		t.Fatalf("a foreign Complete changed the state to %v", r.State)
	}
	if err := st.Complete(ctx, key, c.LeaseID); err != nil {
		t.Fatalf("Complete by the holder: %v", err)
	}
	wantErr(t, "Complete of a processed key with another lease", st.Complete(ctx, key, inbox.NewLeaseID()), inbox.ErrLeaseLost)
	wantErr(t, "Release after Complete", st.Release(ctx, key, c.LeaseID), inbox.ErrLeaseLost)
	if !s.h.NoExtend {
		_, err := st.Extend(ctx, key, c.LeaseID, longLease)
		wantErr(t, "Extend after Complete", err, inbox.ErrLeaseLost)
	}
	if r := mustGet(t, st, key); r.State != inbox.StateProcessed {
		t.Fatalf("calls after Complete changed the state to %v", r.State)
	}
}

func (s *suite) testReleaseFrees(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "release")
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	if err := st.Release(ctxT(t), key, c.LeaseID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	r := mustGet(t, st, key)
	if r.State != inbox.StateAvailable || !r.LeaseUntil.IsZero() {
		t.Fatalf("after Release: %v with LeaseUntil %s, want Available with none", r.State, r.LeaseUntil)
	}
	if ok, err := st.IsProcessed(ctxT(t), key); err != nil || ok {
		t.Fatalf("IsProcessed after Release = %v, %v; want false", ok, err)
	}
	c2 := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	if c2.LeaseID == c.LeaseID {
		t.Fatalf("re-acquire after Release reused the released lease id %q", c.LeaseID)
	}
	if r := mustGet(t, st, key); r.Attempts != 2 {
		t.Fatalf("Attempts after Release and re-acquire = %d, want 2", r.Attempts)
	}
	wantErr(t, "Complete with the released lease", st.Complete(ctxT(t), key, c.LeaseID), inbox.ErrLeaseLost)
}

func (s *suite) testReleaseTwice(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "release-twice")
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	if err := st.Release(ctxT(t), key, c.LeaseID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wantErr(t, "second Release", st.Release(ctxT(t), key, c.LeaseID), inbox.ErrLeaseLost)
	wantErr(t, "Complete after Release", st.Complete(ctxT(t), key, c.LeaseID), inbox.ErrLeaseLost)
	if r := mustGet(t, st, key); r.State != inbox.StateAvailable {
		t.Fatalf("state after the refused calls = %v, want Available", r.State)
	}
}

func (s *suite) testExtendKeepsLease(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "extend")
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: s.h.Lease}, inbox.Acquired)
	exp, err := st.Extend(ctxT(t), key, c.LeaseID, longLease)
	if s.h.NoExtend {
		wantErr(t, "Extend on a store without Extend", err, inbox.ErrNotSupported)
		t.Skip("the store states it cannot extend leases (Harness.NoExtend)")
	}
	if err != nil {
		t.Fatalf("Extend by the holder: %v", err)
	}
	if !exp.After(c.ExpiresAt) {
		t.Fatalf("Extend returned deadline %s, not after the first one %s", exp, c.ExpiresAt)
	}
	r := mustGet(t, st, key)
	if !within(r.LeaseUntil, exp, s.h.TimePrecision) {
		t.Fatalf("Get LeaseUntil %s after Extend, want %s", r.LeaseUntil, exp)
	}
	// For twice the original lease, nobody else may acquire.
	end := time.Now().Add(2*s.h.Lease + 100*time.Millisecond)
	for time.Now().Before(end) {
		b := mustBegin(t, st, key, inbox.BeginOptions{}, inbox.Busy)
		if b.RetryAfter <= s.h.Lease {
			t.Fatalf("Busy RetryAfter %s after extending to %s", b.RetryAfter, longLease)
		}
		time.Sleep(50 * time.Millisecond) // sampling interval over a fixed window, not synchronisation
	}
	if err := st.Complete(ctxT(t), key, c.LeaseID); err != nil {
		t.Fatalf("Complete after Extend: %v", err)
	}
}

func (s *suite) testExtendNonHolder(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "extend-foreign")
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	_, err := st.Extend(ctxT(t), key, inbox.NewLeaseID(), longLease)
	if s.h.NoExtend {
		wantErr(t, "Extend on a store without Extend", err, inbox.ErrNotSupported)
		return
	}
	wantErr(t, "Extend with a foreign lease", err, inbox.ErrLeaseLost)
	if r := mustGet(t, st, key); !within(r.LeaseUntil, c.ExpiresAt, s.h.TimePrecision) {
		t.Fatalf("a foreign Extend moved LeaseUntil to %s from %s", r.LeaseUntil, c.ExpiresAt)
	}
}

// testRetentionReported: a store that implements inbox.RetentionReporter
// reports the retention it was configured with, at the latest after its
// first call (the remote store learns it from the service's discovery
// document). The middleware's stale check reads it.
func (s *suite) testRetentionReported(t *testing.T) {
	ret := s.h.Retention
	st := s.h.New(t, Config{Retention: ret})
	rr, ok := st.(inbox.RetentionReporter)
	if !ok {
		t.Skip("the store does not implement inbox.RetentionReporter: the middleware cannot tell messages too old to be checked (Config.Timestamp)")
	}
	if _, err := st.Get(ctxT(t), newKey(t, "retention-reported")); err != nil {
		t.Fatalf("Get: %v", err)
	}
	if got := rr.Retention(); got != ret {
		t.Fatalf("Retention() = %s, want the %s the store was configured with", got, ret)
	}
}

// A heartbeat is no sighting: Extend moves LeaseUntil, not LastSeen, so
// that a lease held for long while its heartbeat runs (a handler that hangs)
// lists as old: List with StateInProgress and OlderThan finds it, which is
// what inboxctl ls -stuck asks.
func (s *suite) testExtendKeepsLastSeen(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "extend-last-seen")
	lease := s.h.Lease
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: lease}, inbox.Acquired)
	if s.h.NoExtend {
		t.Skip("the store states it cannot extend leases (Harness.NoExtend)")
	}
	acquired := mustGet(t, st, key)
	// Heartbeats until the store's clock (an Extend's deadline less the
	// lease) is age past the acquisition.
	age := 2 * lease
	pollUntil(t, expireDeadline(age), "the store's clock to pass the acquisition by "+age.String(), func() bool {
		until, err := st.Extend(ctxT(t), key, c.LeaseID, lease)
		if err != nil {
			t.Fatalf("Extend by the holder: %v", err)
		}
		return until.Add(-lease).Sub(acquired.LastSeen) >= age
	})
	// A last heartbeat, long, so that the lease still holds while the
	// checks below run: a short one can run out on a loaded machine
	// before List reads the record, which then lists as expired.
	until, err := st.Extend(ctxT(t), key, c.LeaseID, longLease)
	if err != nil {
		t.Fatalf("a last, long Extend by the holder: %v", err)
	}
	r := mustGet(t, st, key)
	if r.State != inbox.StateInProgress || !within(r.LeaseUntil, until, s.h.TimePrecision) {
		t.Fatalf("after the heartbeats: %v until %s, want InProgress until the last Extend's %s", r.State, r.LeaseUntil, until)
	}
	if !within(r.LastSeen, acquired.LastSeen, s.h.TimePrecision) || !within(r.FirstSeen, acquired.FirstSeen, s.h.TimePrecision) {
		t.Fatalf("Extend moved first/last seen to %s/%s from the acquisition's %s/%s",
			r.FirstSeen, r.LastSeen, acquired.FirstSeen, acquired.LastSeen)
	}
	a, ok := st.(inbox.Admin)
	if !ok {
		return
	}
	held := listAll(t, a, inbox.ListOptions{Prefix: key, State: inbox.StateInProgress, OlderThan: age})
	if got := keysOf(held); len(got) != 1 || got[0] != key {
		t.Fatalf("List(in progress, older than %s) = %q, want the lease extended for that long, %q", age, got, key)
	}
	if got := listAll(t, a, inbox.ListOptions{Prefix: key, State: inbox.StateInProgress, OlderThan: time.Hour}); len(got) != 0 {
		t.Fatalf("List(in progress, older than 1h) = %q, want none", keysOf(got))
	}
}

func (s *suite) testRetentionExpiry(t *testing.T) {
	ret := s.h.Retention
	st := s.h.New(t, Config{Retention: ret})
	key := newKey(t, "retention")
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	first := mustGet(t, st, key).FirstSeen
	start := time.Now()
	if err := st.Complete(ctxT(t), key, c.LeaseID); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	// Processed for the whole retention, then gone.
	tolerance := s.expiryTolerance()
	pollUntil(t, expireDeadline(ret), "processed key to expire after the retention", func() bool {
		r := mustGet(t, st, key)
		if r.State == inbox.StateNotFound {
			if e := time.Since(start); e < ret-tolerance {
				t.Fatalf("processed key expired %s after Complete, retention is %s", e, ret)
			}
			return true
		}
		if r.State != inbox.StateProcessed {
			t.Fatalf("state during retention = %v, want Processed", r.State)
		}
		return false
	})
	if ok, err := st.IsProcessed(ctxT(t), key); err != nil || ok {
		t.Fatalf("IsProcessed after the retention = %v, %v; want false", ok, err)
	}
	mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	r := mustGet(t, st, key)
	if r.Attempts != 1 || !r.FirstSeen.After(first) {
		t.Fatalf("record after expiry: %d attempts, first seen %s (was %s); want a fresh record", r.Attempts, r.FirstSeen, first)
	}
}
