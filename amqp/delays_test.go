package inboxamqp_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/amqp"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// newDelays opens Delays for r's queue with a short ladder, and deletes the
// delay queues when the test ends.
func newDelays(t *testing.T, r *rabbit, delays ...time.Duration) *inboxamqp.Delays {
	t.Helper()
	return newDelaysOf(t, r, r.queue, delays...)
}

// newDelaysOf is newDelays for queue, another queue of r's channel.
func newDelaysOf(t *testing.T, r *rabbit, queue string, delays ...time.Duration) *inboxamqp.Delays {
	t.Helper()
	d, err := inboxamqp.NewDelays(context.Background(), inboxamqp.DelaysConfig{URI: r.uri, Queues: []string{queue}, Delays: delays})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = d.Close()
		for _, delay := range delays {
			if _, err := r.ch.QueueDelete(inboxamqp.DelayQueueName(queue, delay), false, false, false); err != nil {
				t.Errorf("delete delay queue: %v", err)
			}
		}
	})
	return d
}

// subscribe consumes r's queue through watermill-amqp with the package's
// Marshaler.
func subscribe(t *testing.T, r *rabbit) <-chan *message.Message {
	t.Helper()
	cfg := amqp.NewNonDurableQueueConfig(r.uri)
	cfg.Marshaler = inboxamqp.Marshaler{}
	sub, err := amqp.NewSubscriber(cfg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(context.Background(), r.queue)
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

func TestDelays_copy_comes_back_after_its_rounded_delay_with_everything(t *testing.T) {
	t.Parallel()
	r := newRabbit(t)
	d := newDelays(t, r, 300*time.Millisecond, 900*time.Millisecond)
	msgs := subscribe(t, r)

	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order":42}`))
	msg.Metadata.Set("IdempotencyKey", "order-42")
	msg.Metadata.Set(inboxmw.MetadataKey, "rabbit:g:h:order-42")
	msg.Metadata.Set(inboxmw.MetadataAttempts, "2")
	msg.Metadata.Set("x-death", `[{"count":1}]`) // an earlier round's, left out
	start := time.Now()
	if err := d.Redeliver(context.Background(), r.queue, msg, 400*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-msgs:
		got.Ack()
		if waited := time.Since(start); waited < 900*time.Millisecond {
			t.Fatalf("the copy came back after %s, before the 900ms rung that 400ms rounds up to", waited)
		}
		if got.UUID != msg.UUID || string(got.Payload) != string(msg.Payload) {
			t.Fatalf("copy %s %q, want %s %q", got.UUID, got.Payload, msg.UUID, msg.Payload)
		}
		for _, k := range []string{"IdempotencyKey", inboxmw.MetadataKey, inboxmw.MetadataAttempts} {
			if got.Metadata.Get(k) != msg.Metadata.Get(k) {
				t.Errorf("metadata %s = %q, want %q", k, got.Metadata.Get(k), msg.Metadata.Get(k))
			}
		}
		// RabbitMQ's own record of this round, not the earlier one.
		if xd := got.Metadata.Get("x-death"); !strings.Contains(xd, `"reason":"expired"`) || !strings.Contains(xd, inboxamqp.DelayQueueName(r.queue, 900*time.Millisecond)) {
			t.Errorf("x-death %q", xd)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the copy did not come back")
	}
}

func TestDelays_longer_than_the_ladder_takes_the_top_rung(t *testing.T) {
	t.Parallel()
	r := newRabbit(t)
	d := newDelays(t, r, 200*time.Millisecond)
	msgs := subscribe(t, r)
	start := time.Now()
	if err := d.Redeliver(context.Background(), r.queue, message.NewMessage(watermill.NewUUID(), nil), time.Hour); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-msgs:
		got.Ack()
		if waited := time.Since(start); waited < 200*time.Millisecond || waited > 5*time.Second {
			t.Fatalf("came back after %s, want about the top rung, 200ms", waited)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the copy did not come back")
	}
}

func TestNewDelays_declares_idempotently_and_refuses_a_clash(t *testing.T) {
	t.Parallel()
	r := newRabbit(t)
	newDelays(t, r, 250*time.Millisecond)
	// A second setup (another consumer process) finds the queues as it wants them.
	d2, err := inboxamqp.NewDelays(context.Background(), inboxamqp.DelaysConfig{URI: r.uri, Queues: []string{r.queue}, Delays: []time.Duration{250 * time.Millisecond}})
	if err != nil {
		t.Fatalf("second setup: %v", err)
	}
	_ = d2.Close()

	// A queue of that name with other arguments is a clear setup error.
	clash := r.queue + "-clash"
	name := inboxamqp.DelayQueueName(clash, time.Second)
	if _, err := r.ch.QueueDeclare(name, true, false, false, false, amqp091.Table{"x-message-ttl": int64(5000)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = r.ch.QueueDelete(name, false, false, false) })
	_, err = inboxamqp.NewDelays(context.Background(), inboxamqp.DelaysConfig{URI: r.uri, Queues: []string{clash}, Delays: []time.Duration{time.Second}})
	if !errors.Is(err, inboxamqp.ErrBroker) || !strings.Contains(err.Error(), "cannot declare delay queue \""+name+"\"") {
		t.Fatalf("err = %v, want ErrBroker naming %s", err, name)
	}
}

func TestNewDelays_setup_errors_say_what_is_wrong(t *testing.T) {
	t.Parallel()
	uri := testenv.RabbitMQ.URL(t)
	ctx := context.Background()
	for _, c := range []struct {
		name string
		cfg  inboxamqp.DelaysConfig
		is   error
		says string
	}{
		{"no URI", inboxamqp.DelaysConfig{}, inbox.ErrInvalidArgument, "URI is required"},
		{"not amqp", inboxamqp.DelaysConfig{URI: "http://x"}, inbox.ErrInvalidArgument, "not an amqp:// or amqps:// URI"},
		{"ladder", inboxamqp.DelaysConfig{URI: uri, Delays: []time.Duration{time.Second, time.Second}}, inbox.ErrInvalidArgument, "delays must increase"},
		{"password", inboxamqp.DelaysConfig{URI: strings.Replace(uri, "guest:guest", "guest:wrong", 1)}, inboxamqp.ErrBroker, "cannot connect to"},
		{"vhost", inboxamqp.DelaysConfig{URI: strings.TrimSuffix(uri, "/") + "/no-such-vhost"}, inboxamqp.ErrBroker, "cannot connect to"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := inboxamqp.NewDelays(ctx, c.cfg)
			if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("err = %v, want one wrapping %v that says %q", err, c.is, c.says)
			}
			if strings.Contains(err.Error(), "wrong") {
				t.Fatalf("the error quotes the password: %v", err)
			}
		})
	}
}

// A user who may not configure queues gets the refusal at setup, naming the
// queue and the vhost.
func TestNewDelays_without_permission_to_declare_fails_at_setup(t *testing.T) {
	t.Parallel()
	uri := testenv.RabbitMQ.URL(t)
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		testenv.RecordSkip("rabbitmqctl", "run the tests where RabbitMQ's rabbitmqctl is installed")
		t.Skip("rabbitmqctl is not installed: cannot make a user without permissions")
	}
	user := "inbox-test-" + watermill.NewShortUUID()
	ctl := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("rabbitmqctl", args...).CombinedOutput(); err != nil {
			t.Fatalf("rabbitmqctl %v: %v\n%s", args, err, out)
		}
	}
	ctl("add_user", user, "pw")
	t.Cleanup(func() { _ = exec.Command("rabbitmqctl", "delete_user", user).Run() })
	ctl("set_permissions", "-p", "/", user, "^$", ".*", ".*") // may read and write, not configure
	_, err := inboxamqp.NewDelays(context.Background(), inboxamqp.DelaysConfig{
		URI: strings.Replace(uri, "guest:guest", user+":pw", 1), Queues: []string{"orders-" + user}})
	if !errors.Is(err, inboxamqp.ErrBroker) || !strings.Contains(err.Error(), "cannot declare delay queue") ||
		!strings.Contains(err.Error(), "ACCESS_REFUSED") || !strings.Contains(err.Error(), `vhost "/"`) {
		t.Fatalf("err = %v, want a refused declaration naming the queue and the vhost", err)
	}
}

// A copy for a queue that does not exist would be dropped when it
// dead-letters: the hand-off fails instead, and the middleware falls back.
func TestDelays_refuses_a_queue_that_does_not_exist(t *testing.T) {
	t.Parallel()
	r := newRabbit(t)
	d := newDelays(t, r, 250*time.Millisecond)
	err := d.Redeliver(context.Background(), "no-such-queue-"+watermill.NewShortUUID(), message.NewMessage(watermill.NewUUID(), nil), time.Second)
	if !errors.Is(err, inboxamqp.ErrBroker) || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("err = %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Redeliver(context.Background(), r.queue, message.NewMessage(watermill.NewUUID(), nil), time.Second); !errors.Is(err, inbox.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// The whole path on RabbitMQ: a handler that fails once; the consumer (one,
// prefetch 1) goes on with the next messages while the failed one waits in
// a delay queue, then runs it once its backoff is over. A handler whose
// error is permanent makes its key dead after one attempt, and the message
// goes to a poison queue filtered with IsTransient.
func TestDelays_router_moves_on_while_the_failed_message_waits(t *testing.T) {
	t.Parallel()
	r := newRabbit(t)
	d := newDelays(t, r, 500*time.Millisecond, time.Second)
	store, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	const backoff = 800 * time.Millisecond
	ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "rabbit", Group: r.queue, Redelivery: d, MaxAttempts: 3,
		Backoff: func(int) time.Duration { return backoff }})
	if err != nil {
		t.Fatal(err)
	}
	cfg := amqp.NewNonDurableQueueConfig(r.uri)
	cfg.Marshaler = inboxamqp.Marshaler{}
	sub, err := amqp.NewSubscriber(cfg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := amqp.NewPublisher(cfg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	poisonQueue := r.queue + "-poison"
	if err := sub.SubscribeInitialize(poisonQueue); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = r.ch.QueueDelete(poisonQueue, false, false, false) })
	poison, err := wmw.PoisonQueueWithFilter(pub, poisonQueue, func(err error) bool { return !inboxmw.IsTransient(err) })
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(poison, ib.Middleware)
	var mu sync.Mutex
	var order []string
	ran := map[string][]time.Time{}
	router.AddConsumerHandler("charge", r.queue, sub, func(m *message.Message) error {
		id := m.Metadata.Get("IdempotencyKey")
		mu.Lock()
		defer mu.Unlock()
		ran[id] = append(ran[id], time.Now())
		switch {
		case id == "flaky" && len(ran[id]) == 1:
			return errors.New("payment gateway timeout")
		case id == "bad":
			return inbox.Permanent(errors.New("order has no customer"))
		}
		order = append(order, id)
		return nil
	})
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	t.Cleanup(func() {
		_ = router.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = ib.Close(ctx)
	})
	for _, id := range []string{"flaky", "bad", "a", "b", "c"} {
		m := message.NewMessage(watermill.NewUUID(), nil)
		m.Metadata.Set("IdempotencyKey", id)
		if err := pub.Publish(r.queue, m); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 15*time.Second, "every message processed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == 4
	})
	mu.Lock()
	defer mu.Unlock()
	if order[3] != "flaky" || len(ran["flaky"]) != 2 {
		t.Fatalf("processed in order %v, flaky ran %d times: want flaky last, after one failure", order, len(ran["flaky"]))
	}
	if gap := ran["flaky"][1].Sub(ran["flaky"][0]); gap < backoff {
		t.Fatalf("the copy ran %s after the failure, before the backoff of %s", gap, backoff)
	}
	if len(ran["bad"]) != 1 {
		t.Fatalf("the permanent failure ran %d times, want 1", len(ran["bad"]))
	}
	if rec, err := store.Get(context.Background(), "rabbit:"+r.queue+":charge:bad"); err != nil || rec.State != inbox.StateDead || rec.Attempts != 1 {
		t.Fatalf("the permanent failure's key: %+v, %v; want dead after 1 attempt", rec, err)
	}
	testenv.Eventually(t, 10*time.Second, "the dead message in the poison queue", func() bool {
		q, err := r.ch.QueueDeclarePassive(poisonQueue, true, false, false, false, nil)
		return err == nil && q.Messages == 1
	})
	if n := r.ready(t); n != 0 {
		t.Fatalf("%d messages left in the queue", n)
	}
}
