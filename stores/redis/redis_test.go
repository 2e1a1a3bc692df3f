package redisstore_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox/stores/redis/internal/redistest"
	"github.com/watermill-inbox/inbox/stores/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, harness(t, sharedClient(t)))
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
