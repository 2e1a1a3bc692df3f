package remote_test

import (
	"context"
	"fmt"
	"net/http/httptest"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
	"github.com/watermill-inbox/inbox/stores/memory"
	"github.com/watermill-inbox/inbox/stores/remote"
	"github.com/watermill-inbox/inbox/stores/remote/server"
)

// startService stands in for a running inboxd.
func startService(token string) (url string, stop func()) {
	backing, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	h, err := server.New(server.Config{Store: backing, Token: token})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(h)
	return srv.URL, srv.Close
}

func Example() {
	url, stop := startService("")
	defer stop()

	store, err := remote.New(remote.Options{URL: url})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	ctx := context.Background()
	key := "rabbit:billing:order-created:42"

	claim, err := store.TryBegin(ctx, key, inbox.BeginOptions{Owner: "billing-1"})
	if err != nil {
		panic(err) // wraps inbox.ErrStoreUnavailable when the service is unreachable
	}
	fmt.Println(claim.Status, claim.Lease)
	// ... handle the message, then:
	if err := store.Complete(ctx, key, claim.LeaseID); err != nil {
		panic(err)
	}
	again, _ := store.TryBegin(ctx, key, inbox.BeginOptions{})
	fmt.Println(again.Status)
	// Output:
	// Acquired 30s
	// Processed
}

// Opening the client by URL, as an application configured by environment
// would: the token comes from a file and never appears in logs or errors.
func Example_url() {
	url, stop := startService("")
	defer stop()

	store, err := stores.Open(context.Background(), url+"/?timeout=2s&retries=2&lease=45s")
	if err != nil {
		panic(err)
	}
	defer store.Close()
	claim, err := store.TryBegin(context.Background(), "kafka:orders:paid:7", inbox.BeginOptions{})
	if err != nil {
		panic(err)
	}
	fmt.Println(claim.Status, claim.Lease)
	// Output: Acquired 45s
}

func ExampleStore_Discover() {
	url, stop := startService("a-secret-token-0001")
	defer stop()
	store, err := remote.New(remote.Options{URL: url, Token: "a-secret-token-0001"})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	d, err := store.Discover(context.Background())
	if err != nil {
		panic(err)
	}
	fmt.Println(d.Version, d.Auth, d.LeaseMin, d.LeaseMax, d.LeasePolicy, d.Has("extend"))
	// Output: v1 bearer 30s 2m0s clamp true
}
