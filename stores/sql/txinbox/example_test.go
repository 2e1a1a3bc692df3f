package txinbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/keying"
	inboxmw "github.com/watermill-inbox/inbox/middleware"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	sqlitedialect "github.com/watermill-inbox/inbox/stores/sql/sqlite"
	"github.com/watermill-inbox/inbox/stores/sql/txinbox"
)

func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "txinbox-example")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", sqlitedialect.DSN(filepath.Join(dir, "app.db"), 0))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // SQLite has one writer: the transaction's connection
	if _, err := db.Exec("CREATE TABLE orders (id TEXT PRIMARY KEY)"); err != nil {
		panic(err)
	}
	// The inbox table (or apply sqlstore.DDL in your migrations).
	s, err := sqlstore.New(ctx, db, sqlstore.Options{Dialect: sqlstore.SQLite, AutoMigrate: true})
	if err != nil {
		panic(err)
	}
	_ = s.Close()

	txs, err := txinbox.New(txinbox.Config{DB: db, Dialect: sqlstore.SQLite})
	if err != nil {
		panic(err)
	}
	defer txs.Close()
	ib, err := inboxmw.New(inboxmw.Config{
		Store: txs, Bus: "rabbit", Group: "billing",
		Alias: keying.StaticAlias("orders"), // in a router, the handler's name by default
	})
	if err != nil {
		panic(err)
	}
	defer ib.Close(ctx)

	handler := ib.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := txinbox.TxFromContext(msg.Context())
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
	ok, _ := txs.IsProcessed(ctx, "rabbit:billing:orders:"+msg.UUID)
	fmt.Println(ok)
	// Output:
	// 1
	// true
}
