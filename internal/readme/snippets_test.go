package readme_test

// The README's Go snippets, compiled: each README block marked
// <!-- readme: excerpt internal/readme/snippets_test.go --> is an excerpt
// of this file (TestREADME_every_block_is_held compares them line by line).
// Change a snippet here and in the README together.

import (
	"context"
	"database/sql"
	"os"

	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/amqp"
	"github.com/watermill-inbox/inbox/kafka"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores"
	"github.com/watermill-inbox/inbox/stores/memory"
	_ "github.com/watermill-inbox/inbox/stores/redis"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	_ "github.com/watermill-inbox/inbox/stores/sql/postgres" // the dialect, with the database/sql driver "pgx"
	"github.com/watermill-inbox/inbox/stores/sql/txinbox"
)

// README, "Quick start".
func quickStart(ctx context.Context, router *message.Router) error {
	store, err := memory.New(memory.Options{})
	if err != nil {
		return err
	}
	ib, err := inboxmw.New(inboxmw.Config{
		Store: store,
		Bus:   "rabbit",
		Group: "billing",
	})
	if err != nil {
		return err
	}

	router.AddMiddleware(ib.Middleware)
	// ... router.Run(ctx) ...

	// After the router has stopped, let pending marks land:
	ib.Close(ctx)
	return nil
}

// README, "Where it goes among Watermill's middlewares".
func middlewareOrder(router *message.Router, ib *inboxmw.Inbox, poisonQueue message.HandlerMiddleware) {
	router.AddMiddleware(
		poisonQueue,
		ib.Middleware,
		middleware.Recoverer,
		middleware.Retry{MaxRetries: 3}.Middleware,
	)
}

// README, the poison queue's filter.
func poisonFilter(pub message.Publisher) (message.HandlerMiddleware, error) {
	poisonQueue, err := middleware.PoisonQueueWithFilter(pub, "poison", func(err error) bool {
		return !inboxmw.IsTransient(err)
	})
	return poisonQueue, err
}

// README, MaxAttempts with a poison queue.
func maxAttempts(router *message.Router, store inbox.LeaseStore, pub message.Publisher) error {
	ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "kafka", Group: "billing", MaxAttempts: 5})
	if err != nil {
		return err
	}
	poisonQueue, err := middleware.PoisonQueueWithFilter(pub, "billing.poison", func(err error) bool {
		return !inboxmw.IsTransient(err)
	})
	if err != nil {
		return err
	}
	router.AddMiddleware(poisonQueue, ib.Middleware, middleware.Recoverer)
	return nil
}

// README, "Stores".
func openStore(ctx context.Context) error {
	store, err := stores.Open(ctx, os.Getenv("INBOX_STORE_URL"))
	if err != nil {
		return err
	}
	defer store.Close()
	return nil
}

// README, "Transactional mode (SQL)".
func transactional(db *sql.DB, router *message.Router, sub message.Subscriber) error {
	txs, err := txinbox.New(txinbox.Config{DB: db, Dialect: sqlstore.Postgres})
	if err != nil {
		return err
	}
	ib, err := inboxmw.New(inboxmw.Config{Store: txs, Bus: "rabbit", Group: "billing"})
	if err != nil {
		return err
	}
	router.AddConsumerHandler("charge", "orders", sub, func(msg *message.Message) error {
		tx, _ := txinbox.TxFromContext(msg.Context())
		_, err := tx.ExecContext(msg.Context(), "INSERT INTO charges (order_id) VALUES ($1)", string(msg.Payload))
		return err
	})
	router.AddMiddleware(ib.Middleware)
	return nil
}

// README, "Kafka and RabbitMQ": amqp.
func rabbitIDs(amqpURI string, store inbox.LeaseStore) (*inboxmw.Inbox, amqp.Config, error) {
	amqpConfig := amqp.NewDurableQueueConfig(amqpURI)
	amqpConfig.Marshaler = inboxamqp.Marshaler{}

	ib, err := inboxmw.New(inboxmw.Config{
		Store: store, Bus: "rabbit", Group: "billing",
		IDSources: []keying.IDSource{
			keying.FromMetadata(keying.DefaultIDMetadataKey),
			inboxamqp.FromMessageID(),
			keying.FromUUID(),
		},
	})
	return ib, amqpConfig, err
}

// README, "Kafka and RabbitMQ": kafka.
func kafkaIDs() inboxmw.Config {
	return inboxmw.Config{
		IDSources: append(keying.DefaultIDSources(), inboxkafka.FromOffset()),
	}
}

// The snippets are compiled, not run.
var _ = []any{quickStart, middlewareOrder, poisonFilter, maxAttempts, openStore, transactional, rabbitIDs, kafkaIDs}
