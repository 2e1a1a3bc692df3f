package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
	"github.com/watermill-inbox/inbox/stores"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
)

func ExampleNew() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)

	db, err := sql.Open("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "inbox.db"), 0))
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

	store, err := stores.Open(ctx, "sqlite://"+filepath.Join(dir, "inbox.db")+"?migrate=true&retention=72h")
	if err != nil {
		panic(err)
	}
	defer store.Close()
	ok, _ := store.IsProcessed(ctx, "rabbit:billing:OrderPlaced:42")
	fmt.Println(ok)
	// Output: false
}

func ExampleNewTxMiddleware() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "app.db"), 0))
	defer db.Close()
	db.SetMaxOpenConns(1)
	if _, err := db.Exec("CREATE TABLE orders (id TEXT PRIMARY KEY)"); err != nil {
		panic(err)
	}
	s, _ := sqlstore.New(ctx, db, sqlstore.Options{Dialect: sqlstore.SQLite, AutoMigrate: true})
	_ = s.Close()

	mw, err := sqlstore.NewTxMiddleware(sqlstore.TxConfig{
		DB: db, Dialect: sqlstore.SQLite, Bus: "rabbit", Group: "billing",
		Alias: keying.StaticAlias("orders"), // in a router, the handler's name by default
	})
	if err != nil {
		panic(err)
	}
	handler := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := sqlstore.TxFromContext(msg.Context())
		// Commits with the inbox mark, or not at all.
		_, err := tx.ExecContext(msg.Context(), "INSERT INTO orders (id) VALUES (?)", string(msg.Payload))
		return nil, err
	})
	msg := message.NewMessage(watermill.NewUUID(), []byte("order-42"))
	for range 3 { // the broker delivers it three times
		if _, err := handler(msg.Copy()); err != nil {
			panic(err)
		}
	}
	var n int
	_ = db.QueryRow("SELECT COUNT(*) FROM orders").Scan(&n)
	fmt.Println(n)
	// Output: 1
}
