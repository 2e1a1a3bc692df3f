// Package sqltest opens the databases the SQL store's tests run against
// (PostgreSQL, MariaDB, SQLite), as the store's URL opener would, and makes
// throwaway inbox tables. Shared by the tests of package sqlstore and of
// package txinbox.
package sqltest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/watermill-inbox/inbox/internal/testenv"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	_ "github.com/watermill-inbox/inbox/stores/sql/mysql"    // the dialect, and the "mysql" driver
	_ "github.com/watermill-inbox/inbox/stores/sql/postgres" // the dialect, and the "pgx" driver
	sqlitedialect "github.com/watermill-inbox/inbox/stores/sql/sqlite"
)

// Ctx is a context for a test's database calls, canceled when it ends.
func Ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// OpenPostgres opens the test PostgreSQL (testenv.Postgres).
func OpenPostgres(t testing.TB) *sql.DB {
	t.Helper()
	return open(t, "pgx", testenv.Postgres.URL(t))
}

// OpenMySQL opens the test MariaDB or MySQL (testenv.MySQL) with
// [MySQLDSN].
func OpenMySQL(t testing.TB) *sql.DB {
	t.Helper()
	return open(t, "mysql", MySQLDSN(t, testenv.MySQL.URL(t)))
}

// MySQLDSN turns a mysql:// URL without parameters into a go-sql-driver
// DSN with the settings of the SQL store's URL opener (parseTime,
// clientFoundRows, interpolateParams).
func MySQLDSN(t testing.TB, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	cfg := mysql.NewConfig()
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, strings.TrimPrefix(u.Path, "/")
	cfg.ParseTime, cfg.ClientFoundRows, cfg.InterpolateParams = true, true, true
	return cfg.FormatDSN()
}

// SQLiteFile returns a new database file in the test's temporary directory.
func SQLiteFile(t testing.TB) string { return filepath.Join(t.TempDir(), "inbox.db") }

// OpenSQLiteFile opens the SQLite database at path with one connection, as
// the store's URL opener does.
func OpenSQLiteFile(t testing.TB, path string) *sql.DB {
	t.Helper()
	db := open(t, "sqlite", sqlitedialect.DSN(path, 10*time.Second))
	db.SetMaxOpenConns(1)
	return db
}

// OpenSQLite opens a new SQLite database file.
func OpenSQLite(t testing.TB) *sql.DB { return OpenSQLiteFile(t, SQLiteFile(t)) }

func open(t testing.TB, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// NewTable returns a fresh inbox table name starting with prefix, created,
// and dropped when the test ends.
func NewTable(t testing.TB, db *sql.DB, d sqlstore.Dialect, prefix string) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	table := prefix + hex.EncodeToString(b[:])
	s, err := sqlstore.New(Ctx(t), db, sqlstore.Options{Dialect: d, Table: table, AutoMigrate: true})
	if err != nil {
		t.Fatalf("creating table %s: %v", table, err)
	}
	_ = s.Close()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, tb := range []string{table, table + "_order"} { // the order of order keys' (PostgreSQL)
			if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+tb); err != nil {
				t.Errorf("dropping %s: %v", tb, err)
			}
		}
	})
	return table
}
