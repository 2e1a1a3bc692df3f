package sqlstore_test

import (
	"context"
	"database/sql"
	"testing"

	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	"github.com/watermill-inbox/inbox/stores/sql/internal/sqltest"
)

// backend is one database the tests run against.
type backend struct {
	name    string
	dialect sqlstore.Dialect
	open    func(t testing.TB) *sql.DB
	// mysql8 runs the MySQL 8 statements (no RETURNING) on MariaDB.
	mysql8 bool
}

var backends = []backend{
	{name: "postgres", dialect: sqlstore.Postgres, open: openPostgres},
	{name: "mariadb", dialect: sqlstore.MySQL, open: openMySQL},
	{name: "mysql8-path-on-mariadb", dialect: sqlstore.MySQL, open: openMySQL, mysql8: true},
	{name: "sqlite", dialect: sqlstore.SQLite, open: openSQLite},
}

// The databases, as package sqltest opens them.
var (
	ctxT         = sqltest.Ctx
	openPostgres = sqltest.OpenPostgres
	openMySQL    = sqltest.OpenMySQL
	openSQLite   = sqltest.OpenSQLite
)

// newTable returns a fresh table name, created, and dropped when the test
// ends.
func newTable(t testing.TB, db *sql.DB, d sqlstore.Dialect) string {
	return sqltest.NewTable(t, db, d, "inbox_test_")
}

// newStore returns a store on db's table with opts (Dialect and Table filled
// in), closed when the test ends.
func newStore(t testing.TB, b backend, db *sql.DB, table string, opts sqlstore.Options) *sqlstore.Store {
	t.Helper()
	opts.Dialect, opts.Table = b.dialect, table
	if b.mysql8 && opts.CleanupInterval == 0 {
		// UseMySQL8Path rewrites the statements the janitor reads.
		opts.DisableCleanup = true
	}
	s, err := sqlstore.New(ctxT(t), db, opts)
	if err != nil {
		t.Fatal(err)
	}
	if b.mysql8 {
		sqlstore.UseMySQL8Path(s)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// dropTables drops tables, ignoring errors: a test's clean-up.
func dropTables(db *sql.DB, tables ...string) {
	for _, tb := range tables {
		_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tb)
	}
}
