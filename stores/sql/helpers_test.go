package sqlstore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/watermill-inbox/inbox/internal/testenv"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
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

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func openPostgres(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", testenv.Postgres.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func openMySQL(t testing.TB) *sql.DB {
	t.Helper()
	dsn, err := sqlstore.MySQLDSN(testenv.MySQL.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// sqliteFile returns a new database file in the test's temporary directory.
func sqliteFile(t testing.TB) string {
	return filepath.Join(t.TempDir(), "inbox.db")
}

func openSQLiteFile(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", sqlstore.SQLiteDSN(path, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func openSQLite(t testing.TB) *sql.DB { return openSQLiteFile(t, sqliteFile(t)) }

// newTable returns a fresh table name, created, and dropped when the test
// ends.
func newTable(t testing.TB, db *sql.DB, d sqlstore.Dialect) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	table := "inbox_test_" + hex.EncodeToString(b[:])
	s, err := sqlstore.New(ctxT(t), db, sqlstore.Options{Dialect: d, Table: table, AutoMigrate: true})
	if err != nil {
		t.Fatalf("creating table %s: %v", table, err)
	}
	_ = s.Close()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+table); err != nil {
			t.Errorf("dropping %s: %v", table, err)
		}
	})
	return table
}

// newStore returns a store on db's table with opts (Dialect and Table filled
// in), closed when the test ends.
func newStore(t testing.TB, b backend, db *sql.DB, table string, opts sqlstore.Options) *sqlstore.Store {
	t.Helper()
	opts.Dialect, opts.Table = b.dialect, table
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
