package redisstore_test

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

// sharedClient returns a client of the shared test Redis (DB 15 by default),
// closed when the test ends.
func sharedClient(t testing.TB) *redis.Client {
	t.Helper()
	raw := testenv.Redis.URL(t)
	o, err := redis.ParseURL(raw)
	if err != nil {
		t.Fatalf("INBOX_TEST_REDIS_URL: %v", err)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// testPrefix returns a key prefix no other test or run uses, and deletes
// every key under it when the test ends.
func testPrefix(t testing.TB, c redis.UniversalClient) string {
	t.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:])
	prefix := "inboxtest:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() { deleteKeys(t, c, prefix) })
	return prefix
}

// deleteKeys removes every key under prefix (on every master of a cluster).
func deleteKeys(t testing.TB, c redis.UniversalClient, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	del := func(ctx context.Context, n redis.UniversalClient) error {
		it := n.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		flush := func() error {
			if len(keys) == 0 {
				return nil
			}
			// One DEL per key: on a cluster node keys of a batch may be in
			// different slots.
			p := n.Pipeline()
			for _, k := range keys {
				p.Del(ctx, k)
			}
			keys = keys[:0]
			_, err := p.Exec(ctx)
			return err
		}
		for it.Next(ctx) {
			if keys = append(keys, it.Val()); len(keys) == 1000 {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if err := it.Err(); err != nil {
			return err
		}
		return flush()
	}
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return del(ctx, n) })
	} else {
		err = del(ctx, c)
	}
	if err != nil {
		t.Errorf("deleting test keys under %q: %v", prefix, err)
	}
}

// harness runs the conformance suite over c, in a namespace of its own.
func harness(t *testing.T, c redis.UniversalClient) storetest.Harness {
	prefix := testPrefix(t, c)
	return storetest.Harness{
		New: func(t *testing.T, cfg storetest.Config) inbox.LeaseStore {
			s, err := redisstore.New(c, redisstore.Options{Prefix: prefix, Retention: cfg.Retention})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		Lease:     300 * time.Millisecond,
		Retention: time.Second,
		// Times are Redis TIME microseconds, returned as stored.
		TimePrecision: time.Microsecond,
	}
}

func newStore(t testing.TB, c redis.UniversalClient, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	if opts.Prefix == "" {
		opts.Prefix = testPrefix(t, c)
	}
	s, err := redisstore.New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}
