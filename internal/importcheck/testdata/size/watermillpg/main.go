// The baseline of inboxpg: the same Watermill router, whose handler writes
// to PostgreSQL through pgx's database/sql driver, without the inbox.
package main

import (
	"context"
	"database/sql"
	"log"
	"os"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

func main() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL")) // postgres://...
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	router.AddConsumerHandler("charge", "orders", pubSub, func(msg *message.Message) error {
		_, err := db.ExecContext(msg.Context(), "INSERT INTO charges (order_id) VALUES ($1)", string(msg.Payload))
		return err
	})
	if err := router.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
