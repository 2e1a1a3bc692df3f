package inboxmw_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// MaxAttempts counts attempts, the key's lease acquisitions, not handler
// failures (Config.MaxAttempts, README "What happens when"): with
// MaxAttempts 3, a delivery whose handler succeeded but whose message the
// router nacked, then a delivery refused under PayloadHashReject, each use
// one, and the first handler failure, on the third attempt, marks the key
// dead. (Issue 30: the README said "Dead after n failed attempts".) Only
// the public API: the router's verdict is the message's Ack or Nack, as
// the router gives it after the middleware returns.
func TestMaxAttempts_counts_lease_acquisitions_not_failures(t *testing.T) {
	t.Parallel()
	store, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	ib, err := inboxmw.New(inboxmw.Config{
		Store: store, Bus: "test", Group: "attempts", Alias: keying.StaticAlias("charge"),
		MaxAttempts: 3,
		PayloadHash: inboxmw.PayloadHashReject,
		Backoff:     inboxmw.ExponentialBackoff(0, 0), // no backoff: each delivery may claim at once
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = ib.Close(ctx)
	})
	key := keying.Key{Bus: "test", Group: "attempts", Alias: "charge", ID: "order-1"}.String()
	deliver := func(payload string) *message.Message {
		m := message.NewMessage(watermill.NewUUID(), []byte(payload))
		m.Metadata.Set(keying.DefaultIDMetadataKey, "order-1")
		m.SetContext(context.Background())
		return m
	}
	// waitAvailable polls until the key's lease was given back with the
	// attempts counted so far.
	waitAvailable := func(attempts int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			r, err := store.Get(context.Background(), key)
			if err != nil {
				t.Fatal(err)
			}
			if r.State == inbox.StateAvailable && r.Attempts == attempts {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("record %+v after 20 s, want it available after %d attempts", r, attempts)
			}
			time.Sleep(5 * time.Millisecond) // polling the store, not synchronising
		}
	}
	runs := 0
	errCharge := errors.New("payment gateway timeout")

	// 1: the handler succeeds and returns a message, which the router
	// fails to publish, so it nacks: the lease is released unmarked.
	m := deliver("a")
	charged := func(*message.Message) ([]*message.Message, error) {
		runs++
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("charged"))}, nil
	}
	if _, err := ib.Middleware(charged)(m); err != nil {
		t.Fatalf("delivery 1: %v", err)
	}
	m.Nack()
	waitAvailable(1)

	// 2: the same key with other content, refused: the handler does not run.
	_, err = ib.Middleware(func(*message.Message) ([]*message.Message, error) { runs++; return nil, nil })(deliver("b"))
	if !errors.Is(err, inbox.ErrPayloadMismatch) {
		t.Fatalf("delivery 2, other content: %v, want ErrPayloadMismatch", err)
	}
	waitAvailable(2)

	// 3: the first handler failure, on the third attempt: dead.
	_, err = ib.Middleware(func(*message.Message) ([]*message.Message, error) { runs++; return nil, errCharge })(deliver("a"))
	var de *inbox.DeadError
	if !errors.As(err, &de) || !errors.Is(err, errCharge) || de.Attempts != 3 {
		t.Fatalf("delivery 3, the handler's first failure: %v, want a DeadError after 3 attempts wrapping it", err)
	}
	if r, err := store.Get(context.Background(), key); err != nil || r.State != inbox.StateDead || r.Attempts != 3 {
		t.Fatalf("record %+v, %v; want dead after 3 attempts", r, err)
	}
	if runs != 2 {
		t.Fatalf("the handler ran %d times, want 2 (a success, then the one failure)", runs)
	}
}
