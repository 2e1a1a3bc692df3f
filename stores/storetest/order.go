package storetest

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/watermill-inbox/inbox"
)

// The order of order keys (BeginOptions.OrderKey, inbox.OrderAdmin): a
// key whose attempt failed with an OrderKey heads it, and the later keys
// of the order key wait behind it (Behind) in the order they first
// arrived, until it is processed or released.

// orderer returns the store as an inbox.OrderAdmin that keeps order, or
// skips: a store states the capability by implementing the interface and
// answering KeepsOrder true.
func (s *suite) orderer(t *testing.T, st inbox.LeaseStore) inbox.OrderAdmin {
	t.Helper()
	o, ok := st.(inbox.OrderAdmin)
	if !ok || !o.KeepsOrder() {
		t.Skipf("the store (%T) keeps no order (inbox.OrderAdmin)", st)
	}
	return o
}

// orderKey returns an order key no other subtest or run uses.
func orderKey(t *testing.T) string {
	t.Helper()
	return newKey(t, "order")
}

// failHead claims head with orderKey and fails it with opts (orderKey
// set), so that head heads the order key.
func failHead(t *testing.T, st inbox.LeaseStore, head, orderKey string, opts inbox.FailOptions) inbox.Claim {
	t.Helper()
	c := mustBegin(t, st, head, inbox.BeginOptions{Lease: longLease, OrderKey: orderKey}, inbox.Acquired)
	opts.OrderKey = orderKey
	if err := st.Fail(ctxT(t), head, c.LeaseID, opts); err != nil {
		t.Fatalf("Fail(%q) with OrderKey: %v", head, err)
	}
	return c
}

// mustBehind claims key with orderKey and wants Behind, without a record
// of key made.
func mustBehind(t *testing.T, st inbox.LeaseStore, key, orderKey string) inbox.Claim {
	t.Helper()
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, OrderKey: orderKey}, inbox.Behind)
	if c.LeaseID != "" || c.Attempts != 0 {
		t.Fatalf("Behind claim of %q: %+v; want no lease id, no attempts", key, c)
	}
	if r := mustGet(t, st, key); r.State != inbox.StateNotFound {
		t.Fatalf("a Behind claim made a record of %q: %+v", key, r)
	}
	return c
}

// wantOrder wants Order(orderKey) to be head and waiting.
func wantOrder(t *testing.T, o inbox.OrderAdmin, orderKey, head string, waiting ...string) {
	t.Helper()
	g, err := o.Order(ctxT(t), orderKey)
	if err != nil {
		t.Fatalf("Order: %v", err)
	}
	if g.Head != head || !slices.Equal(g.Waiting, waiting) {
		t.Fatalf("Order = head %q waiting %q; want head %q waiting %q", g.Head, g.Waiting, head, waiting)
	}
}

// testOrderNoGate claims with an order key nothing waits on: the claims
// are those without one.
func (s *suite) testOrderNoGate(t *testing.T) {
	st := s.store(t)
	o := s.orderer(t, st)
	ok := orderKey(t)
	wantOrder(t, o, ok, "")
	key := newKey(t, "free")
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, OrderKey: ok}, inbox.Acquired)
	mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease, OrderKey: ok}, inbox.Busy)
	if err := st.Complete(ctxT(t), key, c.LeaseID); err != nil {
		t.Fatal(err)
	}
	mustBegin(t, st, key, inbox.BeginOptions{OrderKey: ok}, inbox.Processed)
	other := newKey(t, "free-2")
	c = mustBegin(t, st, other, inbox.BeginOptions{Lease: longLease, OrderKey: ok}, inbox.Acquired)
	if err := st.Release(ctxT(t), other, c.LeaseID); err != nil {
		t.Fatal(err)
	}
	wantOrder(t, o, ok, "")
}

// testOrderBehindInArrivalOrder fails a key with an order key and a
// backoff: later keys are Behind with the backoff's time left, without a
// record, each once in the order of its first arrival; the head itself
// is Busy, backing off.
func (s *suite) testOrderBehindInArrivalOrder(t *testing.T) {
	st := s.store(t)
	o := s.orderer(t, st)
	ok := orderKey(t)
	head := newKey(t, "head")
	failHead(t, st, head, ok, inbox.FailOptions{RetryAfter: longLease, Reason: "boom"})
	wantOrder(t, o, ok, head)
	a, b, c := newKey(t, "a"), newKey(t, "b"), newKey(t, "c")
	for _, k := range []string{a, b, a, c, b} {
		cl := mustBehind(t, st, k, ok)
		if cl.RetryAfter <= longLease/2 || cl.RetryAfter > longLease+s.h.TimePrecision {
			t.Fatalf("Behind a key backing off %s: RetryAfter %s, want in (%s, %s]", longLease, cl.RetryAfter, longLease/2, longLease)
		}
	}
	wantOrder(t, o, ok, head, a, b, c)
	if cl := mustBegin(t, st, head, inbox.BeginOptions{Lease: longLease, OrderKey: ok}, inbox.Busy); !cl.BackingOff {
		t.Fatalf("the head's claim in its backoff: %+v; want Busy, BackingOff", cl)
	}
	wantOrder(t, o, ok, head, a, b, c)
}

// testOrderProcessedHeadLetsNextRun fails a key with a short backoff:
// once it is processed, the first waiting key acquires and the next is
// still Behind, and so on until the order key has no gate.
func (s *suite) testOrderProcessedHeadLetsNextRun(t *testing.T) {
	st := s.store(t)
	o := s.orderer(t, st)
	ok := orderKey(t)
	head, a, b := newKey(t, "head"), newKey(t, "a"), newKey(t, "b")
	failHead(t, st, head, ok, inbox.FailOptions{RetryAfter: s.h.Lease})
	mustBehind(t, st, a, ok)
	mustBehind(t, st, b, ok)
	var hc inbox.Claim
	pollUntil(t, expireDeadline(s.h.Lease), "the head's backoff to end", func() bool {
		var err error
		hc, err = st.TryBegin(ctxT(t), head, inbox.BeginOptions{Lease: longLease, OrderKey: ok})
		if err != nil {
			t.Fatalf("TryBegin of the head: %v", err)
		}
		if hc.Status != inbox.Busy && hc.Status != inbox.Acquired {
			t.Fatalf("TryBegin of the head = %v, want Busy then Acquired", hc.Status)
		}
		return hc.Status == inbox.Acquired
	})
	// The head runs: nothing says when it ends.
	if cl := mustBehind(t, st, a, ok); cl.RetryAfter != 0 {
		t.Fatalf("Behind a running key: RetryAfter %s, want 0", cl.RetryAfter)
	}
	if err := st.Complete(ctxT(t), head, hc.LeaseID); err != nil {
		t.Fatal(err)
	}
	ca := mustBegin(t, st, a, inbox.BeginOptions{Lease: longLease, OrderKey: ok}, inbox.Acquired)
	if ca.Attempts != 1 {
		t.Fatalf("the first waiting key's claim: Attempts %d, want 1", ca.Attempts)
	}
	mustBehind(t, st, b, ok)
	wantOrder(t, o, ok, a, b)
	if err := st.Complete(ctxT(t), a, ca.LeaseID); err != nil {
		t.Fatal(err)
	}
	wantOrder(t, o, ok, b)
	cb := mustBegin(t, st, b, inbox.BeginOptions{Lease: longLease, OrderKey: ok}, inbox.Acquired)
	if err := st.Complete(ctxT(t), b, cb.LeaseID); err != nil {
		t.Fatal(err)
	}
	wantOrder(t, o, ok, "")
	mustBegin(t, st, newKey(t, "later"), inbox.BeginOptions{Lease: longLease, OrderKey: ok}, inbox.Acquired)
}

// testOrderProcessedKeyAnswersProcessed claims, behind a failed key,
// keys that are processed already (a duplicate): they answer Processed
// and take no place; a waiting key processed meanwhile is passed over.
func (s *suite) testOrderProcessedKeyAnswersProcessed(t *testing.T) {
	st := s.store(t)
	o := s.orderer(t, st)
	ok := orderKey(t)
	done := newKey(t, "done")
	c := mustBegin(t, st, done, inbox.BeginOptions{Lease: longLease, OrderKey: ok}, inbox.Acquired)
	if err := st.Complete(ctxT(t), done, c.LeaseID); err != nil {
		t.Fatal(err)
	}
	head, a, b := newKey(t, "head"), newKey(t, "a"), newKey(t, "b")
	failHead(t, st, head, ok, inbox.FailOptions{})
	mustBegin(t, st, done, inbox.BeginOptions{OrderKey: ok}, inbox.Processed)
	mustBehind(t, st, a, ok)
	mustBehind(t, st, b, ok)
	if err := st.MarkProcessed(ctxT(t), a); err != nil {
		t.Fatal(err)
	}
	mustBegin(t, st, a, inbox.BeginOptions{OrderKey: ok}, inbox.Processed)
	wantOrder(t, o, ok, head, a, b)
	hc := mustBegin(t, st, head, inbox.BeginOptions{Lease: longLease, OrderKey: ok}, inbox.Acquired)
	if err := st.Complete(ctxT(t), head, hc.LeaseID); err != nil {
		t.Fatal(err)
	}
	wantOrder(t, o, ok, b)
	mustBegin(t, st, b, inbox.BeginOptions{Lease: longLease, OrderKey: ok}, inbox.Acquired)
}

// testOrderDeadHeadUntilReleased fails a key dead with an order key: the
// later keys wait until an operator releases it, and only the head can
// be released.
func (s *suite) testOrderDeadHeadUntilReleased(t *testing.T) {
	st := s.store(t)
	o := s.orderer(t, st)
	ok := orderKey(t)
	head, a, b := newKey(t, "head"), newKey(t, "a"), newKey(t, "b")
	failHead(t, st, head, ok, inbox.FailOptions{Dead: true, Reason: "poison"})
	if cl := mustBehind(t, st, a, ok); cl.RetryAfter != 0 {
		t.Fatalf("Behind a dead key: RetryAfter %s, want 0", cl.RetryAfter)
	}
	mustBehind(t, st, b, ok)
	mustBegin(t, st, head, inbox.BeginOptions{OrderKey: ok}, inbox.Dead)
	mustBehind(t, st, a, ok)
	for _, h := range []string{a, newKey(t, "stranger")} {
		wantErr(t, fmt.Sprintf("ReleaseOrder past %q, not the head", h), o.ReleaseOrder(ctxT(t), ok, h), inbox.ErrLeaseLost)
	}
	wantErr(t, "ReleaseOrder of an order key without a gate", o.ReleaseOrder(ctxT(t), orderKey(t), head), inbox.ErrLeaseLost)
	wantOrder(t, o, ok, head, a, b)
	if err := o.ReleaseOrder(ctxT(t), ok, head); err != nil {
		t.Fatalf("ReleaseOrder past the dead head: %v", err)
	}
	wantErr(t, "ReleaseOrder past the head released", o.ReleaseOrder(ctxT(t), ok, head), inbox.ErrLeaseLost)
	wantOrder(t, o, ok, a, b)
	mustBegin(t, st, head, inbox.BeginOptions{OrderKey: ok}, inbox.Dead)
	mustBegin(t, st, a, inbox.BeginOptions{Lease: longLease, OrderKey: ok}, inbox.Acquired)
	mustBehind(t, st, b, ok)
}

// testOrderBadOrderKey makes calls with order keys that are not valid
// keys: each is refused with ErrInvalidArgument, and nothing changes.
func (s *suite) testOrderBadOrderKey(t *testing.T) {
	st := s.store(t)
	o := s.orderer(t, st)
	key := newKey(t, "bad-order")
	held := newKey(t, "bad-order-held")
	c := mustBegin(t, st, held, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	before := mustGet(t, st, held)
	for what, bad := range map[string]string{
		"over MaxKeyLen":   strings.Repeat("o", inbox.MaxKeyLen+1),
		"of invalid UTF-8": "order\xff",
		"holding a NUL":    "order\x00",
	} {
		_, err := st.TryBegin(ctxT(t), key, inbox.BeginOptions{OrderKey: bad})
		wantErr(t, "TryBegin with an OrderKey "+what, err, inbox.ErrInvalidArgument)
		err = st.Fail(ctxT(t), held, c.LeaseID, inbox.FailOptions{OrderKey: bad})
		wantErr(t, "Fail with an OrderKey "+what, err, inbox.ErrInvalidArgument)
		_, err = o.Order(ctxT(t), bad)
		wantErr(t, "Order of an order key "+what, err, inbox.ErrInvalidArgument)
		wantErr(t, "ReleaseOrder of an order key "+what, o.ReleaseOrder(ctxT(t), bad, held), inbox.ErrInvalidArgument)
	}
	_, err := o.Order(ctxT(t), "")
	wantErr(t, "Order of an empty order key", err, inbox.ErrInvalidArgument)
	wantErr(t, "ReleaseOrder past an empty head", o.ReleaseOrder(ctxT(t), orderKey(t), ""), inbox.ErrInvalidArgument)
	if r := mustGet(t, st, key); r.State != inbox.StateNotFound {
		t.Fatalf("refused claims made a record: %+v", r)
	}
	if after := mustGet(t, st, held); !s.sameRecord(after, before) {
		t.Fatalf("refused Fails changed the record: %+v, was %+v", after, before)
	}
}

// testOrderConcurrentBehind claims many keys at once (each twice) behind
// one failed key: every claim is Behind, and the order key holds each
// key once.
func (s *suite) testOrderConcurrentBehind(t *testing.T) {
	if s.h.NotAtomic != "" {
		t.Skip(s.h.NotAtomic)
	}
	st := s.store(t)
	o := s.orderer(t, st)
	ok := orderKey(t)
	head := newKey(t, "head")
	failHead(t, st, head, ok, inbox.FailOptions{RetryAfter: longLease})
	ctx := ctxT(t)
	keys := make([]string, racers/2)
	for i := range keys {
		keys[i] = newKey(t, fmt.Sprint("racer-", i))
	}
	claims := make([]inbox.Claim, racers)
	errs := make([]error, racers)
	fns := make([]func(), racers)
	for i := range fns {
		fns[i] = func() {
			claims[i], errs[i] = st.TryBegin(ctx, keys[i%len(keys)], inbox.BeginOptions{Lease: longLease, OrderKey: ok})
		}
	}
	together(fns...)
	for i, c := range claims {
		if errs[i] != nil {
			t.Fatalf("racer %d: TryBegin: %v", i, errs[i])
		}
		if c.Status != inbox.Behind || c.LeaseID != "" || c.RetryAfter <= 0 {
			t.Fatalf("racer %d: %+v; want Behind the key backing off, no lease id", i, c)
		}
	}
	g, err := o.Order(ctx, ok)
	if err != nil {
		t.Fatal(err)
	}
	got := slices.Sorted(slices.Values(g.Waiting))
	if g.Head != head || !slices.Equal(got, slices.Sorted(slices.Values(keys))) {
		t.Fatalf("Order = head %q, %d waiting %q; want head %q and each of the %d keys once", g.Head, len(g.Waiting), g.Waiting, head, len(keys))
	}
	for _, k := range keys {
		if r := mustGet(t, st, k); r.State != inbox.StateNotFound {
			t.Fatalf("a Behind claim made a record of %q: %+v", k, r)
		}
	}
}

// testOrderNotKept checks a store that keeps no order: a TryBegin or a
// Fail with an OrderKey fails with ErrNotSupported and changes nothing,
// and so do Order and ReleaseOrder where the store has them.
func (s *suite) testOrderNotKept(t *testing.T) {
	st := s.store(t)
	o, isOrderer := st.(inbox.OrderAdmin)
	if isOrderer && o.KeepsOrder() {
		t.Skip("the store keeps order: the Order_ cases check it")
	}
	ok := orderKey(t)
	key := newKey(t, "no-order")
	_, err := st.TryBegin(ctxT(t), key, inbox.BeginOptions{Lease: longLease, OrderKey: ok})
	wantErr(t, "TryBegin with an OrderKey", err, inbox.ErrNotSupported)
	if r := mustGet(t, st, key); r.State != inbox.StateNotFound {
		t.Fatalf("a refused claim made a record: %+v", r)
	}
	if !isOrderer {
		return
	}
	c := mustBegin(t, st, key, inbox.BeginOptions{Lease: longLease}, inbox.Acquired)
	before := mustGet(t, st, key)
	wantErr(t, "Fail with an OrderKey", st.Fail(ctxT(t), key, c.LeaseID, inbox.FailOptions{OrderKey: ok}), inbox.ErrNotSupported)
	if after := mustGet(t, st, key); !s.sameRecord(after, before) {
		t.Fatalf("a refused Fail changed the record: %+v, was %+v", after, before)
	}
	_, err = o.Order(ctxT(t), ok)
	wantErr(t, "Order", err, inbox.ErrNotSupported)
	wantErr(t, "ReleaseOrder", o.ReleaseOrder(ctxT(t), ok, key), inbox.ErrNotSupported)
	if err := st.Release(ctxT(t), key, c.LeaseID); err != nil {
		t.Fatal(err)
	}
}
