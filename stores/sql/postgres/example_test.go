package pgdialect_test

import (
	"context"
	"database/sql"
	"log"
	"os"

	"github.com/watermill-inbox/inbox/stores"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	_ "github.com/watermill-inbox/inbox/stores/sql/postgres"
)

// Open a PostgreSQL store by URL; the blank import registers postgres://
// and postgresql://.
func Example() {
	ctx := context.Background()
	store, err := stores.Open(ctx, os.Getenv("INBOX_STORE_URL")) // postgres://app:secret@db:5432/app?sslmode=disable&migrate=true
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
}

// Make a store over a *sql.DB of your own; the blank import registers the
// database/sql driver "pgx".
func Example_db() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := sqlstore.New(ctx, db, sqlstore.Options{Dialect: sqlstore.Postgres, AutoMigrate: true})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
}
