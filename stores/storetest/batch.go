package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/watermill-inbox/inbox"
)

// The cases of this file release many calls at once, so that on a store
// batching its round trips they share one, and check that every call gets
// its own result and that the records agree with what each caller saw.

// together runs every fn in a goroutine of its own, released at once, and
// waits for all of them.
func together(fns ...func()) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, fn := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			fn()
		}()
	}
	close(start)
	wg.Wait()
}

// testConcurrentMixedKeys claims, all at once, keys that are new, held,
// in a failed attempt's backoff, processed, released and marked: each claim
// gets its key's status, and Get agrees.
func (s *suite) testConcurrentMixedKeys(t *testing.T) {
	st := s.store(t)
	const n = 8 // keys of each kind
	type claimCase struct {
		kind   string
		key    string
		holder inbox.Claim // the setup's lease, for held keys
		opts   inbox.BeginOptions
		got    inbox.Claim
		err    error
	}
	var cases []*claimCase
	add := func(kind string, i int, setup func(key string) inbox.Claim) {
		key := newKey(t, fmt.Sprintf("mixed-%s-%d", kind, i))
		c := &claimCase{kind: kind, key: key, holder: setup(key)}
		c.opts = inbox.BeginOptions{Lease: longLease, LeaseID: inbox.NewLeaseID(), Owner: "claimer-" + kind}
		cases = append(cases, c)
	}
	acquire := func(key string) inbox.Claim {
		return mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, Owner: "holder"}, inbox.Acquired)
	}
	for i := range n {
		add("new", i, func(string) inbox.Claim { return inbox.Claim{} })
		add("held", i, acquire)
		add("completed", i, func(key string) inbox.Claim {
			c := acquire(key)
			if err := st.Complete(ctxT(t), key, c.LeaseID); err != nil {
				t.Fatalf("setup: Complete(%q): %v", key, err)
			}
			return c
		})
		add("backoff", i, func(key string) inbox.Claim {
			c := acquire(key)
			if err := st.Fail(ctxT(t), key, c.LeaseID, inbox.FailOptions{RetryAfter: longLease, Reason: "later"}); err != nil {
				t.Fatalf("setup: Fail(%q): %v", key, err)
			}
			return c
		})
		add("released", i, func(key string) inbox.Claim {
			c := acquire(key)
			if err := st.Release(ctxT(t), key, c.LeaseID); err != nil {
				t.Fatalf("setup: Release(%q): %v", key, err)
			}
			return c
		})
		add("marked", i, func(key string) inbox.Claim {
			if err := st.MarkProcessed(ctxT(t), key); err != nil {
				t.Fatalf("setup: MarkProcessed(%q): %v", key, err)
			}
			return inbox.Claim{}
		})
	}

	ctx := ctxT(t)
	fns := make([]func(), len(cases))
	for i, c := range cases {
		fns[i] = func() { c.got, c.err = st.TryBegin(ctx, c.key, c.opts) }
	}
	together(fns...)

	for _, c := range cases {
		if c.err != nil {
			t.Fatalf("TryBegin of a %s key: %v", c.kind, c.err)
		}
		got := c.got
		r := mustGet(t, st, c.key)
		switch c.kind {
		case "new", "released":
			attempts := 1
			if c.kind == "released" {
				attempts = 2
			}
			if got.Status != inbox.Acquired || got.LeaseID != c.opts.LeaseID || got.BackingOff {
				t.Fatalf("TryBegin of a %s key = %+v, want Acquired under the lease it asked for, %q", c.kind, got, c.opts.LeaseID)
			}
			if r.State != inbox.StateInProgress || r.Attempts != attempts || r.Owner != c.opts.Owner || !within(r.LeaseUntil, got.ExpiresAt, s.h.TimePrecision) {
				t.Fatalf("Get of a %s key after its claim = %+v, want InProgress, %d attempts, owner %q, lease until %s",
					c.kind, r, attempts, c.opts.Owner, got.ExpiresAt)
			}
		case "held":
			if got.Status != inbox.Busy || got.LeaseID != "" || !within(got.ExpiresAt, c.holder.ExpiresAt, s.h.TimePrecision) ||
				got.RetryAfter <= 0 || got.RetryAfter > longLease+s.h.TimePrecision || got.BackingOff {
				t.Fatalf("TryBegin of a held key = %+v, want Busy until the holder's %s, without a lease id, not BackingOff", got, c.holder.ExpiresAt)
			}
			if r.State != inbox.StateInProgress || r.Attempts != 1 || r.Owner != "holder" || !within(r.LeaseUntil, c.holder.ExpiresAt, s.h.TimePrecision) {
				t.Fatalf("Get of a held key after a Busy claim = %+v, want it still the holder's (1 attempt, until %s)", r, c.holder.ExpiresAt)
			}
			if err := st.Complete(ctxT(t), c.key, c.holder.LeaseID); err != nil {
				t.Fatalf("the holder's Complete after a Busy claim: %v", err)
			}
		case "backoff":
			if got.Status != inbox.Busy || !got.BackingOff || got.LeaseID != "" || got.Attempts != 1 ||
				got.RetryAfter <= 0 || got.RetryAfter > longLease+s.h.TimePrecision || !within(got.ExpiresAt, r.RetryAt, s.h.TimePrecision) {
				t.Fatalf("TryBegin of a key in backoff = %+v, want Busy, BackingOff, until the record's RetryAt %s, without a lease id", got, r.RetryAt)
			}
			if r.State != inbox.StateAvailable || r.Attempts != 1 || r.Owner != "holder" || r.RetryAt.IsZero() {
				t.Fatalf("Get of a key in backoff after a Busy claim = %+v, want it still Available after 1 attempt, with a RetryAt", r)
			}
		case "completed", "marked":
			if got.Status != inbox.Processed || got.LeaseID != "" {
				t.Fatalf("TryBegin of a %s key = %+v, want Processed without a lease id", c.kind, got)
			}
			if r.State != inbox.StateProcessed {
				t.Fatalf("Get of a %s key after a claim = %+v, want Processed", c.kind, r)
			}
		}
	}
}

// testConcurrentSameLeaseID races calls that share one of two lease ids, as
// retries of two consumers' claims would: every call of the winning lease
// gets Acquired (a retried claim is idempotent, even in one batch), every
// call of the other gets Busy, and the key was acquired once.
func (s *suite) testConcurrentSameLeaseID(t *testing.T) {
	s.skipIfNotAtomic(t)
	st := s.store(t)
	for round := range 3 {
		key := newKey(t, fmt.Sprintf("same-lease-race-%d", round))
		ids := [2]string{inbox.NewLeaseID(), inbox.NewLeaseID()}
		ctx := ctxT(t)
		claims := make([]inbox.Claim, racers)
		errs := make([]error, racers)
		fns := make([]func(), racers)
		for i := range fns {
			fns[i] = func() {
				claims[i], errs[i] = st.TryBegin(ctx, key, inbox.BeginOptions{Lease: longLease, LeaseID: ids[i%2], Owner: fmt.Sprint("consumer-", i%2)})
			}
		}
		together(fns...)
		winner := -1
		for i, c := range claims {
			if errs[i] != nil {
				t.Fatalf("racer %d: TryBegin: %v", i, errs[i])
			}
			if c.Status == inbox.Acquired {
				if winner >= 0 && winner != i%2 {
					t.Fatalf("both leases %q and %q got Acquired on one key", ids[0], ids[1])
				}
				winner = i % 2
			}
		}
		if winner < 0 {
			t.Fatalf("none of %d claims under two lease ids got Acquired", racers)
		}
		for i, c := range claims {
			switch {
			case i%2 == winner && (c.Status != inbox.Acquired || c.LeaseID != ids[winner]):
				t.Fatalf("racer %d, a retry of the winning lease %q: %+v, want Acquired under it", i, ids[winner], c)
			case i%2 != winner && (c.Status != inbox.Busy || c.LeaseID != "" || c.RetryAfter <= 0):
				t.Fatalf("racer %d, under the losing lease: %+v, want Busy", i, c)
			}
		}
		r := mustGet(t, st, key)
		if r.State != inbox.StateInProgress || r.Attempts != 1 || r.Owner != fmt.Sprint("consumer-", winner) {
			t.Fatalf("Get after the race = %+v, want InProgress, 1 attempt, owner consumer-%d", r, winner)
		}
		wantErr(t, "Complete by the losing lease", st.Complete(ctxT(t), key, ids[1-winner]), inbox.ErrLeaseLost)
		if err := st.Complete(ctxT(t), key, ids[winner]); err != nil {
			t.Fatalf("Complete by the winning lease: %v", err)
		}
	}
}

// mixedCall is one kind of call of testConcurrentMixedCalls: setup prepares
// its key and returns the lease the call uses, do makes the call and says
// what was wrong with its result, after says what is wrong with the record.
type mixedCall struct {
	name  string
	setup func(t *testing.T, st inbox.LeaseStore, key string) (lease string)
	do    func(ctx context.Context, st inbox.LeaseStore, key, lease string) error
	after func(r inbox.Record) error
}

func wantNil(err error) error {
	if err != nil {
		return fmt.Errorf("error %w, want none", err)
	}
	return nil
}

func wantIs(err, target error) error {
	if !errors.Is(err, target) {
		return fmt.Errorf("error %v, want one wrapping %v", err, target)
	}
	return nil
}

// wantBusy is a call that claims the key without a lease id of its own and
// wants Busy, BackingOff as given.
func wantBusy(backingOff bool) func(ctx context.Context, st inbox.LeaseStore, key, _ string) error {
	return func(ctx context.Context, st inbox.LeaseStore, key, _ string) error {
		c, err := st.TryBegin(ctx, key, inbox.BeginOptions{Lease: longLease})
		if err == nil && (c.Status != inbox.Busy || c.BackingOff != backingOff || c.RetryAfter <= 0) {
			return fmt.Errorf("claim %+v, want Busy with BackingOff %v", c, backingOff)
		}
		return wantNil(err)
	}
}

// wantClaim is a call that claims the key without a lease id of its own
// and wants status.
func wantClaim(status inbox.Status) func(ctx context.Context, st inbox.LeaseStore, key, _ string) error {
	return func(ctx context.Context, st inbox.LeaseStore, key, _ string) error {
		c, err := st.TryBegin(ctx, key, inbox.BeginOptions{Lease: longLease})
		if err == nil && c.Status != status {
			return fmt.Errorf("claim %+v, want %v", c, status)
		}
		return wantNil(err)
	}
}

func wantState(state inbox.State, attempts int) func(r inbox.Record) error {
	return func(r inbox.Record) error {
		if r.State != state || r.Attempts != attempts {
			return fmt.Errorf("record %v with %d attempts, want %v with %d", r.State, r.Attempts, state, attempts)
		}
		return nil
	}
}

func (s *suite) mixedCalls() []mixedCall {
	held := func(t *testing.T, st inbox.LeaseStore, key string) string {
		return mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, Owner: "holder"}, inbox.Acquired).LeaseID
	}
	completed := func(t *testing.T, st inbox.LeaseStore, key string) string {
		id := held(t, st, key)
		if err := st.Complete(ctxT(t), key, id); err != nil {
			t.Fatalf("setup: Complete(%q): %v", key, err)
		}
		return id
	}
	backoff := func(t *testing.T, st inbox.LeaseStore, key string) string {
		id := held(t, st, key)
		if err := st.Fail(ctxT(t), key, id, inbox.FailOptions{RetryAfter: longLease}); err != nil {
			t.Fatalf("setup: Fail(%q): %v", key, err)
		}
		return id
	}
	none := func(*testing.T, inbox.LeaseStore, string) string { return inbox.NewLeaseID() }
	calls := []mixedCall{
		{"Complete by the holder", held,
			func(ctx context.Context, st inbox.LeaseStore, key, lease string) error {
				return wantNil(st.Complete(ctx, key, lease))
			},
			wantState(inbox.StateProcessed, 1)},
		{"Complete repeated by the completing lease", completed,
			func(ctx context.Context, st inbox.LeaseStore, key, lease string) error {
				return wantNil(st.Complete(ctx, key, lease))
			},
			wantState(inbox.StateProcessed, 1)},
		{"Release by the holder", held,
			func(ctx context.Context, st inbox.LeaseStore, key, lease string) error {
				return wantNil(st.Release(ctx, key, lease))
			},
			wantState(inbox.StateAvailable, 1)},
		{"Complete with a foreign lease", held,
			func(ctx context.Context, st inbox.LeaseStore, key, _ string) error {
				return wantIs(st.Complete(ctx, key, inbox.NewLeaseID()), inbox.ErrLeaseLost)
			},
			wantState(inbox.StateInProgress, 1)},
		{"Release with a foreign lease", held,
			func(ctx context.Context, st inbox.LeaseStore, key, _ string) error {
				return wantIs(st.Release(ctx, key, inbox.NewLeaseID()), inbox.ErrLeaseLost)
			},
			wantState(inbox.StateInProgress, 1)},
		{"Complete of an unknown key", none,
			func(ctx context.Context, st inbox.LeaseStore, key, lease string) error {
				return wantIs(st.Complete(ctx, key, lease), inbox.ErrLeaseLost)
			},
			wantState(inbox.StateNotFound, 0)},
		{"Release of an unknown key", none,
			func(ctx context.Context, st inbox.LeaseStore, key, lease string) error {
				return wantIs(st.Release(ctx, key, lease), inbox.ErrLeaseLost)
			},
			wantState(inbox.StateNotFound, 0)},
		{"MarkProcessed of a new key", none,
			func(ctx context.Context, st inbox.LeaseStore, key, _ string) error {
				return wantNil(st.MarkProcessed(ctx, key))
			},
			func(r inbox.Record) error {
				if r.State != inbox.StateProcessed {
					return fmt.Errorf("record %v, want Processed", r.State)
				}
				return nil
			}},
		{"MarkProcessed over a live lease", held,
			func(ctx context.Context, st inbox.LeaseStore, key, _ string) error {
				return wantNil(st.MarkProcessed(ctx, key))
			},
			func(r inbox.Record) error {
				if r.State != inbox.StateProcessed {
					return fmt.Errorf("record %v, want Processed", r.State)
				}
				return nil
			}},
		{"TryBegin of a new key", none,
			func(ctx context.Context, st inbox.LeaseStore, key, lease string) error {
				c, err := st.TryBegin(ctx, key, inbox.BeginOptions{Lease: longLease, LeaseID: lease})
				if err == nil && (c.Status != inbox.Acquired || c.LeaseID != lease) {
					return fmt.Errorf("claim %+v, want Acquired under %q", c, lease)
				}
				return wantNil(err)
			},
			wantState(inbox.StateInProgress, 1)},
		{"TryBegin of a held key", held, wantBusy(false), wantState(inbox.StateInProgress, 1)},
		{"TryBegin of a key in backoff", backoff, wantBusy(true), wantState(inbox.StateAvailable, 1)},
		{"TryBegin of a key in backoff under the failed lease", backoff,
			func(ctx context.Context, st inbox.LeaseStore, key, lease string) error {
				c, err := st.TryBegin(ctx, key, inbox.BeginOptions{Lease: longLease, LeaseID: lease})
				if err == nil && (c.Status != inbox.Busy || !c.BackingOff || c.LeaseID != "") {
					return fmt.Errorf("claim %+v, want Busy, BackingOff, without a lease id", c)
				}
				return wantNil(err)
			},
			wantState(inbox.StateAvailable, 1)},
		{"TryBegin of a processed key", completed, wantClaim(inbox.Processed), wantState(inbox.StateProcessed, 1)},
		{"Get of a held key", held,
			func(ctx context.Context, st inbox.LeaseStore, key, _ string) error {
				r, err := st.Get(ctx, key)
				if err == nil && (r.State != inbox.StateInProgress || r.Owner != "holder") {
					return fmt.Errorf("record %+v, want InProgress held by holder", r)
				}
				return wantNil(err)
			},
			wantState(inbox.StateInProgress, 1)},
		{"IsProcessed of a processed key", completed,
			func(ctx context.Context, st inbox.LeaseStore, key, _ string) error {
				ok, err := st.IsProcessed(ctx, key)
				if err == nil && !ok {
					return errors.New("false, want true")
				}
				return wantNil(err)
			},
			wantState(inbox.StateProcessed, 1)},
	}
	if s.h.NoExtend {
		return calls
	}
	return append(calls, mixedCall{"Extend by the holder", held,
		func(ctx context.Context, st inbox.LeaseStore, key, lease string) error {
			until, err := st.Extend(ctx, key, lease, 2*longLease)
			if err == nil && until.IsZero() {
				return errors.New("extended until a zero time")
			}
			return wantNil(err)
		},
		wantState(inbox.StateInProgress, 1)})
}

// testConcurrentMixedCalls makes calls of every kind at once on keys of
// their own: each gets its own result (an ErrLeaseLost of one never fails
// another), and each record shows its call's effect.
func (s *suite) testConcurrentMixedCalls(t *testing.T) {
	st := s.store(t)
	const copies = 4
	type made struct {
		mc         mixedCall
		key, lease string
		err        error
	}
	var all []*made
	for _, mc := range s.mixedCalls() {
		for i := range copies {
			key := newKey(t, fmt.Sprintf("mixed-call-%d", i))
			all = append(all, &made{mc: mc, key: key, lease: mc.setup(t, st, key)})
		}
	}
	ctx := ctxT(t)
	fns := make([]func(), len(all))
	for i, m := range all {
		fns[i] = func() { m.err = m.mc.do(ctx, st, m.key, m.lease) }
	}
	together(fns...)
	for _, m := range all {
		if m.err != nil {
			t.Errorf("%s, among %d concurrent calls: %v", m.mc.name, len(all), m.err)
			continue
		}
		if err := m.mc.after(mustGet(t, st, m.key)); err != nil {
			t.Errorf("%s, among %d concurrent calls: then %v", m.mc.name, len(all), err)
		}
	}
}

// testReleaseClaimRace releases held keys while other callers claim them.
// Both calls succeed whichever lands first; a claim that got Acquired owns
// the key (the old holder is fenced off), one that got Busy saw the holder's
// lease and left the key to the Release, so it ends Available.
func (s *suite) testReleaseClaimRace(t *testing.T) {
	s.skipIfNotAtomic(t)
	st := s.store(t)
	const rounds, perRound = 10, 8
	acquired, busy := 0, 0
	for round := range rounds {
		type pair struct {
			key        string
			holder     inbox.Claim
			opts       inbox.BeginOptions
			claim      inbox.Claim
			claimErr   error
			releaseErr error
		}
		ps := make([]*pair, perRound)
		for i := range ps {
			key := newKey(t, fmt.Sprintf("release-claim-%d-%d", round, i))
			ps[i] = &pair{
				key:    key,
				holder: mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, Owner: "holder"}, inbox.Acquired),
				opts:   inbox.BeginOptions{Lease: longLease, LeaseID: inbox.NewLeaseID(), Owner: "claimer"},
			}
		}
		ctx := ctxT(t)
		var fns []func()
		for _, p := range ps {
			fns = append(fns,
				func() { p.releaseErr = st.Release(ctx, p.key, p.holder.LeaseID) },
				func() { p.claim, p.claimErr = st.TryBegin(ctx, p.key, p.opts) })
		}
		together(fns...)
		for _, p := range ps {
			if p.releaseErr != nil {
				t.Fatalf("round %d: the holder's Release during a claim: %v", round, p.releaseErr)
			}
			if p.claimErr != nil {
				t.Fatalf("round %d: TryBegin during the holder's Release: %v", round, p.claimErr)
			}
			r := mustGet(t, st, p.key)
			switch c := p.claim; c.Status {
			case inbox.Acquired:
				acquired++
				if c.LeaseID != p.opts.LeaseID {
					t.Fatalf("round %d: claim Acquired under lease %q, asked for %q", round, c.LeaseID, p.opts.LeaseID)
				}
				if r.State != inbox.StateInProgress || r.Attempts != 2 || r.Owner != "claimer" || !within(r.LeaseUntil, c.ExpiresAt, s.h.TimePrecision) {
					t.Fatalf("round %d: the claim got Acquired but Get = %+v; want InProgress under the claimer's lease (until %s), 2 attempts", round, r, c.ExpiresAt)
				}
				wantErr(t, "Complete by the holder that released", st.Complete(ctxT(t), p.key, p.holder.LeaseID), inbox.ErrLeaseLost)
			case inbox.Busy:
				busy++
				if c.LeaseID != "" || !within(c.ExpiresAt, p.holder.ExpiresAt, s.h.TimePrecision) || c.BackingOff {
					t.Fatalf("round %d: Busy claim %+v, want the holder's deadline %s and no lease id", round, c, p.holder.ExpiresAt)
				}
				if r.State != inbox.StateAvailable || r.Attempts != 1 {
					t.Fatalf("round %d: the claim got Busy, so the Release came after it, but Get = %+v; want Available with 1 attempt", round, r)
				}
				// The key is free: the claimer's retry takes it.
				mustBegin(t, st, p.key, p.opts, inbox.Acquired)
			default:
				t.Fatalf("round %d: TryBegin during the holder's Release = %v, want Acquired or Busy", round, c.Status)
			}
			if err := st.Complete(ctxT(t), p.key, p.opts.LeaseID); err != nil {
				t.Fatalf("round %d: the claimer's Complete: %v", round, err)
			}
		}
	}
	t.Logf("%d release/claim races: the claim acquired in %d, was busy in %d", rounds*perRound, acquired, busy)
}
