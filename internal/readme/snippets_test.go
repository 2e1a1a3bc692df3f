package readme_test

// The Go snippets of the README and of docs/: each block marked
// <!-- readme: excerpt internal/readme/snippets_test.go --> is an excerpt
// of this file (TestREADME_every_block_is_held compares them line by line,
// comments included), and TestSnippets_run (snippets_run_test.go) runs
// each function. Change a snippet here and in its page together.

import (
	"context"
	"database/sql"
	"os"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/middleware" // package inboxmw
	"github.com/watermill-inbox/inbox/stores"
	"github.com/watermill-inbox/inbox/stores/memory"
	_ "github.com/watermill-inbox/inbox/stores/redis" // each driver registers its schemes
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	_ "github.com/watermill-inbox/inbox/stores/sql/postgres" // the dialect, with the database/sql driver "pgx"
	"github.com/watermill-inbox/inbox/stores/sql/txinbox"
)

// README, "Quick start".
func quickStart(ctx context.Context, router *message.Router) error {
	store, err := memory.New(memory.Options{}) // or Redis, SQL, ... (see below)
	if err != nil {
		return err
	}
	ib, err := inboxmw.New(inboxmw.Config{
		Store: store,
		Bus:   "rabbit",  // your message bus
		Group: "billing", // your consumer group or queue
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
		poisonQueue,          // outside, only with a filter (below)
		ib.Middleware,        // the inbox
		middleware.Recoverer, // inside: a panic becomes an error, a failed attempt (Fail)
		middleware.Retry{MaxRetries: 3}.Middleware, // inside: in-process retries keep the lease
	)
}

// README, the poison queue's filter.
func poisonFilter(pub message.Publisher) (message.HandlerMiddleware, error) {
	poisonQueue, err := middleware.PoisonQueueWithFilter(pub, "poison", func(err error) bool {
		return !inboxmw.IsTransient(err) // transient: ErrBusy, ErrStoreUnavailable, ErrClosed, ErrAttemptFailed, context errors
	})
	return poisonQueue, err
}

// docs/retries.md, "With a poison queue".
func maxAttempts(router *message.Router, store inbox.LeaseStore, pub message.Publisher) error {
	ib, err := inboxmw.New(inboxmw.Config{Store: store, Bus: "kafka", Group: "billing", MaxAttempts: 5})
	if err != nil {
		return err
	}
	poisonQueue, err := middleware.PoisonQueueWithFilter(pub, "billing.poison", func(err error) bool {
		return !inboxmw.IsTransient(err) // dead keys and other permanent errors
	})
	if err != nil {
		return err
	}
	router.AddMiddleware(poisonQueue, ib.Middleware, middleware.Recoverer)
	return nil
}

// README, "Stores".
func openStore(ctx context.Context) error {
	store, err := stores.Open(ctx, os.Getenv("INBOX_STORE_URL")) // e.g. redis://127.0.0.1:6379/0?retention=72h
	if err != nil {
		return err
	}
	defer store.Close()
	return nil
}

// docs/pipelines.md, "The SQL transactional mode".
func transactional(db *sql.DB, router *message.Router, sub message.Subscriber) error {
	txs, err := txinbox.New(txinbox.Config{DB: db, Dialect: sqlstore.Postgres}) // the inbox table must exist (sqlstore.DDL)
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
		return err // commits with the mark, or rolls back with it
	})
	router.AddMiddleware(ib.Middleware)
	return nil
}
