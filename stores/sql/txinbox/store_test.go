package txinbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/sql/txinbox"
)

// The store's side of inboxmw.TxStore, without the middleware.

func (e *txEnv) txStore(t testing.TB, cfg txinbox.Config) *txinbox.Store {
	t.Helper()
	cfg.DB, cfg.Dialect = e.db, e.b.dialect
	if cfg.Table == "" {
		cfg.Table = e.table
	}
	s, err := txinbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// insertEffect writes an effect row through the transaction of ctx.
func (e *txEnv) insertEffect(ctx context.Context, id string) error {
	tx, ok := txinbox.TxFromContext(ctx)
	if !ok {
		return errors.New("no transaction in the claim's context")
	}
	_, err := tx.ExecContext(ctx, "INSERT INTO "+e.effects+" (msg_id, note) VALUES ("+ph(e.b.dialect, 1)+", "+ph(e.b.dialect, 2)+")", id, "direct")
	return err
}

func TestBeginTx_claim_finish_processed(t *testing.T) {
	forTx(t, func(t *testing.T, e *txEnv) {
		s := e.txStore(t, txinbox.Config{})
		ctx := ctxT(t)
		key, id := "test:group:handler:direct-1", watermill.NewUUID()

		c, err := s.BeginTx(ctx, key)
		if err != nil || c.Status != inbox.Acquired || c.Context == nil || c.Finish == nil {
			t.Fatalf("BeginTx of a new key: %+v, %v; want Acquired with Context and Finish", c, err)
		}
		if _, ok := txinbox.TxFromContext(ctx); ok {
			t.Fatal("the caller's context got the transaction; only the claim's should")
		}
		if err := e.insertEffect(c.Context, id); err != nil {
			t.Fatal(err)
		}
		if err := c.Finish(nil, nil); err != nil {
			t.Fatalf("Finish: %v", err)
		}
		if err := c.Finish(nil, nil); err == nil {
			t.Fatal("a second Finish succeeded; want an error")
		}
		if ok, err := s.IsProcessed(ctx, key); err != nil || !ok {
			t.Fatalf("IsProcessed after the commit: %v, %v", ok, err)
		}
		if n := e.effectCount(t, id); n != 1 {
			t.Fatalf("%d effect rows after the commit, want 1", n)
		}
		c, err = s.BeginTx(ctx, key)
		if err != nil || c.Status != inbox.Processed || c.Context != nil || c.Finish != nil {
			t.Fatalf("BeginTx of a processed key: %+v, %v; want Processed without Context and Finish", c, err)
		}

		// MarkProcessed outside a transaction: BeginTx sees it.
		marked := "test:group:handler:marked"
		if err := s.MarkProcessed(ctx, marked); err != nil {
			t.Fatal(err)
		}
		if c, err := s.BeginTx(ctx, marked); err != nil || c.Status != inbox.Processed {
			t.Fatalf("BeginTx after MarkProcessed: %+v, %v", c, err)
		}
	})
}

func TestBeginTx_finish_with_an_error_rolls_back_and_returns_it(t *testing.T) {
	forTx(t, func(t *testing.T, e *txEnv) {
		s := e.txStore(t, txinbox.Config{})
		ctx := ctxT(t)
		key, id := "test:group:handler:direct-2", watermill.NewUUID()
		c, err := s.BeginTx(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.insertEffect(c.Context, id); err != nil {
			t.Fatal(err)
		}
		boom := errors.New("boom")
		if err := c.Finish([]*message.Message{message.NewMessage("m", nil)}, boom); err != boom {
			t.Fatalf("Finish(out, boom) = %v, want boom itself", err)
		}
		if n := e.effectCount(t, id); n != 0 {
			t.Fatalf("%d effect rows after Finish with an error, want 0", n)
		}
		if r, err := e.store.Get(ctx, key); err != nil || r.State != inbox.StateNotFound {
			t.Fatalf("key after Finish with an error: %+v, %v; want NotFound", r, err)
		}
		// Returned messages without an outbox: refused, rolled back.
		c, err = s.BeginTx(ctx, key)
		if err != nil || c.Status != inbox.Acquired {
			t.Fatalf("BeginTx after the rollback: %+v, %v; want Acquired", c, err)
		}
		err = c.Finish([]*message.Message{message.NewMessage("m1", nil), message.NewMessage("m2", nil)}, nil)
		if !errors.Is(err, txinbox.ErrMessagesReturned) || !strings.Contains(err.Error(), "2 message(s)") || !strings.Contains(err.Error(), "rolled back") {
			t.Fatalf("Finish with messages and no outbox: %v; want ErrMessagesReturned saying how many and that it rolled back", err)
		}
		if ok, _ := s.IsProcessed(ctx, key); ok {
			t.Fatal("key processed after the refusal")
		}
	})
}

// A message without a key gets a transaction without a claim.
func TestBeginTx_empty_key_begins_a_transaction_without_a_claim(t *testing.T) {
	forTx(t, func(t *testing.T, e *txEnv) {
		s := e.txStore(t, txinbox.Config{})
		ctx := ctxT(t)
		id := watermill.NewUUID()
		c, err := s.BeginTx(ctx, "")
		if err != nil || c.Status != inbox.Acquired {
			t.Fatalf("BeginTx(\"\"): %+v, %v; want Acquired", c, err)
		}
		if err := e.insertEffect(c.Context, id); err != nil {
			t.Fatal(err)
		}
		if err := c.Finish(nil, nil); err != nil {
			t.Fatal(err)
		}
		if n := e.effectCount(t, id); n != 1 {
			t.Fatalf("%d effect rows, want 1", n)
		}
		if n := countRows(t, e.db, e.table, "1 = 1"); n != 0 {
			t.Fatalf("%d inbox rows after a transaction without a key, want 0", n)
		}
	})
}

// A live lease of the lease store on the same table is Busy, with its time
// left; an ended one is taken over.
func TestBeginTx_key_leased_by_the_lease_store(t *testing.T) {
	forTx(t, func(t *testing.T, e *txEnv) {
		s := e.txStore(t, txinbox.Config{})
		ctx := ctxT(t)
		key := "test:group:handler:leased"
		lc, err := e.store.TryBegin(ctx, key, inbox.BeginOptions{Lease: time.Minute})
		if err != nil || lc.Status != inbox.Acquired {
			t.Fatalf("TryBegin: %+v, %v", lc, err)
		}
		_, err = s.BeginTx(ctx, key)
		var busy *inbox.BusyError
		if !errors.As(err, &busy) || busy.Key != key || busy.RetryAfter <= 0 || busy.RetryAfter > time.Minute {
			t.Fatalf("BeginTx of a leased key: %v; want a BusyError with the lease's time left", err)
		}
		if err := e.store.Release(ctx, key, lc.LeaseID); err != nil {
			t.Fatal(err)
		}
		c, err := s.BeginTx(ctx, key)
		if err != nil || c.Status != inbox.Acquired {
			t.Fatalf("BeginTx of a released key: %+v, %v; want Acquired", c, err)
		}
		if err := c.Finish(nil, nil); err != nil {
			t.Fatal(err)
		}
		if r, err := e.store.Get(ctx, key); err != nil || r.State != inbox.StateProcessed {
			t.Fatalf("record after the commit: %+v, %v; want Processed", r, err)
		}
	})
}

func TestBeginTx_errors(t *testing.T) {
	forTx(t, func(t *testing.T, e *txEnv) {
		ctx := ctxT(t)
		s := e.txStore(t, txinbox.Config{})
		if _, err := s.BeginTx(ctx, strings.Repeat("k", 2000)); !errors.Is(err, inbox.ErrInvalidArgument) {
			t.Errorf("BeginTx of an over-long key: %v, want ErrInvalidArgument", err)
		}

		missing := e.txStore(t, txinbox.Config{Table: "txinbox_no_such_table"})
		c, err := missing.BeginTx(ctx, "test:group:handler:x")
		if c.Finish != nil {
			_ = c.Finish(nil, errors.New("unexpected claim"))
		}
		if !errors.Is(err, inbox.ErrStoreUnavailable) || !strings.Contains(err.Error(), "Migrate") {
			t.Errorf("BeginTx on a missing table: %v, want ErrStoreUnavailable saying to migrate", err)
		}

		canceled, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := s.BeginTx(canceled, "test:group:handler:y"); !errors.Is(err, context.Canceled) {
			t.Errorf("BeginTx with a canceled context: %v, want context.Canceled", err)
		}

		_ = s.Close()
		if _, err := s.BeginTx(ctx, "test:group:handler:z"); !errors.Is(err, inbox.ErrClosed) {
			t.Errorf("BeginTx after Close: %v, want ErrClosed", err)
		}
		if _, err := s.IsProcessed(ctx, "test:group:handler:z"); !errors.Is(err, inbox.ErrClosed) {
			t.Errorf("IsProcessed after Close: %v, want ErrClosed", err)
		}
	})
}

// The outbox gets the claim's context, with the transaction in it.
func TestBeginTx_outbox_gets_the_transaction(t *testing.T) {
	forTx(t, func(t *testing.T, e *txEnv) {
		ctx := ctxT(t)
		var got []string
		s := e.txStore(t, txinbox.Config{Outbox: func(octx context.Context, tx *sql.Tx, msgs []*message.Message) error {
			if ctxTx, ok := txinbox.TxFromContext(octx); !ok || ctxTx != tx {
				return errors.New("the outbox's context does not hold its transaction")
			}
			for _, m := range msgs {
				got = append(got, m.UUID)
			}
			return nil
		}})
		c, err := s.BeginTx(ctx, "test:group:handler:outbox")
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Finish([]*message.Message{message.NewMessage("out-1", nil)}, nil); err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0] != "out-1" {
			t.Fatalf("outbox got %v, want [out-1]", got)
		}
	})
}
