package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
)

// goer is a store built on stores/driver: it makes a call without the
// caller waiting ([driver.Store.Go]), as the middleware marks keys.
type goer interface {
	Go(ctx context.Context, op driver.Op, then func(inbox.Claim, error))
}

// testGo makes Completes (knowing their claim, as the middleware's, and
// not), Releases and Extends through Go, all at once, and checks that each
// gets the answer its method would give and that the records agree; bad
// input is refused without change, through then.
func (s *suite) testGo(t *testing.T) {
	st := s.store(t)
	g, ok := st.(goer)
	if !ok {
		t.Skip("the store has no Go method (it is not built on stores/driver)")
	}
	ctx := ctxT(t)
	type goCase struct {
		name  string
		op    driver.Op
		want  func(error) error
		check func(inbox.Record, inbox.Claim) error
		got   inbox.Claim
		err   error
	}
	const owner, hash = "go-owner", "0123456789abcdef"
	var cases []*goCase
	add := func(name string, holder bool, op func(key string, c inbox.Claim) driver.Op, want func(error) error, check func(inbox.Record, inbox.Claim) error) {
		for i := range 4 {
			key := newKey(t, fmt.Sprintf("go-%s-%d", name, i))
			var c inbox.Claim
			if holder {
				c = mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, Owner: owner, PayloadHash: hash}, inbox.Acquired)
			}
			cases = append(cases, &goCase{name: name, op: op(key, c), want: want, check: check})
		}
	}
	state := func(want inbox.State) func(inbox.Record, inbox.Claim) error {
		return func(r inbox.Record, _ inbox.Claim) error {
			if r.State != want || (want != inbox.StateNotFound && r.Attempts != 1) {
				return fmt.Errorf("record %+v, want %v with 1 attempt", r, want)
			}
			return nil
		}
	}
	processed := func(r inbox.Record, _ inbox.Claim) error {
		// A processed record may keep no owner: the owner lives while a
		// lease is in flight.
		if r.State != inbox.StateProcessed || r.Attempts != 1 || (r.Owner != owner && r.Owner != "") || r.PayloadHash != hash {
			return fmt.Errorf("record %+v, want processed, 1 attempt, owner %q or none, payload hash %q", r, owner, hash)
		}
		return nil
	}
	add("complete-knowing-its-claim", true, func(key string, c inbox.Claim) driver.Op {
		return driver.Op{Kind: driver.Complete, Key: key, LeaseID: c.LeaseID, Owner: owner, PayloadHash: hash, Lease: c.Lease, ExpiresAt: c.ExpiresAt}
	}, wantNil, processed)
	add("complete", true, func(key string, c inbox.Claim) driver.Op {
		return driver.Op{Kind: driver.Complete, Key: key, LeaseID: c.LeaseID}
	}, wantNil, processed)
	add("complete-knowing-it-wrong", true, func(key string, c inbox.Claim) driver.Op {
		return driver.Op{Kind: driver.Complete, Key: key, LeaseID: c.LeaseID, Owner: owner, PayloadHash: hash, Lease: c.Lease, ExpiresAt: c.ExpiresAt.Add(-time.Second)}
	}, wantNil, processed)
	add("complete-foreign", true, func(key string, c inbox.Claim) driver.Op {
		return driver.Op{Kind: driver.Complete, Key: key, LeaseID: inbox.NewLeaseID(), Owner: owner, PayloadHash: hash, Lease: c.Lease, ExpiresAt: c.ExpiresAt}
	}, func(err error) error { return wantIs(err, inbox.ErrLeaseLost) }, state(inbox.StateInProgress))
	add("release", true, func(key string, c inbox.Claim) driver.Op {
		return driver.Op{Kind: driver.Release, Key: key, LeaseID: c.LeaseID}
	}, wantNil, state(inbox.StateAvailable))
	add("bad-input", false, func(key string, _ inbox.Claim) driver.Op {
		return driver.Op{Kind: driver.Complete, Key: key} // no lease id
	}, func(err error) error { return wantIs(err, inbox.ErrInvalidArgument) }, state(inbox.StateNotFound))
	if !s.h.NoExtend {
		add("extend", true, func(key string, c inbox.Claim) driver.Op {
			return driver.Op{Kind: driver.Extend, Key: key, LeaseID: c.LeaseID, Lease: 2 * longLease}
		}, wantNil, func(r inbox.Record, got inbox.Claim) error {
			if r.State != inbox.StateInProgress || !r.LeaseUntil.Equal(got.ExpiresAt) || time.Until(r.LeaseUntil) < longLease {
				return fmt.Errorf("record %+v after Extend answered %v, want in progress until then, about %s from now", r, got.ExpiresAt, 2*longLease)
			}
			return nil
		})
	}
	var wg sync.WaitGroup
	var fns []func()
	for _, c := range cases {
		wg.Add(1)
		fns = append(fns, func() {
			g.Go(ctx, c.op, func(got inbox.Claim, err error) {
				c.got, c.err = got, err
				wg.Done()
			})
		})
	}
	together(fns...)
	wg.Wait()
	for _, c := range cases {
		if err := c.want(c.err); err != nil {
			t.Errorf("%s: Go answered: %v", c.name, err)
			continue
		}
		r, err := st.Get(ctx, c.op.Key)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.check(r, c.got); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("the suite's deadline passed")
	}
}
