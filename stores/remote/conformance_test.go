package remote_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/faultproxy"
	"github.com/watermill-inbox/inbox/internal/testenv"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
	"github.com/watermill-inbox/inbox/stores/remote"
	"github.com/watermill-inbox/inbox/stores/remote/server"
	"github.com/watermill-inbox/inbox/stores/storetest"
)

// harness runs the suite through the remote client against inboxd's handler
// on loopback HTTP, over the backing store newBacking returns. The fault
// cases break the link between the client and inboxd.
func harness(newBacking func(t *testing.T, cfg storetest.Config) inbox.LeaseStore) storetest.Harness {
	return storetest.Harness{
		New: func(t *testing.T, cfg storetest.Config) inbox.LeaseStore {
			base := serve(t, server.Config{Store: newBacking(t, cfg), LeaseMin: time.Second})
			return newClient(t, remote.Options{URL: base})
		},
		Faults: func(t *testing.T, cfg storetest.Config) (inbox.LeaseStore, storetest.Link) {
			base, err := url.Parse(serve(t, server.Config{Store: newBacking(t, cfg), LeaseMin: time.Second}))
			if err != nil {
				t.Fatal(err)
			}
			p := faultproxy.New(t, base.Host)
			base.Host = p.Addr()
			return newClient(t, remote.Options{URL: base.String()}), p
		},
		// leaseSeconds counts whole seconds.
		Lease:     time.Second,
		Retention: time.Second,
		// RFC 3339 with nanosecond fractions carries the store's own precision.
		TimePrecision: time.Millisecond,
	}
}

func TestConformance_memory(t *testing.T) {
	storetest.Run(t, harness(func(t *testing.T, cfg storetest.Config) inbox.LeaseStore {
		return newMemory(t, cfg.Retention)
	}))
}

// redisClient returns a client of the shared test Redis and a key prefix of
// its own, whose keys are deleted when the test ends.
func redisClient(t testing.TB) (*redis.Client, string) {
	t.Helper()
	o, err := redis.ParseURL(testenv.Redis.URL(t))
	if err != nil {
		t.Fatalf("INBOX_TEST_REDIS_URL: %v", err)
	}
	c := redis.NewClient(o)
	var b [8]byte
	_, _ = rand.Read(b[:])
	prefix := "inboxtest:remote:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		var keys []string
		it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for it.Next(ctx) {
			keys = append(keys, it.Val())
		}
		if len(keys) > 0 {
			if err := c.Del(ctx, keys...).Err(); err != nil {
				t.Errorf("deleting the test keys: %v", err)
			}
		}
		_ = c.Close()
	})
	return c, prefix
}

func newRedis(t testing.TB, c redis.UniversalClient, prefix string, retention time.Duration) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(c, redisstore.Options{Prefix: prefix, Retention: retention})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance_redis(t *testing.T) {
	c, prefix := redisClient(t)
	storetest.Run(t, harness(func(t *testing.T, cfg storetest.Config) inbox.LeaseStore {
		return newRedis(t, c, prefix, cfg.Retention)
	}))
}
