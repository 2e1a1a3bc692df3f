// A program that uses the SQL store without importing a dialect package, so
// that no database/sql driver is linked: TestUnlinked_dialect_names_its_package
// runs it. It prints the error of each way in, one a line.
package main

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/watermill-inbox/inbox/stores"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	"github.com/watermill-inbox/inbox/stores/sql/txinbox"
)

// connector is a database/sql connector that never connects: the store
// must refuse the dialect before it uses the database.
type connector struct{}

func (connector) Connect(context.Context) (driver.Conn, error) {
	return nil, errors.New("unlinked: no connection")
}
func (connector) Driver() driver.Driver { return nil }

func main() {
	ctx := context.Background()
	db := sql.OpenDB(connector{})
	_, err := sqlstore.New(ctx, db, sqlstore.Options{Dialect: sqlstore.Postgres})
	fmt.Println("New:", err)
	_, err = txinbox.New(txinbox.Config{DB: db, Dialect: sqlstore.MySQL})
	fmt.Println("txinbox.New:", err)
	_, err = stores.Open(ctx, "sqlite::memory:")
	fmt.Println("stores.Open:", err)
	ddl, err := sqlstore.DDL(sqlstore.SQLite, "")
	fmt.Println("DDL:", err == nil && ddl != "", err)
}
