package remote_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/remote"
	"github.com/watermill-inbox/inbox/stores/remote/server"
)

// BenchmarkTryBeginComplete measures one claim and its mark of a new key:
// against a store used directly, and through the remote client and inboxd's
// handler over loopback HTTP in front of the same kind of store. Compare the
// pairs from one run (benchstat): the difference is the protocol's cost.
func BenchmarkTryBeginComplete(b *testing.B) {
	viaRemote := func(b *testing.B, backing inbox.LeaseStore) inbox.LeaseStore {
		return newClient(b, remote.Options{URL: serve(b, server.Config{Store: backing})})
	}
	b.Run("direct-memory", func(b *testing.B) { benchPair(b, newMemory(b, 0)) })
	b.Run("remote-memory", func(b *testing.B) { benchPair(b, viaRemote(b, newMemory(b, 0))) })
	b.Run("direct-redis", func(b *testing.B) { benchPair(b, redisBacking(b)) })
	b.Run("remote-redis", func(b *testing.B) { benchPair(b, viaRemote(b, redisBacking(b))) })
}

// benchRedis returns a Redis store for a benchmark; redis_test.go sets it
// (under its build constraint).
var benchRedis func(b *testing.B) inbox.LeaseStore

func redisBacking(b *testing.B) inbox.LeaseStore {
	if benchRedis == nil {
		b.Skip("the Redis pairs need -tags redis_p2 (see redis_test.go)")
	}
	return benchRedis(b)
}

func benchPair(b *testing.B, s inbox.LeaseStore) {
	ctx := context.Background()
	// Warm up connections and the client's discovery outside the timing.
	c, err := s.TryBegin(ctx, "warm", inbox.BeginOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Complete(ctx, "warm", c.LeaseID); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		key := "bench:" + strconv.Itoa(i)
		c, err := s.TryBegin(ctx, key, inbox.BeginOptions{})
		if err != nil || c.Status != inbox.Acquired {
			b.Fatalf("TryBegin(%s): %+v, %v", key, c, err)
		}
		if err := s.Complete(ctx, key, c.LeaseID); err != nil {
			b.Fatal(err)
		}
	}
}
