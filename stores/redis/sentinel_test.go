package redisstore_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/stores"
	"github.com/watermill-inbox/inbox/stores/redis/internal/redistest"
	"github.com/watermill-inbox/inbox/stores/storetest"
)

// TestConformance_sentinel runs the suite through a Sentinel client: a
// private master watched by a private Sentinel.
func TestConformance_sentinel(t *testing.T) {
	master := redistest.Start(t, redistest.Config{})
	sentinel := redistest.StartSentinel(t, master, "inbox")
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "inbox", SentinelAddrs: []string{sentinel.Addr()}})
	t.Cleanup(func() { _ = c.Close() })
	storetest.Run(t, harness(t, c))
}

// TestOpenURL_sentinel_follows_failover opens the store by a URL naming a
// Sentinel, marks keys, has Sentinel promote the replica, and checks that
// the same store reaches the new master: the replicated marks are there,
// claims are fenced as before, and the scripts load on the new master
// (its script cache is empty).
func TestOpenURL_sentinel_follows_failover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	master := redistest.Start(t, redistest.Config{})
	replica := redistest.Start(t, redistest.Config{ReplicaOf: master.Addr()})
	redistest.WaitReplicaOnline(t, master, 1)
	sentinel := redistest.StartSentinel(t, master, "inbox")

	s, err := stores.Open(ctx, "redis://"+sentinel.Addr()+"/0?master_name=inbox&timeout=2s&lease=30s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	const n = 20
	for i := range n {
		if err := s.MarkProcessed(ctx, fmt.Sprintf("k%d", i)); err != nil {
			t.Fatalf("MarkProcessed through Sentinel: %v", err)
		}
	}
	held, err := s.TryBegin(ctx, "held", inbox.BeginOptions{})
	if err != nil || held.Status != inbox.Acquired {
		t.Fatalf("TryBegin(held) = %+v, %v; want Acquired", held, err)
	}
	// The marks must be on the replica before it is promoted: a failover
	// loses unreplicated writes (see the package documentation).
	mc := redis.NewClient(&redis.Options{Addr: master.Addr()})
	defer mc.Close()
	if acked, err := mc.Do(ctx, "WAIT", 1, 10000).Int(); err != nil || acked != 1 {
		t.Fatalf("WAIT 1 10000 = %d, %v; want the replica to acknowledge", acked, err)
	}

	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel.Addr()})
	defer sc.Close()
	testenv.Eventually(t, 30*time.Second, "SENTINEL FAILOVER accepted", func() bool {
		err := sc.Failover(ctx, "inbox").Err() // NOGOODSLAVE while Sentinel's view of the replica is stale
		if err != nil {
			t.Logf("SENTINEL FAILOVER: %v; retrying", err)
		}
		return err == nil
	})
	testenv.Eventually(t, 60*time.Second, "Sentinel names the replica "+replica.Addr()+" as master", func() bool {
		a, err := sc.GetMasterAddrByName(ctx, "inbox").Result()
		return err == nil && len(a) == 2 && net.JoinHostPort(a[0], a[1]) == replica.Addr()
	})
	// The store may see errors while the old master turns into a replica;
	// it must then reach the new one without being reopened.
	var last error
	testenv.Eventually(t, 60*time.Second, "a new key claimed on the new master", func() bool {
		c, err := s.TryBegin(ctx, "after-failover", inbox.BeginOptions{})
		last = err
		return err == nil && c.Status == inbox.Acquired
	})
	if last != nil {
		t.Fatal(last)
	}
	for i := range n {
		r, err := s.Get(ctx, fmt.Sprintf("k%d", i))
		if err != nil || r.State != inbox.StateProcessed {
			t.Fatalf("k%d after the failover: %+v, %v; want processed", i, r, err)
		}
	}
	if c, err := s.TryBegin(ctx, "held", inbox.BeginOptions{}); err != nil || c.Status != inbox.Busy {
		t.Fatalf("TryBegin(held) after the failover = %+v, %v; want Busy: the lease was replicated", c, err)
	}
	if err := s.Complete(ctx, "held", held.LeaseID); err != nil {
		t.Fatalf("Complete(held) with the lease taken before the failover: %v", err)
	}
	info, err := redis.NewClient(&redis.Options{Addr: replica.Addr()}).Info(ctx, "replication").Result()
	if err != nil || !strings.Contains(info, "role:master") {
		t.Fatalf("the promoted replica's INFO: %v\n%s", err, info)
	}
}
