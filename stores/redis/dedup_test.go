package redisstore_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
)

func newRepo(t *testing.T, c redis.UniversalClient, window time.Duration) *redisstore.ExpiringKeyRepository {
	t.Helper()
	r, err := redisstore.NewExpiringKeyRepository(c, redisstore.ExpiringKeyRepositoryOptions{Prefix: testPrefix(t, c), Window: window})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// runRouter runs a router whose one handler consumes topic "in" of a
// GoChannel (Publish blocks until the message is acked) behind the
// Deduplicator, and returns the publisher.
func runRouter(t *testing.T, repo middleware.ExpiringKeyRepository, h message.NoPublishHandlerFunc) message.Publisher {
	t.Helper()
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	dedup := &middleware.Deduplicator{
		KeyFactory: middleware.NewMessageHasherFromMetadataField("id"),
		Repository: repo,
		Timeout:    5 * time.Second,
	}
	router.AddMiddleware(dedup.Middleware)
	router.AddConsumerHandler("h", "in", pubSub, h)
	go func() { _ = router.Run(context.Background()) }()
	t.Cleanup(func() { _ = router.Close(); _ = pubSub.Close() })
	select {
	case <-router.Running():
	case <-time.After(30 * time.Second):
		t.Fatal("router not running after 30s")
	}
	return pubSub
}

func publish(t *testing.T, p message.Publisher, id string) {
	t.Helper()
	m := message.NewMessage(watermill.NewUUID(), []byte("payload"))
	m.Metadata.Set("id", id)
	if err := p.Publish("in", m); err != nil {
		t.Fatal(err)
	}
}

func TestExpiringKeyRepository_deduplicator_drops_duplicates(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	repo := newRepo(t, c, time.Minute)
	var mu sync.Mutex
	runs := map[string]int{}
	pub := runRouter(t, repo, func(m *message.Message) error {
		mu.Lock()
		runs[m.Metadata.Get("id")]++
		mu.Unlock()
		return nil
	})
	for _, id := range []string{"a", "a", "b", "a", "b"} {
		publish(t, pub, id) // returns once the message is acked
	}
	// A second consumer (another router, same Redis) sees the keys too.
	pub2 := runRouter(t, repo, func(m *message.Message) error {
		t.Errorf("second consumer ran the handler for %q, seen by the first", m.Metadata.Get("id"))
		return nil
	})
	publish(t, pub2, "a")
	mu.Lock()
	defer mu.Unlock()
	if runs["a"] != 1 || runs["b"] != 1 {
		t.Fatalf("handler runs per id %v, want a:1 b:1", runs)
	}
}

// The reason the inbox middleware exists, as the repository's doc says: the
// Deduplicator records the key before the handler, so a failed message is
// acked as a duplicate on redelivery and never processed.
func TestExpiringKeyRepository_failed_handler_message_is_lost(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	var calls, successes atomic.Int32
	pub := runRouter(t, newRepo(t, c, time.Minute), func(*message.Message) error {
		if calls.Add(1) == 1 {
			return errors.New("transient failure")
		}
		successes.Add(1)
		return nil
	})
	publish(t, pub, "x") // nacked, redelivered by GoChannel, then acked as duplicate
	if calls.Load() != 1 || successes.Load() != 0 {
		t.Fatalf("handler calls %d, successes %d; the Deduplicator was expected to drop the redelivery (1, 0)", calls.Load(), successes.Load())
	}
}

func TestExpiringKeyRepository_concurrent_exactly_one_new(t *testing.T) {
	t.Parallel()
	repo := newRepo(t, sharedClient(t), time.Minute)
	var fresh atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			dup, err := repo.IsDuplicate(context.Background(), "k")
			if err != nil {
				t.Error(err)
			}
			if !dup {
				fresh.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	if fresh.Load() != 1 {
		t.Fatalf("%d of 50 concurrent IsDuplicate calls reported a new key, want 1", fresh.Load())
	}
}

func TestExpiringKeyRepository_window_expires(t *testing.T) {
	t.Parallel()
	repo := newRepo(t, sharedClient(t), 200*time.Millisecond)
	ctx := context.Background()
	if dup, err := repo.IsDuplicate(ctx, "k"); err != nil || dup {
		t.Fatalf("first IsDuplicate = %v, %v", dup, err)
	}
	start := time.Now()
	if dup, err := repo.IsDuplicate(ctx, "k"); err != nil || !dup {
		t.Fatalf("second IsDuplicate = %v, %v; want duplicate", dup, err)
	}
	deadline := start.Add(10 * time.Second)
	for {
		dup, err := repo.IsDuplicate(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if !dup {
			if time.Since(start) < 150*time.Millisecond {
				t.Fatalf("key forgotten after %s, window 200ms", time.Since(start))
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("key still remembered 10s into a 200ms window")
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}

func TestExpiringKeyRepository_errors(t *testing.T) {
	t.Parallel()
	if _, err := redisstore.NewExpiringKeyRepository(nil, redisstore.ExpiringKeyRepositoryOptions{}); !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Errorf("nil client: %v", err)
	}
	c := sharedClient(t)
	if _, err := redisstore.NewExpiringKeyRepository(c, redisstore.ExpiringKeyRepositoryOptions{Window: time.Microsecond}); !errors.Is(err, inbox.ErrInvalidArgument) {
		t.Errorf("1µs window: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	down := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = down.Close() })
	repo, err := redisstore.NewExpiringKeyRepository(down, redisstore.ExpiringKeyRepositoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := repo.IsDuplicate(context.Background(), "k"); !errors.Is(err, inbox.ErrStoreUnavailable) {
		t.Fatalf("IsDuplicate with Redis down: %v, want ErrStoreUnavailable", err)
	}
}
