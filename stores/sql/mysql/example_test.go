package mysqldialect_test

import (
	"context"
	"database/sql"
	"log"
	"os"

	"github.com/watermill-inbox/inbox/stores"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	_ "github.com/watermill-inbox/inbox/stores/sql/mysql"
)

// Open a MySQL or MariaDB store by URL; the blank import registers
// mysql://.
func Example() {
	ctx := context.Background()
	store, err := stores.Open(ctx, os.Getenv("INBOX_STORE_URL")) // mysql://app:secret@db:3306/app?tls=true&migrate=true
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
}

// Make a store over a *sql.DB of your own, with the settings the URL opener
// uses; the blank import registers the database/sql driver "mysql".
func Example_db() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app?parseTime=true&clientFoundRows=true&interpolateParams=true")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := sqlstore.New(ctx, db, sqlstore.Options{Dialect: sqlstore.MySQL})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
}
