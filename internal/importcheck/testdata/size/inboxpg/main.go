// A PostgreSQL-only program: a Watermill router whose handler runs behind the
// inbox middleware, over a store opened by URL. BENCHMARKS.md gives its size
// against watermillpg's (Watermill and pgx alone).
package main

import (
	"context"
	"log"
	"os"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	inboxmw "github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores"
	_ "github.com/watermill-inbox/inbox/stores/sql/postgres"
)

func main() {
	ctx := context.Background()
	store, err := stores.Open(ctx, os.Getenv("INBOX_STORE_URL")) // postgres://...
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "gochannel", Group: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(ib.Middleware)
	router.AddConsumerHandler("charge", "orders", pubSub, func(msg *message.Message) error {
		log.Printf("charged %s", msg.Payload)
		return nil
	})
	if err := router.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
