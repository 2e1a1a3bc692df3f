package txinbox_test

import (
	"database/sql"
	"testing"

	sqlstore "github.com/watermill-inbox/inbox/stores/sql" // also registers the pgx, mysql and sqlite drivers
	"github.com/watermill-inbox/inbox/stores/sql/internal/sqltest"
)

// backend is one database the tests run against.
type backend struct {
	name    string
	dialect sqlstore.Dialect
	open    func(t testing.TB) *sql.DB
}

// backends are the databases of the transactional tests.
var backends = []backend{
	{name: "postgres", dialect: sqlstore.Postgres, open: openPostgres},
	{name: "mariadb", dialect: sqlstore.MySQL, open: openMySQL},
	{name: "sqlite", dialect: sqlstore.SQLite, open: openSQLite},
}

// The databases, as package sqltest opens them.
var (
	ctxT           = sqltest.Ctx
	openPostgres   = sqltest.OpenPostgres
	openMySQL      = sqltest.OpenMySQL
	sqliteFile     = sqltest.SQLiteFile
	openSQLiteFile = sqltest.OpenSQLiteFile
	openSQLite     = sqltest.OpenSQLite
)

// newTable returns a fresh table name, created, and dropped when the test
// ends.
func newTable(t testing.TB, db *sql.DB, d sqlstore.Dialect) string {
	return sqltest.NewTable(t, db, d, "txinbox_test_")
}

func countRows(t testing.TB, db *sql.DB, table, where string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(ctxT(t), "SELECT COUNT(*) FROM "+table+" WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
