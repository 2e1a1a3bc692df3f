package mongostore_test

import (
	"context"
	"log"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
	mongostore "github.com/watermill-inbox/inbox/stores/mongo"
)

// A store over a client the application already has. Close leaves the client
// connected.
func ExampleNew() {
	ctx := context.Background()
	client, err := mongo.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:27017"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Disconnect(ctx)

	store, err := mongostore.New(ctx, client, mongostore.Options{Database: "app"})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close() // New created the TTL index: the server deletes expired records

	claim, err := store.TryBegin(ctx, "orders:billing:OrderPlaced:42", inbox.BeginOptions{Owner: "billing-1"})
	if err != nil {
		log.Fatal(err) // wraps inbox.ErrStoreUnavailable: nack and let the broker redeliver
	}
	if claim.Status == inbox.Acquired {
		// ... handle the message, then:
		if err := store.Complete(ctx, "orders:billing:OrderPlaced:42", claim.LeaseID); err != nil {
			log.Fatal(err)
		}
	}
}

// A store opened by URL owns its client: Close disconnects it. MongoDB's own
// connection string options (authSource, replicaSet, ...) go in the same
// query as the store's.
func Example_url() {
	ctx := context.Background()
	store, err := stores.Open(ctx, "mongodb://inbox:secret@db1:27017,db2:27017/app?replicaSet=rs0&authSource=admin&collection=inbox&retention=168h")
	if err != nil {
		log.Fatal(err) // never quotes the password
	}
	defer store.Close()
}
