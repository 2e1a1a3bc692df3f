package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/faultproxy"
	"github.com/watermill-inbox/inbox/internal/testenv"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
	"github.com/watermill-inbox/inbox/stores/redis/internal/redistest"
	"github.com/watermill-inbox/inbox/stores/storetest"
)

func TestConformance(t *testing.T) {
	c := sharedClient(t)
	storetest.Run(t, withFaults(t, harness(t, c), c, func() *redis.Options {
		o, err := redis.ParseURL(testenv.Redis.URL(t))
		if err != nil {
			t.Fatalf("INBOX_TEST_REDIS_URL: %v", err)
		}
		return o
	}))
}

// faultTimeout is the Timeout of the stores the fault cases break: a few
// of the suite's slowed round trips (600ms each) and a connection handshake.
const faultTimeout = 10 * time.Second

// withFaults gives h the suite's fault cases: each store they ask for runs
// over a client of its own (newClient, given the address to dial) through a
// faultproxy to c's server, made from the options newOptions returns with
// the proxy's address and the setting of a store opened by URL
// (ContextTimeoutEnabled), under a key prefix of its own.
func withFaults(t *testing.T, h storetest.Harness, c *redis.Client, newOptions func() *redis.Options) storetest.Harness {
	prefix := testPrefix(t, c)
	target := c.Options().Addr
	h.Faults = func(t *testing.T, cfg storetest.Config) (inbox.LeaseStore, storetest.Link) {
		p := faultproxy.New(t, target)
		o := newOptions()
		o.Addr, o.ContextTimeoutEnabled = p.Addr(), true
		pc := redis.NewClient(o)
		t.Cleanup(func() { _ = pc.Close() })
		s, err := redisstore.New(pc, redisstore.Options{Prefix: prefix, Retention: cfg.Retention, Timeout: faultTimeout})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s, p
	}
	h.CallTimeout = faultTimeout
	return h
}

func TestConformance_cluster(t *testing.T) {
	addrs := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = c.Close() })
	h := harness(t, c)
	// Runs after the suite's parallel subtests, before the keys are deleted:
	// the suite's keys must have spread over the masters, or the test proved
	// nothing about Cluster.
	t.Cleanup(func() {
		used := 0
		for _, a := range addrs {
			n := redis.NewClient(&redis.Options{Addr: a})
			size, err := n.DBSize(context.Background()).Result()
			_ = n.Close()
			if err != nil {
				t.Errorf("DBSIZE on %s: %v", a, err)
			}
			if size > 0 {
				used++
			}
		}
		if used < 2 {
			t.Errorf("the suite's keys are on %d of %d masters, want them spread over several", used, len(addrs))
		}
	})
	storetest.Run(t, h)
}
