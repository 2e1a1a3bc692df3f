package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"math"
	"time"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
)

// A store over a client the application already has. The store does not
// close it.
func ExampleNew() {
	client := redis.NewClient(&redis.Options{
		Addr:                  "127.0.0.1:6379",
		ContextTimeoutEnabled: true, // lets Options.Timeout reach the socket
	})
	defer client.Close()

	store, err := redisstore.New(client, redisstore.Options{
		Prefix:    "orders-inbox:",
		Retention: 72 * time.Hour,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	ctx := context.Background()
	claim, err := store.TryBegin(ctx, "kafka:billing:OrderPlaced:42", inbox.BeginOptions{Owner: "billing-1"})
	if err != nil {
		log.Fatal(err) // wraps inbox.ErrStoreUnavailable when Redis is down
	}
	if claim.Status == inbox.Acquired {
		// ... handle the message, then:
		if err := store.Complete(ctx, "kafka:billing:OrderPlaced:42", claim.LeaseID); err != nil {
			log.Fatal(err)
		}
	}
}

// A Redis Cluster: any UniversalClient works, since every operation touches
// one key.
func ExampleNew_cluster() {
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"},
		ContextTimeoutEnabled: true,
	})
	defer client.Close()
	store, err := redisstore.New(client, redisstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
}

// With Sentinel: a failover client follows the master through failovers.
// By URL: redis://sentinel1:26379/0?master_name=mymaster&addr=sentinel2:26379.
func ExampleNew_sentinel() {
	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            "mymaster",
		SentinelAddrs:         []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"},
		ContextTimeoutEnabled: true,
	})
	defer client.Close()
	store, err := redisstore.New(client, redisstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
}

// Opening by URL (a blank import of the package registers redis:// and
// rediss://). The store owns the client it makes and closes it on Close.
func Example_openURL() {
	store, err := stores.Open(context.Background(),
		"redis://127.0.0.1:6379/0?prefix=inbox:&retention=168h&lease=30s&timeout=5s&dial_timeout=2s")
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	fmt.Println("opened")
}

// Watermill's own Deduplicator, sharing its keys through Redis. Prefer the
// inbox middleware: see [redisstore.ExpiringKeyRepository] for why.
func ExampleNewExpiringKeyRepository() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	repo, err := redisstore.NewExpiringKeyRepository(client, redisstore.ExpiringKeyRepositoryOptions{Window: 10 * time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	dedup := &middleware.Deduplicator{
		KeyFactory: middleware.NewMessageHasherSHA256(math.MaxInt64),
		Repository: repo,
		Timeout:    5 * time.Second,
	}
	_ = dedup.Middleware // router.AddMiddleware(dedup.Middleware)
}
