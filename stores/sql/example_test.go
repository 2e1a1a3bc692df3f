package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	sqlitedialect "github.com/watermill-inbox/inbox/stores/sql/sqlite"
)

func ExampleNew() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)

	// The dialect's package registers the database/sql driver "sqlite":
	// import sqlitedialect "github.com/watermill-inbox/inbox/stores/sql/sqlite".
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

	c, _ := store.TryBegin(ctx, "rabbit:billing:OrderPlaced:42", inbox.BeginOptions{})
	fmt.Println(c.Status)
	_ = store.Complete(ctx, "rabbit:billing:OrderPlaced:42", c.LeaseID)
	c, _ = store.TryBegin(ctx, "rabbit:billing:OrderPlaced:42", inbox.BeginOptions{})
	fmt.Println(c.Status)
	// Output:
	// Acquired
	// Processed
}

func ExampleDDL() {
	ddl, _ := sqlstore.DDL(sqlstore.MySQL, "inbox")
	fmt.Println(ddl[:len("CREATE TABLE IF NOT EXISTS `inbox`")])
	// Output: CREATE TABLE IF NOT EXISTS `inbox`
}

func Example_url() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)

	// With import _ "github.com/watermill-inbox/inbox/stores/sql/sqlite",
	// which registers sqlite://.
	store, err := stores.Open(ctx, "sqlite://"+filepath.Join(dir, "inbox.db")+"?migrate=true&retention=72h")
	if err != nil {
		panic(err)
	}
	defer store.Close()
	ok, _ := store.IsProcessed(ctx, "rabbit:billing:OrderPlaced:42")
	fmt.Println(ok)
	// Output: false
}

// BeginTxClaim is the building block of the transactional mode; handlers
// get it through package txinbox and the inbox middleware.
func ExampleStore_BeginTxClaim() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", sqlitedialect.DSN(filepath.Join(dir, "app.db"), 0))
	defer db.Close()
	db.SetMaxOpenConns(1) // SQLite has one writer: the transaction's connection
	if _, err := db.Exec("CREATE TABLE orders (id TEXT PRIMARY KEY)"); err != nil {
		panic(err)
	}
	s, err := sqlstore.New(ctx, db, sqlstore.Options{Dialect: sqlstore.SQLite, AutoMigrate: true})
	if err != nil {
		panic(err)
	}
	defer s.Close()

	opts := sqlstore.TxClaimOptions{LockTimeout: 10 * time.Second}
	for range 3 { // the broker delivers the message three times
		tx, end, processed, err := s.BeginTxClaim(ctx, "rabbit:billing:orders:42", opts)
		if err != nil {
			panic(err)
		}
		if processed {
			fmt.Println("duplicate")
			continue
		}
		// Commits with the key's mark, or not at all.
		_, err = tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES (?)", "order-42")
		if err := end(err == nil); err != nil {
			panic(err)
		}
		fmt.Println("applied")
	}
	// Output:
	// applied
	// duplicate
	// duplicate
}
