package storetest

import (
	"testing"

	"github.com/watermill-inbox/inbox"
)

func (s *suite) testGetUnknown(t *testing.T) {
	st := s.store(t)
	r := mustGet(t, st, newKey(t, "never-seen"))
	if r != (inbox.Record{}) {
		t.Fatalf("Get of an unknown key = %+v, want the zero Record (NotFound)", r)
	}
	ok, err := st.IsProcessed(ctxT(t), newKey(t, "never-seen"))
	if err != nil || ok {
		t.Fatalf("IsProcessed of an unknown key = %v, %v; want false, nil", ok, err)
	}
}

func (s *suite) testGetLifecycle(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "lifecycle")
	prec := s.h.TimePrecision

	c1 := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, Owner: "owner-1", PayloadHash: "hash-1"}, inbox.Acquired)
	r1 := mustGet(t, st, key)
	switch {
	case r1.State != inbox.StateInProgress:
		t.Fatalf("state after TryBegin = %v, want InProgress", r1.State)
	case r1.Attempts != 1:
		t.Fatalf("attempts after TryBegin = %d, want 1", r1.Attempts)
	case r1.FirstSeen.IsZero() || r1.LastSeen.Before(r1.FirstSeen):
		t.Fatalf("first seen %s, last seen %s: want first seen set and not after last seen", r1.FirstSeen, r1.LastSeen)
	case !within(r1.LeaseUntil, c1.ExpiresAt, prec):
		t.Fatalf("LeaseUntil %s, want the claim's ExpiresAt %s", r1.LeaseUntil, c1.ExpiresAt)
	case r1.Owner != "owner-1":
		t.Fatalf("owner %q, want owner-1", r1.Owner)
	case r1.PayloadHash != "hash-1":
		t.Fatalf("payload hash %q, want hash-1", r1.PayloadHash)
	}

	if err := st.Release(ctxT(t), key, c1.LeaseID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	r2 := mustGet(t, st, key)
	switch {
	case r2.State != inbox.StateAvailable || !r2.LeaseUntil.IsZero():
		t.Fatalf("after Release: %v, LeaseUntil %s; want Available without a lease", r2.State, r2.LeaseUntil)
	case r2.Attempts != 1:
		t.Fatalf("attempts after Release = %d, want 1", r2.Attempts)
	case !within(r2.FirstSeen, r1.FirstSeen, prec):
		t.Fatalf("Release moved FirstSeen from %s to %s", r1.FirstSeen, r2.FirstSeen)
	case r2.LastSeen.Before(r1.LastSeen.Add(-prec)):
		t.Fatalf("LastSeen went back from %s to %s", r1.LastSeen, r2.LastSeen)
	}

	c3 := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, Owner: "owner-2", PayloadHash: "hash-1"}, inbox.Acquired)
	r3 := mustGet(t, st, key)
	switch {
	case r3.State != inbox.StateInProgress || r3.Attempts != 2:
		t.Fatalf("after re-acquire: %v with %d attempts, want InProgress with 2", r3.State, r3.Attempts)
	case r3.Owner != "owner-2":
		t.Fatalf("owner after re-acquire %q, want owner-2", r3.Owner)
	case !within(r3.FirstSeen, r1.FirstSeen, prec):
		t.Fatalf("re-acquire moved FirstSeen from %s to %s", r1.FirstSeen, r3.FirstSeen)
	case r3.LastSeen.Before(r2.LastSeen.Add(-prec)):
		t.Fatalf("LastSeen went back from %s to %s", r2.LastSeen, r3.LastSeen)
	}

	if err := st.Complete(ctxT(t), key, c3.LeaseID); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	r4 := mustGet(t, st, key)
	switch {
	case r4.State != inbox.StateProcessed || r4.Attempts != 2:
		t.Fatalf("after Complete: %v with %d attempts, want Processed with 2", r4.State, r4.Attempts)
	case !r4.LeaseUntil.IsZero():
		t.Fatalf("processed record still has LeaseUntil %s", r4.LeaseUntil)
	case !within(r4.FirstSeen, r1.FirstSeen, prec) || r4.LastSeen.Before(r4.FirstSeen):
		t.Fatalf("after Complete: first seen %s (was %s), last seen %s", r4.FirstSeen, r1.FirstSeen, r4.LastSeen)
	case r4.PayloadHash != "hash-1":
		t.Fatalf("payload hash after Complete %q, want hash-1", r4.PayloadHash)
	}
}

func (s *suite) testPayloadHash(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "payload")
	c1 := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, PayloadHash: "h1"}, inbox.Acquired)
	if c1.PayloadMismatch {
		t.Fatal("first TryBegin reports a payload mismatch")
	}
	if b := mustBegin(t, st, key, inbox.BeginOptions{PayloadHash: "h2"}, inbox.Busy); !b.PayloadMismatch {
		t.Fatal("Busy TryBegin with another hash does not report the mismatch")
	}
	if b := mustBegin(t, st, key, inbox.BeginOptions{PayloadHash: "h1"}, inbox.Busy); b.PayloadMismatch {
		t.Fatal("Busy TryBegin with the same hash reports a mismatch")
	}
	if b := mustBegin(t, st, key, inbox.BeginOptions{}, inbox.Busy); b.PayloadMismatch {
		t.Fatal("TryBegin without a hash reports a mismatch")
	}
	if err := st.Release(ctxT(t), key, c1.LeaseID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	c2 := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, PayloadHash: "h2"}, inbox.Acquired)
	if !c2.PayloadMismatch {
		t.Fatal("Acquired TryBegin with another hash does not report the mismatch")
	}
	if r := mustGet(t, st, key); r.PayloadHash != "h1" {
		t.Fatalf("recorded payload hash %q, want the first one, h1", r.PayloadHash)
	}
	if err := st.Complete(ctxT(t), key, c2.LeaseID); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if p := mustBegin(t, st, key, inbox.BeginOptions{PayloadHash: "h3"}, inbox.Processed); !p.PayloadMismatch {
		t.Fatal("Processed TryBegin with another hash does not report the mismatch")
	}
	if p := mustBegin(t, st, key, inbox.BeginOptions{PayloadHash: "h1"}, inbox.Processed); p.PayloadMismatch {
		t.Fatal("Processed TryBegin with the recorded hash reports a mismatch")
	}

	// A key first seen without a hash records the first hash given later.
	late := newKey(t, "payload-late")
	c := mustBegin(t, st, late, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	if err := st.Release(ctxT(t), late, c.LeaseID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if c := mustBegin(t, st, late, inbox.BeginOptions{Lease: longLease, PayloadHash: "x"}, inbox.Acquired); c.PayloadMismatch {
		t.Fatal("first hash given for a known key reports a mismatch")
	}
	if r := mustGet(t, st, late); r.PayloadHash != "x" {
		t.Fatalf("recorded payload hash %q, want x", r.PayloadHash)
	}
}

func (s *suite) testPlainStore(t *testing.T) {
	st := s.store(t)
	ctx := ctxT(t)
	key := newKey(t, "plain")
	if ok, err := st.IsProcessed(ctx, key); err != nil || ok {
		t.Fatalf("IsProcessed of a new key = %v, %v; want false", ok, err)
	}
	for i := range 2 {
		if err := st.MarkProcessed(ctx, key); err != nil {
			t.Fatalf("MarkProcessed #%d: %v", i+1, err)
		}
	}
	if ok, err := st.IsProcessed(ctx, key); err != nil || !ok {
		t.Fatalf("IsProcessed after MarkProcessed = %v, %v; want true", ok, err)
	}
	mustBegin(t, st, key, inbox.BeginOptions{}, inbox.Processed)
	if r := mustGet(t, st, key); r.State != inbox.StateProcessed || r.FirstSeen.IsZero() {
		t.Fatalf("Get after MarkProcessed = %+v, want Processed with FirstSeen", r)
	}

	// A key with a live lease is not processed yet.
	leased := newKey(t, "plain-leased")
	mustBegin(t, st, leased, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	if ok, err := st.IsProcessed(ctx, leased); err != nil || ok {
		t.Fatalf("IsProcessed of an in-progress key = %v, %v; want false", ok, err)
	}
}

func (s *suite) testMarkOverLease(t *testing.T) {
	st := s.store(t)
	key := newKey(t, "mark-over-lease")
	mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	if err := st.MarkProcessed(ctxT(t), key); err != nil {
		t.Fatalf("MarkProcessed over a live lease: %v", err)
	}
	mustBegin(t, st, key, inbox.BeginOptions{}, inbox.Processed)
	if r := mustGet(t, st, key); r.State != inbox.StateProcessed || !r.LeaseUntil.IsZero() {
		t.Fatalf("after MarkProcessed over a lease: %v, LeaseUntil %s; want Processed without lease", r.State, r.LeaseUntil)
	}
}
