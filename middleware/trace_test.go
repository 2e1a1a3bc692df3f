package inboxmw_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/middleware"
)

// step is one Tracer.Step call.
type step struct {
	name, key string
	outcome   inboxmw.Outcome
	err       error
}

// stepRecorder is a Tracer that records every step.
type stepRecorder struct {
	mu    sync.Mutex
	steps []step
}

func (r *stepRecorder) Step(_ context.Context, name, key string, _ time.Time, o inboxmw.Outcome, _ int, err error) {
	r.mu.Lock()
	r.steps = append(r.steps, step{name, key, o, err})
	r.mu.Unlock()
}

// count returns how many steps named name were recorded for key, and how
// many of them failed.
func (r *stepRecorder) count(name, key string) (n, failed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.steps {
		if s.name == name && s.key == key {
			n++
			if s.err != nil {
				failed++
			}
		}
	}
	return n, failed
}

// failFirstBegins fails the first n TryBegins with ErrStoreUnavailable.
type failFirstBegins struct {
	inbox.LeaseStore
	n atomic.Int32
}

func (f *failFirstBegins) TryBegin(ctx context.Context, key string, o inbox.BeginOptions) (inbox.Claim, error) {
	if f.n.Add(-1) >= 0 {
		return inbox.Claim{}, errDown
	}
	return f.LeaseStore.TryBegin(ctx, key, o)
}

// Every store call is a step of the Tracer (README: "records the claim and
// each store call as spans"): a TryBegin retried after a failure is two,
// each heartbeat's Extend one, and a TxStore's BeginTx and commit one each.
func TestTracer_traces_every_store_call(t *testing.T) {
	t.Parallel()
	tr := &stepRecorder{}
	store := &failFirstBegins{LeaseStore: newMemory(t)}
	store.n.Store(1)
	ib := newInbox(t, inboxmw.Config{Store: store, Alias: staticAlias(), Tracer: tr,
		Lease: 300 * time.Millisecond, HeartbeatInterval: 30 * time.Millisecond})
	key := testKeyPrefix + "traced"
	msg := msgFor("traced")
	_, err := call(ib, func(m *message.Message) ([]*message.Message, error) {
		// Run until the heartbeat has extended the lease twice.
		testenv.Eventually(t, 10*time.Second, "two heartbeats traced", func() bool {
			n, _ := tr.count(inboxmw.OpExtend, key)
			return n >= 2
		})
		return nil, nil
	}, msg)
	if err != nil {
		t.Fatal(err)
	}
	msg.Ack()
	testenv.Eventually(t, 10*time.Second, "the Complete traced", func() bool {
		n, _ := tr.count(inboxmw.OpComplete, key)
		return n == 1
	})
	if n, failed := tr.count(inboxmw.OpTryBegin, key); n != 2 || failed != 1 {
		t.Errorf("try_begin steps %d (%d failed), want 2: the failed one and its retry", n, failed)
	}
	if n, _ := tr.count("claim", key); n != 1 {
		t.Errorf("claim steps %d, want 1", n)
	}

	txTr := &stepRecorder{}
	tx := &scriptedTx{plainStore: plainStore{newMemory(t)}}
	txIb := newInbox(t, inboxmw.Config{Store: tx, Alias: staticAlias(), Tracer: txTr})
	if _, err := call(txIb, ok, msgFor("tx-traced")); err != nil {
		t.Fatal(err)
	}
	txKey := testKeyPrefix + "tx-traced"
	for _, op := range []string{inboxmw.OpTryBegin, inboxmw.OpComplete} {
		if n, failed := txTr.count(op, txKey); n != 1 || failed != 0 {
			t.Errorf("TxStore: %s steps %d (%d failed), want 1", op, n, failed)
		}
	}
}
