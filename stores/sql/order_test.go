package sqlstore_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	inboxdriver "github.com/watermill-inbox/inbox/stores/driver"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
)

// Only PostgreSQL keeps the order of order keys; the others refuse them
// (the conformance suite checks how).
func TestOrder_kept_on_PostgreSQL_only(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			s := newStore(t, b, db, newTable(t, db, b.dialect), sqlstore.Options{})
			if got, want := s.KeepsOrder(), b.dialect == sqlstore.Postgres; got != want {
				t.Fatalf("KeepsOrder() = %v, want %v", got, want)
			}
		})
	}
}

// A batch that mixes ops with and without an order key applies them in
// slice order: a Release between two claims of one key with an order key
// lets the second acquire, and a Fail with an order key opens the gate
// that a later claim of the batch waits behind.
func TestOrder_mixed_batch_keeps_call_order(t *testing.T) {
	t.Parallel()
	b := backends[0]
	db := b.open(t)
	s := newStore(t, b, db, newTable(t, db, b.dialect), sqlstore.Options{})
	ctx := ctxT(t)
	const ok = "order:mixed"
	claim := func(key, lease string) inboxdriver.Op {
		return inboxdriver.Op{Kind: inboxdriver.Claim, Key: key, LeaseID: lease, Lease: time.Minute, OrderKey: ok}
	}
	res, errs, err := sqlstore.Apply(ctx, s, []inboxdriver.Op{
		claim("k1", "l1"),
		{Kind: inboxdriver.Release, Key: "k1", LeaseID: "l1"},
		claim("k1", "l2"),
		{Kind: inboxdriver.Mark, Key: "m1"},
		{Kind: inboxdriver.Fail, Key: "k1", LeaseID: "l2", Failure: inbox.FailOptions{RetryAfter: time.Minute, OrderKey: ok}},
		claim("k2", "l3"),
		{Kind: inboxdriver.Claim, Key: "k3", LeaseID: "l4", Lease: time.Minute},
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("op %d: %v", i, e)
		}
	}
	want := []inbox.Status{inbox.Acquired, 0, inbox.Acquired, 0, 0, inbox.Behind, inbox.Acquired}
	for i, w := range want {
		if res[i].Status != w {
			t.Fatalf("op %d: %+v, want status %v", i, res[i], w)
		}
	}
	if res[5].RetryAfter <= 0 || res[5].RetryAfter > time.Minute {
		t.Fatalf("Behind the failed key: RetryAfter %s, want in (0, 1m]", res[5].RetryAfter)
	}
	g, err := s.Order(ctx, ok)
	if err != nil || g.Head != "k1" || len(g.Waiting) != 1 || g.Waiting[0] != "k2" {
		t.Fatalf("Order = %+v, %v; want head k1, waiting [k2]", g, err)
	}
}

// A table made without the gate table (by an earlier version): order keys
// fail with an error that names the missing table and says how to create
// it, the other calls work, and Migrate creates it.
func TestOrder_table_without_gate_table(t *testing.T) {
	t.Parallel()
	b := backends[0]
	db := b.open(t)
	table := newTable(t, db, b.dialect)
	if _, err := db.ExecContext(ctxT(t), "DROP TABLE "+table+"_order"); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, b, db, table, sqlstore.Options{})
	ctx := ctxT(t)
	c, err := s.TryBegin(ctx, "plain", inbox.BeginOptions{})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin without an order key: %+v, %v", c, err)
	}
	_, err = s.TryBegin(ctx, "ordered", inbox.BeginOptions{OrderKey: "o"})
	if !errors.Is(err, inbox.ErrStoreUnavailable) || !strings.Contains(err.Error(), table+"_order") || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("TryBegin with an order key and no gate table: %v; want ErrStoreUnavailable naming %s_order and Migrate", err, table)
	}
	if _, err := s.Order(ctx, "o"); !errors.Is(err, inbox.ErrStoreUnavailable) || !strings.Contains(err.Error(), table+"_order") {
		t.Fatalf("Order without a gate table: %v", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	c, err = s.TryBegin(ctx, "ordered", inbox.BeginOptions{OrderKey: "o"})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin with an order key after Migrate: %+v, %v", c, err)
	}
}

// Cleanup deletes the expired gates (a head that never came back) after the
// expired records, and leaves the live ones; a store whose gate table is
// missing cleans its records as before.
func TestOrder_cleanup_deletes_expired_gates(t *testing.T) {
	t.Parallel()
	b := backends[0]
	db := b.open(t)
	table := newTable(t, db, b.dialect)
	s := newStore(t, b, db, table, sqlstore.Options{DisableCleanup: true})
	ctx := ctxT(t)
	for _, o := range []string{"live", "stale"} {
		c, err := s.TryBegin(ctx, o+":head", inbox.BeginOptions{OrderKey: o})
		if err == nil {
			err = s.Fail(ctx, o+":head", c.LeaseID, inbox.FailOptions{OrderKey: o, RetryAfter: time.Hour})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	gates := table + "_order"
	if _, err := db.ExecContext(ctx, "UPDATE "+gates+" SET expires_at = clock_timestamp() - interval '1 second' WHERE order_key = 'stale'"); err != nil {
		t.Fatal(err)
	}
	n, err := s.Cleanup(ctx)
	if err != nil || n != 1 {
		t.Fatalf("Cleanup = %d, %v; want the 1 expired gate deleted", n, err)
	}
	if c := countRows(t, db, gates, "order_key = 'stale'"); c != 0 {
		t.Fatal("the expired gate is left after Cleanup")
	}
	if g, err := s.Order(ctx, "live"); err != nil || g.Head != "live:head" {
		t.Fatalf("Order(live) after Cleanup = %+v, %v; want its head kept", g, err)
	}
	if _, err := db.ExecContext(ctx, "DROP TABLE "+gates); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Cleanup(ctx); err != nil || n != 0 {
		t.Fatalf("Cleanup without a gate table = %d, %v; want 0, nil", n, err)
	}
}
