package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/faultproxy"
	"github.com/watermill-inbox/inbox/stores/driver"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
	"github.com/watermill-inbox/inbox/stores/redis/internal/redistest"
)

// An outcome of one operation of a batch: the claim's status for a claim
// ("BackingOff" for Busy in a backoff), "ok" or "lost" (ErrLeaseLost) for
// the others.
type outcome string

func outcomeOf(op driver.Op, c inbox.Claim, err error) outcome {
	switch {
	case errors.Is(err, inbox.ErrLeaseLost):
		return "lost"
	case err != nil:
		return outcome("error: " + err.Error())
	case op.Kind == driver.Claim && c.Status == inbox.Busy && c.BackingOff:
		return "BackingOff"
	case op.Kind == driver.Claim:
		return outcome(c.Status.String())
	}
	return "ok"
}

func claimOp(key, lease string) driver.Op {
	return driver.Op{Kind: driver.Claim, Key: key, LeaseID: lease, Lease: time.Minute}
}

func holderOp(kind driver.Kind, key, lease string) driver.Op {
	return driver.Op{Kind: kind, Key: key, LeaseID: lease}
}

func failOp(key, lease string, opts inbox.FailOptions) driver.Op {
	return driver.Op{Kind: driver.Fail, Key: key, LeaseID: lease, Failure: opts}
}

// batchOrderCases are batches whose operations on one key must take effect
// in their order: before runs first, alone; then batch, as one Apply.
var batchOrderCases = []struct {
	name   string
	before []driver.Op
	batch  []driver.Op
	want   []outcome
	state  inbox.State // of key k after the batch
}{
	{"claim then release", nil,
		[]driver.Op{claimOp("k", "a"), holderOp(driver.Release, "k", "a")},
		[]outcome{"Acquired", "ok"}, inbox.StateAvailable},
	{"release then another's claim", []driver.Op{claimOp("k", "a")},
		[]driver.Op{holderOp(driver.Release, "k", "a"), claimOp("k", "b")},
		[]outcome{"ok", "Acquired"}, inbox.StateInProgress},
	// The claim finds the key held (SET NX fails): it must not be sent after
	// the Release that follows it.
	{"claim of a held key then the holder's release", []driver.Op{claimOp("k", "a")},
		[]driver.Op{claimOp("k", "b"), holderOp(driver.Release, "k", "a")},
		[]outcome{"Busy", "ok"}, inbox.StateAvailable},
	{"two claims of a new key", nil,
		[]driver.Op{claimOp("k", "a"), claimOp("k", "b")},
		[]outcome{"Acquired", "Busy"}, inbox.StateInProgress},
	{"complete then a duplicate's claim", []driver.Op{claimOp("k", "a")},
		[]driver.Op{holderOp(driver.Complete, "k", "a"), claimOp("k", "b")},
		[]outcome{"ok", "Processed"}, inbox.StateProcessed},
	{"claim, complete, a duplicate's claim", nil,
		[]driver.Op{claimOp("k", "a"), holderOp(driver.Complete, "k", "a"), claimOp("k", "b")},
		[]outcome{"Acquired", "ok", "Processed"}, inbox.StateProcessed},
	{"mark then claim", nil,
		[]driver.Op{{Kind: driver.Mark, Key: "k"}, claimOp("k", "a")},
		[]outcome{"ok", "Processed"}, inbox.StateProcessed},
	{"claim then mark", nil,
		[]driver.Op{claimOp("k", "a"), {Kind: driver.Mark, Key: "k"}, holderOp(driver.Complete, "k", "a")},
		[]outcome{"Acquired", "ok", "lost"}, inbox.StateProcessed},
	{"release twice", []driver.Op{claimOp("k", "a")},
		[]driver.Op{holderOp(driver.Release, "k", "a"), holderOp(driver.Release, "k", "a")},
		[]outcome{"ok", "lost"}, inbox.StateAvailable},
	// Other keys in the same batch go their own way: a new key's native
	// claim, a held key's claim in the second round trip, a Complete.
	{"mixed with other keys", []driver.Op{claimOp("held", "x"), claimOp("done", "y")},
		[]driver.Op{claimOp("new", "a"), holderOp(driver.Release, "k", "nobody"), claimOp("held", "b"),
			holderOp(driver.Complete, "done", "y"), claimOp("k", "c"), claimOp("k", "d")},
		[]outcome{"Acquired", "lost", "Busy", "ok", "Acquired", "Busy"}, inbox.StateInProgress},
	// Fail takes its place in the order like Release: a backoff makes the
	// claims after it Busy (BackingOff, the failed lease's included), dead
	// makes them Dead, and the failed lease is fenced off.
	{"claim then fail with a backoff", nil,
		[]driver.Op{claimOp("k", "a"), failOp("k", "a", inbox.FailOptions{RetryAfter: time.Minute}), claimOp("k", "a"), claimOp("k", "b")},
		[]outcome{"Acquired", "ok", "BackingOff", "BackingOff"}, inbox.StateAvailable},
	{"claims of a key in backoff", []driver.Op{claimOp("k", "a"), failOp("k", "a", inbox.FailOptions{RetryAfter: time.Minute})},
		[]driver.Op{claimOp("k", "a"), claimOp("k", "b"), claimOp("k", "c")},
		[]outcome{"BackingOff", "BackingOff", "BackingOff"}, inbox.StateAvailable},
	{"claim of a key in backoff alone, among other keys", []driver.Op{claimOp("k", "a"), failOp("k", "a", inbox.FailOptions{RetryAfter: time.Minute}), claimOp("held", "x")},
		[]driver.Op{claimOp("new", "n"), claimOp("k", "b"), claimOp("held", "y")},
		[]outcome{"Acquired", "BackingOff", "Busy"}, inbox.StateAvailable},
	{"fail without a backoff then another's claim", []driver.Op{claimOp("k", "a")},
		[]driver.Op{failOp("k", "a", inbox.FailOptions{Reason: "r"}), claimOp("k", "b")},
		[]outcome{"ok", "Acquired"}, inbox.StateInProgress},
	{"claim of a held key then the holder's dead fail", []driver.Op{claimOp("k", "a")},
		[]driver.Op{claimOp("k", "b"), failOp("k", "a", inbox.FailOptions{Dead: true}), claimOp("k", "c")},
		[]outcome{"Busy", "ok", "Dead"}, inbox.StateDead},
	{"fail then the failed lease's complete", []driver.Op{claimOp("k", "a")},
		[]driver.Op{failOp("k", "a", inbox.FailOptions{RetryAfter: time.Minute}), holderOp(driver.Complete, "k", "a"), failOp("k", "a", inbox.FailOptions{})},
		[]outcome{"ok", "lost", "lost"}, inbox.StateAvailable},
	{"complete then fail", nil,
		[]driver.Op{claimOp("k", "a"), holderOp(driver.Complete, "k", "a"), failOp("k", "a", inbox.FailOptions{Dead: true})},
		[]outcome{"Acquired", "ok", "lost"}, inbox.StateProcessed},
	{"dead then mark", []driver.Op{claimOp("k", "a")},
		[]driver.Op{failOp("k", "a", inbox.FailOptions{Dead: true}), {Kind: driver.Mark, Key: "k"}, claimOp("k", "b")},
		[]outcome{"ok", "ok", "Processed"}, inbox.StateProcessed},
	{"fail alone, among other keys", []driver.Op{claimOp("k", "a"), claimOp("held", "x")},
		[]driver.Op{claimOp("new", "n"), failOp("k", "a", inbox.FailOptions{Dead: true}), failOp("held", "y", inbox.FailOptions{})},
		[]outcome{"Acquired", "ok", "lost"}, inbox.StateDead},
	{"claim of a held key alone", []driver.Op{claimOp("k", "a")},
		[]driver.Op{claimOp("k", "b")},
		[]outcome{"Busy"}, inbox.StateInProgress},
}

// runBatchOrder runs batchOrderCases on c, calling flush (if not nil)
// before every batch.
func runBatchOrder(t *testing.T, c redis.UniversalClient, flush func()) {
	ctx := context.Background()
	for _, tc := range batchOrderCases {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c)})
			for _, op := range tc.before {
				if _, errs, err := redisstore.Apply(ctx, s, []driver.Op{op}); err != nil || errs[0] != nil {
					t.Fatalf("before: %+v: %v, %v", op, err, errs[0])
				}
			}
			if flush != nil {
				flush()
			}
			res, errs, err := redisstore.Apply(ctx, s, tc.batch)
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			var got []outcome
			for i, op := range tc.batch {
				got = append(got, outcomeOf(op, res[i], errs[i]))
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("outcomes %v, want %v", got, tc.want)
			}
			if r, err := s.Get(ctx, "k"); err != nil || r.State != tc.state {
				t.Fatalf("k after the batch: %+v, %v; want %v", r, err, tc.state)
			}
		})
	}
}

func TestApply_same_key_in_slice_order(t *testing.T) {
	t.Parallel()
	runBatchOrder(t, sharedClient(t), nil)
}

// The same on a server whose script cache is emptied before every batch:
// every script call of the batch answers NOSCRIPT and is sent again with
// EVAL, in its order.
func TestApply_same_key_in_slice_order_without_scripts(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	var log cmdLog
	c.AddHook(&log)
	runBatchOrder(t, c, func() {
		if err := c.ScriptFlush(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		log.take()
	})
	if got := log.take(); !strings.Contains(got, "eval ") && !strings.HasSuffix(got, "eval") {
		t.Fatalf("the last batch sent %q: no EVAL after NOSCRIPT", got)
	}
}

// A connection that fails fails every operation of the batch, whatever the
// round trip it belongs to.
func TestApply_connection_failure_fails_every_operation(t *testing.T) {
	t.Parallel()
	shared := sharedClient(t)
	p := faultproxy.New(t, shared.Options().Addr)
	o := proxiedOptions(t, p)
	o.MaxRetries = -1
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, shared), Timeout: 2 * time.Second})
	ctx := context.Background()
	if _, errs, err := redisstore.Apply(ctx, s, []driver.Op{claimOp("held", "a")}); err != nil || errs[0] != nil {
		t.Fatalf("claim before the cut: %v, %v", err, errs[0])
	}
	p.Cut()
	batch := []driver.Op{claimOp("new", "b"), claimOp("held", "c"), holderOp(driver.Complete, "held", "a"),
		holderOp(driver.Release, "other", "d"), {Kind: driver.Mark, Key: "m"}}
	_, errs, err := redisstore.Apply(ctx, s, batch)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	for i, e := range errs {
		var reply redis.Error
		if e == nil || errors.As(e, &reply) || !hasCause(e) {
			t.Errorf("%v of %s through a cut link: %v, want the network error", batch[i].Kind, batch[i].Key, e)
		}
	}
}

// A client closed under the store fails every call with ErrClosed.
func TestStore_client_closed_under_the_store(t *testing.T) {
	t.Parallel()
	shared := sharedClient(t)
	c := redis.NewClient(shared.Options())
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, shared)})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for op, err := range allOps(context.Background(), s, "k", "lease") {
		if !errors.Is(err, inbox.ErrClosed) || !strings.Contains(err.Error(), `redis store: `+op+` "k"`) {
			t.Errorf("%s with the client closed: %v, want ErrClosed naming the call", op, err)
		}
	}
}
