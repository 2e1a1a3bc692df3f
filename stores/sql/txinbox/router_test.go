package txinbox_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	inboxmw "github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/sql/txinbox"
)

// failingPublisher refuses every publish, as a broker that is down would.
type failingPublisher struct{ calls atomic.Int32 }

func (p *failingPublisher) Publish(string, ...*message.Message) error {
	p.calls.Add(1)
	return errors.New("broker down")
}
func (p *failingPublisher) Close() error { return nil }

// In a real router whose publisher fails, the messages a handler returns in
// transactional mode are not lost: they are in the outbox, committed with the
// handler's write and the mark, with their derived ids, and the router had
// nothing to publish.
func TestTx_router_with_failing_publisher_loses_no_returned_message(t *testing.T) {
	forTx(t, func(t *testing.T, e *txEnv) {
		outbox := e.table + "_outbox"
		if _, err := e.db.ExecContext(ctxT(t), "CREATE TABLE "+outbox+" (uuid VARCHAR(64) NOT NULL, payload VARCHAR(255) NOT NULL)"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = e.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+outbox) })
		ib := e.middleware(t, txinbox.Config{Outbox: func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) error {
			for _, m := range msgs {
				if _, err := tx.ExecContext(ctx, "INSERT INTO "+outbox+" (uuid, payload) VALUES ("+ph(e.b.dialect, 1)+", "+ph(e.b.dialect, 2)+")", m.UUID, string(m.Payload)); err != nil {
					return err
				}
			}
			return nil
		}}, inboxmw.Config{})

		logger := watermill.NopLogger{}
		pubsub := gochannel.NewGoChannel(gochannel.Config{}, logger)
		defer pubsub.Close()
		pub := &failingPublisher{}
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
		if err != nil {
			t.Fatal(err)
		}
		var calls atomic.Int32
		router.AddHandler("orders", "in", pubsub, "out", pub, func(m *message.Message) ([]*message.Message, error) {
			calls.Add(1)
			if err := e.writeEffect(m, "ok"); err != nil {
				return nil, err
			}
			return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("event"))}, nil
		}).AddMiddleware(ib.Middleware)
		ctx, cancel := context.WithCancel(context.Background())
		runDone := make(chan error, 1)
		go func() { runDone <- router.Run(ctx) }()
		defer func() {
			cancel()
			<-runDone
		}()
		<-router.Running()

		msg := message.NewMessage(watermill.NewUUID(), []byte("order"))
		for range 2 { // delivered twice
			if err := pubsub.Publish("in", msg.Copy()); err != nil {
				t.Fatal(err)
			}
		}
		deadline := time.Now().Add(60 * time.Second)
		for countRows(t, e.db, outbox, "payload = 'event'") < 1 || e.effectCount(t, msg.UUID) < 1 {
			if time.Now().After(deadline) {
				t.Fatal("the handler's write and outbox message did not commit within 60s")
			}
			time.Sleep(20 * time.Millisecond) // polling interval
		}
		// Both deliveries are acked once the second one is seen as a duplicate.
		for ok, _ := e.store.IsProcessed(ctxT(t), keyOf(msg)); !ok; ok, _ = e.store.IsProcessed(ctxT(t), keyOf(msg)) {
			if time.Now().After(deadline) {
				t.Fatal("key not processed within 60s")
			}
			time.Sleep(20 * time.Millisecond) // polling interval
		}
		cancel()
		if err := <-runDone; err != nil {
			t.Fatalf("router: %v", err)
		}
		runDone <- nil
		if n := countRows(t, e.db, outbox, "payload = 'event'"); n != 1 || e.effectCount(t, msg.UUID) != 1 || calls.Load() != 1 {
			t.Fatalf("%d outbox messages, %d effects, %d handler runs; want 1, 1, 1", n, e.effectCount(t, msg.UUID), calls.Load())
		}
		if n := pub.calls.Load(); n != 0 {
			t.Fatalf("the router published %d times: returned messages must go to the outbox only", n)
		}
		// The outbox holds the message with the id derived from the input's
		// key: a redelivery that ran the handler again (a rollback) would
		// store the same id, which the next stage's inbox drops.
		if want := inboxmw.OutputID(keyOf(msg), 0); countRows(t, e.db, outbox, "uuid = '"+want+"'") != 1 {
			t.Fatalf("the outbox message's UUID is not the derived id %s", want)
		}
	})
}
