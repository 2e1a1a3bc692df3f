package sqlitedialect_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	sqlitedialect "github.com/watermill-inbox/inbox/stores/sql/sqlite"
)

// Open a SQLite store by URL; importing the package registers sqlite://.
func Example() {
	ctx := context.Background()
	store, err := stores.Open(ctx, "sqlite::memory:")
	if err != nil {
		panic(err)
	}
	defer store.Close()
	c, _ := store.TryBegin(ctx, "rabbit:billing:OrderPlaced:42", inbox.BeginOptions{})
	fmt.Println(c.Status)
	// Output: Acquired
}

// Make a store over a *sql.DB of your own, opened with the opener's
// settings; importing the package registers the database/sql driver
// "sqlite".
func ExampleDSN() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)

	db, err := sql.Open("sqlite", sqlitedialect.DSN(filepath.Join(dir, "inbox.db"), 0))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // SQLite has one writer
	store, err := sqlstore.New(ctx, db, sqlstore.Options{Dialect: sqlstore.SQLite, AutoMigrate: true})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	ok, _ := store.IsProcessed(ctx, "rabbit:billing:OrderPlaced:42")
	fmt.Println(ok)
	// Output: false
}
