package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
)

// The gate of an order key ("Order keys" in doc.go): a list under the
// prefix, a NUL and "order:", of the head and the keys waiting behind it,
// with the retention plus the default lease as its TTL; List shows no
// gate. A claim with an order key is the script alone, never SET NX; a
// claim without one keeps the fast claim.
func TestStore_order_gate_layout(t *testing.T) {
	t.Parallel()
	c := sharedClient(t)
	var log cmdLog
	c.AddHook(&log)
	ctx := context.Background()
	prefix := testPrefix(t, c)
	const retention, lease = time.Hour, time.Minute
	s := newStore(t, c, redisstore.Options{Prefix: prefix, Retention: retention, Lease: lease})
	if !s.KeepsOrder() {
		t.Fatal("KeepsOrder false over a *redis.Client")
	}
	const ok = "order-1"
	gate := prefix + "\x00order:" + ok

	log.take()
	cl, err := s.TryBegin(ctx, "head", inbox.BeginOptions{OrderKey: ok})
	if err != nil || cl.Status != inbox.Acquired {
		t.Fatalf("TryBegin with an order key: %+v, %v", cl, err)
	}
	if got := log.take(); got != "evalsha" {
		t.Fatalf("TryBegin with an order key sent %q, want %q", got, "evalsha")
	}
	if n, err := c.Exists(ctx, gate).Result(); err != nil || n != 0 {
		t.Fatalf("a claim without a gate made one: %d, %v", n, err)
	}
	if err := s.Fail(ctx, "head", cl.LeaseID, inbox.FailOptions{RetryAfter: time.Minute, OrderKey: ok}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b", "a"} {
		if cl, err := s.TryBegin(ctx, k, inbox.BeginOptions{OrderKey: ok}); err != nil || cl.Status != inbox.Behind {
			t.Fatalf("TryBegin of %q behind the head: %+v, %v", k, cl, err)
		}
	}
	keys, err := c.LRange(ctx, gate, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"head", "a", "b"}; len(keys) != 3 || keys[0] != want[0] || keys[1] != want[1] || keys[2] != want[2] {
		t.Fatalf("the gate holds %q, want %q", keys, want)
	}
	ttl, err := c.PTTL(ctx, gate).Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := retention + lease; ttl > want || ttl < want-10*time.Second {
		t.Fatalf("the gate's TTL is %s, want about %s", ttl, want)
	}

	log.take()
	if cl, err := s.TryBegin(ctx, "free", inbox.BeginOptions{}); err != nil || cl.Status != inbox.Acquired {
		t.Fatalf("TryBegin without an order key: %+v, %v", cl, err)
	}
	if got := log.take(); got != "set pexpiretime" {
		t.Fatalf("TryBegin without an order key sent %q, want %q", got, "set pexpiretime")
	}

	page, err := s.List(ctx, inbox.ListOptions{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, it := range page.Items {
		listed = append(listed, it.Key)
	}
	if len(listed) != 2 || listed[0] != "free" || listed[1] != "head" {
		t.Fatalf("List = %q, want the records of free and head only", listed)
	}

	// Processed, the head lets a run; the gate moves on.
	if err := s.MarkProcessed(ctx, "head"); err != nil {
		t.Fatal(err)
	}
	if cl, err := s.TryBegin(ctx, "a", inbox.BeginOptions{OrderKey: ok}); err != nil || cl.Status != inbox.Acquired {
		t.Fatalf("TryBegin of the first waiting key after the head: %+v, %v", cl, err)
	}
	if keys, err := c.LRange(ctx, gate, 0, -1).Result(); err != nil || len(keys) != 2 || keys[0] != "a" || keys[1] != "b" {
		t.Fatalf("the gate holds %q (%v), want [a b]", keys, err)
	}
}

// A Cluster client keeps no order: the gates' scripts read keys of other
// hash slots. New sends nothing, so no Cluster need run.
func TestStore_no_order_on_cluster(t *testing.T) {
	t.Parallel()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if s.KeepsOrder() {
		t.Fatal("KeepsOrder true over a *redis.ClusterClient")
	}
	_, err = s.TryBegin(context.Background(), "k", inbox.BeginOptions{OrderKey: "o"})
	if !errors.Is(err, inbox.ErrNotSupported) {
		t.Fatalf("TryBegin with an order key on Cluster: %v, want ErrNotSupported", err)
	}
}
