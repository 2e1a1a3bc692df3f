package redisstore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/faultproxy"
	"github.com/watermill-inbox/inbox/internal/startstest"
	"github.com/watermill-inbox/inbox/middleware"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
)

// With Redis unreachable the inbox middleware fails closed: the handler
// never runs and the message is nacked (GoChannel redelivers it at once);
// once Redis is back the message is processed, exactly once.
func TestMiddleware_redis_down_nacks_then_processes_once(t *testing.T) {
	t.Parallel()
	shared := sharedClient(t)
	p := faultproxy.New(t, shared.Options().Addr)
	o := proxiedOptions(t, p)
	o.MaxRetries = -1
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	st := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, shared), Timeout: 2 * time.Second})

	// A failed claim is retried for at most MaxBusyWait before the message
	// is nacked: a second, so three nacks take seconds, not the default's
	// 30 s, which is this test's whole budget.
	ib, err := inboxmw.New(inboxmw.Config{Store: st, Bus: "b", Group: "g", MaxBusyWait: time.Second, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	var unavailable, runs atomic.Int32
	// Outermost: sees what the inbox middleware returns to the router.
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			out, err := h(m)
			if errors.Is(err, inbox.ErrStoreUnavailable) {
				unavailable.Add(1)
			} else if err != nil {
				t.Errorf("handler chain returned %v, want nil or ErrStoreUnavailable", err)
			}
			return out, err
		}
	})
	router.AddMiddleware(ib.Middleware)
	router.AddConsumerHandler("h", "in", pubSub, func(*message.Message) error {
		runs.Add(1)
		return nil
	})
	go func() { _ = router.Run(context.Background()) }()
	t.Cleanup(func() {
		_ = router.Close()
		_ = pubSub.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = ib.Close(ctx)
	})
	<-router.Running()

	p.Cut()
	published := make(chan error, 1)
	go func() { published <- pubSub.Publish("in", message.NewMessage("msg-1", []byte("x"))) }()
	deadline := time.Now().Add(30 * time.Second)
	for unavailable.Load() < 3 { // nacked and redelivered at least three times
		if time.Now().After(deadline) {
			t.Fatalf("%d deliveries failed with ErrStoreUnavailable in 30s, want 3", unavailable.Load())
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
	if n := runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times with Redis unreachable, want 0 (fail closed)", n)
	}
	p.Restore()
	select {
	case err := <-published: // returns once the message is acked
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("message not acked 60s after Redis came back")
	}
	// A duplicate delivery after the mark is skipped.
	if err := pubSub.Publish("in", message.NewMessage("msg-1", []byte("x"))); err != nil {
		t.Fatal(err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want exactly 1", n)
	}
}

// The inbox middleware's success path on Redis starts no goroutine and no
// timer per message: over 10,000 messages, one after the other, each
// claimed and marked through the store's batching (the marks on its
// runners), the counts stay under a constant (internal/startstest, as for
// the other stores).
func TestMiddleware_success_path_starts_no_goroutine_or_timer_per_message(t *testing.T) {
	// Not parallel: the counts are the whole process's.
	c := sharedClient(t)
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	startstest.Constant(t, newStore(t, c, redisstore.Options{}), "starts", nil, startstest.Messages)
}
