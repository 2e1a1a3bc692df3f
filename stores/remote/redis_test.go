// The Redis-backed runs of the remote client: the conformance suite over
// inboxd's handler over Redis, and the Redis pairs of
// BenchmarkTryBeginComplete.

package remote_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
	"github.com/watermill-inbox/inbox/stores/storetest"
)

func init() {
	benchRedis = func(b *testing.B) inbox.LeaseStore {
		c, prefix := redisClient(b)
		return newRedis(b, c, prefix, 0)
	}
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
	h := harness(func(t *testing.T, cfg storetest.Config) inbox.LeaseStore {
		return newRedis(t, c, prefix, cfg.Retention)
	})
	storetest.Run(t, h)
}
