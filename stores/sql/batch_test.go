package sqlstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
)

// batchKey returns a key of its own for a batch test.
func batchKey(t *testing.T, name string) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "batch:" + hex.EncodeToString(b[:]) + ":" + name
}

func claimOp(key, leaseID string) driver.Op {
	return driver.Op{Kind: driver.Claim, Key: key, LeaseID: leaseID, Lease: time.Minute, Owner: "o-" + leaseID}
}

// apply runs ops as one batch through the store's driver and fails the test
// on a batch error.
func apply(t *testing.T, s *sqlstore.Store, ops ...driver.Op) ([]inbox.Claim, []error) {
	t.Helper()
	res, errs, err := sqlstore.Apply(ctxT(t), s, ops)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return res, errs
}

// Batches crafted to hold several ops on one key, run by the driver as one
// Apply: the ops of a key take effect in slice order, and a batch mixing
// keys in every state answers each op as it would alone.
func TestApply_crafted_batches(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			s := newStore(t, b, db, newTable(t, db, b.dialect), sqlstore.Options{Retention: time.Hour})
			ctx := ctxT(t)

			t.Run("release_then_claim_of_one_key", func(t *testing.T) {
				k := batchKey(t, "rc")
				c, err := s.TryBegin(ctx, k, inbox.BeginOptions{LeaseID: "a"})
				if err != nil || c.Status != inbox.Acquired {
					t.Fatalf("TryBegin: %+v, %v", c, err)
				}
				res, errs := apply(t, s, driver.Op{Kind: driver.Release, Key: k, LeaseID: "a"}, claimOp(k, "b"))
				if errs[0] != nil || errs[1] != nil || res[1].Status != inbox.Acquired || res[1].LeaseID != "b" {
					t.Fatalf("release then claim: %+v %v", res, errs)
				}
				if r, err := s.Get(ctx, k); err != nil || r.State != inbox.StateInProgress || r.Attempts != 2 || r.Owner != "o-b" {
					t.Fatalf("Get: %+v, %v; want in progress by b, 2 attempts", r, err)
				}
			})

			t.Run("claim_then_release_then_claim", func(t *testing.T) {
				k := batchKey(t, "crc")
				res, errs := apply(t, s, claimOp(k, "a"), driver.Op{Kind: driver.Release, Key: k, LeaseID: "a"}, claimOp(k, "b"), claimOp(k, "c"))
				if err := errors.Join(errs...); err != nil {
					t.Fatal(err)
				}
				if res[0].Status != inbox.Acquired || res[2].Status != inbox.Acquired || res[2].LeaseID != "b" || res[3].Status != inbox.Busy {
					t.Fatalf("claims: %+v", res)
				}
				if res[3].RetryAfter <= 0 || !res[3].ExpiresAt.Equal(res[2].ExpiresAt) || res[3].BackingOff {
					t.Fatalf("busy claim %+v, holder's %+v", res[3], res[2])
				}
			})

			t.Run("many_claims_of_one_key_one_acquires", func(t *testing.T) {
				k := batchKey(t, "many")
				var ops []driver.Op
				for i := range 6 {
					ops = append(ops, claimOp(k, fmt.Sprint("l", i)))
				}
				res, errs := apply(t, s, ops...)
				if err := errors.Join(errs...); err != nil {
					t.Fatal(err)
				}
				if res[0].Status != inbox.Acquired || res[0].LeaseID != "l0" {
					t.Fatalf("first claim %+v, want Acquired by l0", res[0])
				}
				for i, c := range res[1:] {
					if c.Status != inbox.Busy || c.BackingOff {
						t.Fatalf("claim %d = %+v, want Busy on l0's lease, not BackingOff", i+1, c)
					}
				}
				// The holder's retry in a later batch renews its lease.
				res, errs = apply(t, s, claimOp(k, "l3"), claimOp(k, "l0"))
				if errs[0] != nil || errs[1] != nil || res[0].Status != inbox.Busy || res[1].Status != inbox.Acquired {
					t.Fatalf("retries: %+v %v", res, errs)
				}
			})

			t.Run("new_busy_processed_and_settles_mixed", func(t *testing.T) {
				busy, done, released, marked := batchKey(t, "busy"), batchKey(t, "done"), batchKey(t, "rel"), batchKey(t, "mark")
				n1, n2, unknown := batchKey(t, "new1"), batchKey(t, "new2"), batchKey(t, "unknown")
				for _, k := range []string{busy, done, released} {
					if c, err := s.TryBegin(ctx, k, inbox.BeginOptions{LeaseID: "h", PayloadHash: "p1"}); err != nil || c.Status != inbox.Acquired {
						t.Fatalf("TryBegin(%s): %+v, %v", k, c, err)
					}
				}
				if err := s.Complete(ctx, done, "h"); err != nil {
					t.Fatal(err)
				}
				res, errs := apply(t, s,
					claimOp(n1, "x"),
					claimOp(busy, "x"),
					driver.Op{Kind: driver.Claim, Key: done, LeaseID: "x", Lease: time.Minute, PayloadHash: "p2"},
					driver.Op{Kind: driver.Complete, Key: done, LeaseID: "h"}, // repeated by the completing lease
					driver.Op{Kind: driver.Release, Key: released, LeaseID: "h"},
					driver.Op{Kind: driver.Complete, Key: unknown, LeaseID: "h"},
					driver.Op{Kind: driver.Release, Key: busy, LeaseID: "not-h"},
					driver.Op{Kind: driver.Mark, Key: marked},
					claimOp(n2, "y"),
					driver.Op{Kind: driver.Complete, Key: n1, LeaseID: "x"}, // second op of n1: after its claim
					driver.Op{Kind: driver.Claim, Key: marked, LeaseID: "z", Lease: time.Minute},
				)
				want := []struct {
					status inbox.Status
					err    error
				}{
					{inbox.Acquired, nil}, {inbox.Busy, nil}, {inbox.Processed, nil}, {0, nil}, {0, nil},
					{0, inbox.ErrLeaseLost}, {0, inbox.ErrLeaseLost}, {0, nil}, {inbox.Acquired, nil}, {0, nil}, {inbox.Processed, nil},
				}
				for i, w := range want {
					if (w.err == nil) != (errs[i] == nil) || (w.err != nil && !errors.Is(errs[i], w.err)) || res[i].Status != w.status {
						t.Errorf("op %d: %+v, %v; want status %v, error %v", i, res[i], errs[i], w.status, w.err)
					}
				}
				if res[1].BackingOff {
					t.Errorf("claim of a held key: %+v, not BackingOff", res[1])
				}
				if !res[2].PayloadMismatch || res[1].PayloadMismatch {
					t.Errorf("payload mismatch: processed %v, busy %v", res[2].PayloadMismatch, res[1].PayloadMismatch)
				}
				for k, st := range map[string]inbox.State{n1: inbox.StateProcessed, n2: inbox.StateInProgress, busy: inbox.StateInProgress,
					done: inbox.StateProcessed, released: inbox.StateAvailable, marked: inbox.StateProcessed, unknown: inbox.StateNotFound} {
					if r, err := s.Get(ctx, k); err != nil || r.State != st {
						t.Errorf("Get(%s) = %+v, %v; want %v", k, r, err, st)
					}
				}
			})

			t.Run("complete_then_claim_and_mark_over_lease", func(t *testing.T) {
				k, m := batchKey(t, "cc"), batchKey(t, "mo")
				res, errs := apply(t, s, claimOp(k, "a"), claimOp(m, "a"),
					driver.Op{Kind: driver.Complete, Key: k, LeaseID: "a"}, driver.Op{Kind: driver.Mark, Key: m},
					claimOp(k, "b"), driver.Op{Kind: driver.Complete, Key: m, LeaseID: "a"}, driver.Op{Kind: driver.Complete, Key: k, LeaseID: "a"})
				if errs[0] != nil || errs[2] != nil || errs[3] != nil || errs[4] != nil || errs[6] != nil {
					t.Fatalf("errors %v", errs)
				}
				if res[4].Status != inbox.Processed {
					t.Fatalf("claim after complete: %+v", res[4])
				}
				if !errors.Is(errs[5], inbox.ErrLeaseLost) {
					t.Fatalf("complete after a mark over the lease: %v, want ErrLeaseLost", errs[5])
				}
			})

			t.Run("fail_then_claim_of_one_key", func(t *testing.T) {
				k := batchKey(t, "fc")
				if c, err := s.TryBegin(ctx, k, inbox.BeginOptions{LeaseID: "a"}); err != nil || c.Status != inbox.Acquired || c.Attempts != 1 {
					t.Fatalf("TryBegin: %+v, %v", c, err)
				}
				res, errs := apply(t, s, failOp(k, "a", inbox.FailOptions{Reason: "first 'try' failed"}), claimOp(k, "b"), failOp(k, "a", inbox.FailOptions{}))
				if errs[0] != nil || errs[1] != nil || res[1].Status != inbox.Acquired || res[1].Attempts != 2 {
					t.Fatalf("fail then claim: %+v %v", res, errs)
				}
				if !errors.Is(errs[2], inbox.ErrLeaseLost) {
					t.Fatalf("second Fail of the failed lease: %v, want ErrLeaseLost", errs[2])
				}
				if r, err := s.Get(ctx, k); err != nil || r.State != inbox.StateInProgress || r.Attempts != 2 || r.Reason != "first 'try' failed" || !r.RetryAt.IsZero() {
					t.Fatalf("Get: %+v, %v; want in progress, 2 attempts, the reason kept", r, err)
				}
			})

			t.Run("fail_with_backoff_then_claims", func(t *testing.T) {
				k := batchKey(t, "fb")
				res, errs := apply(t, s, claimOp(k, "a"), failOp(k, "a", inbox.FailOptions{RetryAfter: time.Hour, Reason: "later"}), claimOp(k, "b"), claimOp(k, "a"))
				if err := errors.Join(errs...); err != nil {
					t.Fatal(err)
				}
				if res[0].Status != inbox.Acquired || res[2].Status != inbox.Busy || res[3].Status != inbox.Busy {
					t.Fatalf("claims: %+v", res)
				}
				for _, c := range res[2:] {
					if c.Attempts != 1 || c.RetryAfter < 59*time.Minute || c.RetryAfter > time.Hour || c.LeaseID != "" || !c.BackingOff {
						t.Fatalf("claim during the backoff %+v; want Busy, BackingOff, for about an hour, 1 attempt", c)
					}
				}
				r, err := s.Get(ctx, k)
				if err != nil || r.State != inbox.StateAvailable || r.Reason != "later" || r.RetryAt.IsZero() || !r.LeaseUntil.IsZero() {
					t.Fatalf("Get: %+v, %v; want available with RetryAt and the reason", r, err)
				}
				if !res[2].ExpiresAt.Equal(r.RetryAt) {
					t.Fatalf("Busy ExpiresAt %v, RetryAt %v: want the same", res[2].ExpiresAt, r.RetryAt)
				}
				// A later batch: still busy; the failed lease is fenced.
				res, errs = apply(t, s, claimOp(k, "c"), failOp(k, "a", inbox.FailOptions{Dead: true, RetryAfter: time.Hour}), driver.Op{Kind: driver.Release, Key: k, LeaseID: "a"})
				if errs[0] != nil || res[0].Status != inbox.Busy || !res[0].BackingOff || !errors.Is(errs[1], inbox.ErrLeaseLost) || !errors.Is(errs[2], inbox.ErrLeaseLost) {
					t.Fatalf("after the backoff began: %+v %v", res, errs)
				}
				if err := s.ForceRelease(ctx, k); err != nil {
					t.Fatal(err)
				}
				res, errs = apply(t, s, claimOp(k, "d"), claimOp(k, "e"))
				if errs[0] != nil || errs[1] != nil || res[0].Status != inbox.Acquired || res[0].Attempts != 2 || res[1].Status != inbox.Busy || res[1].BackingOff {
					t.Fatalf("claims after ForceRelease: %+v %v", res, errs)
				}
			})

			t.Run("dead", func(t *testing.T) {
				k, m := batchKey(t, "dead"), batchKey(t, "mark-dead")
				reason := "refused: \"XYZ\" ✗ 100% _sure_ \\ {a,b}"
				res, errs := apply(t, s, claimOp(k, "a"), claimOp(m, "a"),
					failOp(k, "a", inbox.FailOptions{Dead: true, Reason: reason}), failOp(m, "a", inbox.FailOptions{Dead: true}),
					claimOp(k, "b"), claimOp(m, "a"),
					driver.Op{Kind: driver.Complete, Key: k, LeaseID: "a"}, driver.Op{Kind: driver.Mark, Key: m})
				for _, i := range []int{0, 1, 2, 3, 4, 5, 7} {
					if errs[i] != nil {
						t.Fatalf("op %d: %v", i, errs[i])
					}
				}
				if res[4].Status != inbox.Dead || res[4].Reason != reason || res[4].Attempts != 1 || res[4].LeaseID != "" {
					t.Fatalf("claim of the dead key: %+v", res[4])
				}
				if res[5].Status != inbox.Dead || res[5].Reason != "" {
					t.Fatalf("claim of the other dead key by the failed lease: %+v", res[5])
				}
				if !errors.Is(errs[6], inbox.ErrLeaseLost) {
					t.Fatalf("Complete of a dead key: %v, want ErrLeaseLost", errs[6])
				}
				if r, err := s.Get(ctx, k); err != nil || r.State != inbox.StateDead || r.Reason != reason || r.Attempts != 1 {
					t.Fatalf("Get(dead): %+v, %v", r, err)
				}
				if r, err := s.Get(ctx, m); err != nil || r.State != inbox.StateProcessed {
					t.Fatalf("Get(marked dead key): %+v, %v; want processed", r, err)
				}
				if err := s.ForceRelease(ctx, k); err != nil {
					t.Fatal(err)
				}
				if res, errs := apply(t, s, claimOp(k, "c"), claimOp(m, "c")); errs[0] != nil || errs[1] != nil || res[0].Status != inbox.Dead || res[1].Status != inbox.Processed {
					t.Fatalf("claims after ForceRelease of a dead key and a mark: %+v %v", res, errs)
				}
			})

			t.Run("fails_of_many_keys_each_their_own", func(t *testing.T) {
				keys := make([]string, 6)
				var claims []driver.Op
				for i := range keys {
					keys[i] = batchKey(t, fmt.Sprint("many-fails-", i))
					claims = append(claims, claimOp(keys[i], "a"))
				}
				if _, errs := apply(t, s, claims[:5]...); errors.Join(errs...) != nil {
					t.Fatal(errors.Join(errs...))
				}
				res, errs := apply(t, s,
					failOp(keys[0], "a", inbox.FailOptions{Reason: "zero"}),
					failOp(keys[1], "a", inbox.FailOptions{RetryAfter: time.Hour, Reason: "one"}),
					failOp(keys[2], "a", inbox.FailOptions{Dead: true, RetryAfter: time.Hour, Reason: "two"}), // no backoff for the dead
					failOp(keys[3], "not-a", inbox.FailOptions{Dead: true, Reason: "three"}),
					driver.Op{Kind: driver.Release, Key: keys[4], LeaseID: "a"},
					failOp(keys[5], "a", inbox.FailOptions{Reason: "unknown"}),
					claimOp(keys[0], "b"), claimOp(keys[1], "b"), claimOp(keys[2], "b"), claimOp(keys[3], "b"),
				)
				for i, want := range []error{nil, nil, nil, inbox.ErrLeaseLost, nil, inbox.ErrLeaseLost, nil, nil, nil, nil} {
					if (want == nil) != (errs[i] == nil) || (want != nil && !errors.Is(errs[i], want)) {
						t.Errorf("op %d: error %v, want %v", i, errs[i], want)
					}
				}
				for i, want := range map[int]inbox.Status{6: inbox.Acquired, 7: inbox.Busy, 8: inbox.Dead, 9: inbox.Busy} {
					if res[i].Status != want {
						t.Errorf("op %d: %+v, want %v", i, res[i], want)
					}
				}
				if res[8].Reason != "two" || res[7].RetryAfter < 59*time.Minute || !res[7].BackingOff || res[9].BackingOff {
					t.Errorf("dead claim %+v, claim in a backoff %+v", res[8], res[7])
				}
				for i, want := range []struct {
					state  inbox.State
					reason string
				}{{inbox.StateInProgress, "zero"}, {inbox.StateAvailable, "one"}, {inbox.StateDead, "two"}, {inbox.StateInProgress, ""}, {inbox.StateAvailable, ""}, {inbox.StateNotFound, ""}} {
					if r, err := s.Get(ctx, keys[i]); err != nil || r.State != want.state || r.Reason != want.reason {
						t.Errorf("Get(key %d) = %+v, %v; want %v with reason %q", i, r, err, want.state, want.reason)
					}
				}
			})
		})
	}
}

func failOp(key, leaseID string, opts inbox.FailOptions) driver.Op {
	return driver.Op{Kind: driver.Fail, Key: key, LeaseID: leaseID, Failure: opts}
}

// Concurrent calls through the store share round trips, and the claims of
// one key among them still give exactly one Acquired.
func TestStore_concurrent_calls_share_round_trips(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			s := newStore(t, b, db, newTable(t, db, b.dialect), sqlstore.Options{})
			ctx := ctxT(t)
			before := s.BatchStats()
			shared := batchKey(t, "shared")
			const n = 48
			var (
				wg       sync.WaitGroup
				mu       sync.Mutex
				acquired int
				failures []error
			)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					key := shared
					if i%2 == 0 {
						key = batchKey(t, fmt.Sprint(i))
					}
					c, err := s.TryBegin(ctx, key, inbox.BeginOptions{})
					if err == nil && c.Status == inbox.Acquired {
						err = s.Complete(ctx, key, c.LeaseID)
					}
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						failures = append(failures, err)
					} else if c.Status == inbox.Acquired && key == shared {
						acquired++
					}
				}()
			}
			wg.Wait()
			if err := errors.Join(failures...); err != nil {
				t.Fatal(err)
			}
			if acquired != 1 {
				t.Fatalf("%d claims of the shared key acquired it, want 1", acquired)
			}
			st := s.BatchStats().Sub(before)
			t.Logf("%d calls in %d round trips", st.Calls, st.RoundTrips)
			if st.Calls < n || st.RoundTrips > st.Calls {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// Concurrent Fails through the store travel in batches with claims, and
// each gets its own outcome: a backoff, a dead key, a key given back, or
// lease lost for a lease that does not hold its key.
func TestStore_concurrent_fails_each_their_own(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			s := newStore(t, b, db, newTable(t, db, b.dialect), sqlstore.Options{})
			ctx := ctxT(t)
			before := s.BatchStats()
			const n = 48
			var (
				wg       sync.WaitGroup
				mu       sync.Mutex
				failures []error
			)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					key := batchKey(t, fmt.Sprint("cf-", i))
					err := func() error {
						c, err := s.TryBegin(ctx, key, inbox.BeginOptions{Lease: time.Minute})
						if err != nil || c.Status != inbox.Acquired {
							return fmt.Errorf("TryBegin(%s) = %+v, %v", key, c, err)
						}
						// i%4: given back at once, a backoff, dead, or a
						// Fail by a lease that does not hold the key.
						reason := fmt.Sprint("failure ", i)
						opts, holder, want, attempts := inbox.FailOptions{Reason: reason}, c.LeaseID, inbox.Acquired, 2
						switch i % 4 {
						case 1:
							opts.RetryAfter, want, attempts = time.Hour, inbox.Busy, 1 // BackingOff
						case 2:
							opts.Dead, want, attempts = true, inbox.Dead, 1
						case 3:
							holder, want, attempts, reason = "not-"+c.LeaseID, inbox.Busy, 1, ""
						}
						err = s.Fail(ctx, key, holder, opts)
						if lostWanted := i%4 == 3; (err == nil) == lostWanted || (lostWanted && !errors.Is(err, inbox.ErrLeaseLost)) {
							return fmt.Errorf("Fail(%s, %+v) by %q: %v", key, opts, holder, err)
						}
						c, err = s.TryBegin(ctx, key, inbox.BeginOptions{Lease: time.Minute})
						if err != nil || c.Status != want || c.Attempts != attempts || c.BackingOff != (i%4 == 1) {
							return fmt.Errorf("TryBegin(%s) after Fail(%+v) = %+v, %v; want %v with %d attempts, BackingOff only after a backoff", key, opts, c, err, want, attempts)
						}
						if r, err := s.Get(ctx, key); err != nil || r.Reason != reason {
							return fmt.Errorf("Get(%s) = %+v, %v; want the reason %q", key, r, err, reason)
						}
						return nil
					}()
					mu.Lock()
					defer mu.Unlock()
					failures = append(failures, err)
				}()
			}
			wg.Wait()
			if err := errors.Join(failures...); err != nil {
				t.Fatal(err)
			}
			st := s.BatchStats().Sub(before)
			t.Logf("%d calls in %d round trips", st.Calls, st.RoundTrips)
		})
	}
}

// A batch that fails for a transport reason fails as a whole: a canceled
// context aborts the statement and the driver returns the error.
func TestApply_failure_fails_the_batch(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			s := newStore(t, b, db, newTable(t, db, b.dialect), sqlstore.Options{})
			ctx, cancel := context.WithCancel(ctxT(t))
			cancel()
			k := batchKey(t, "x")
			_, _, err := sqlstore.Apply(ctx, s, []driver.Op{claimOp(k, "a"), claimOp(batchKey(t, "y"), "a"), {Kind: driver.Complete, Key: k, LeaseID: "a"}})
			if err == nil {
				t.Fatal("Apply under a canceled context succeeded")
			}
			if r, err := s.Get(ctxT(t), k); err != nil || r.State != inbox.StateNotFound {
				t.Fatalf("Get after the failed batch: %+v, %v", r, err)
			}
		})
	}
}
