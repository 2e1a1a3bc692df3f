package txinbox_test

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
	sqlstore "github.com/watermill-inbox/inbox/stores/sql" // also registers the pgx, mysql and sqlite drivers
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

// openMySQL opens the test server with the settings the SQL store's URL
// opener uses (parseTime, clientFoundRows, interpolateParams).
func openMySQL(t testing.TB) *sql.DB {
	t.Helper()
	u, err := url.Parse(testenv.MySQL.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := mysql.NewConfig()
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, strings.TrimPrefix(u.Path, "/")
	cfg.ParseTime, cfg.ClientFoundRows, cfg.InterpolateParams = true, true, true
	db, err := sql.Open("mysql", cfg.FormatDSN())
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

// newTable returns a fresh inbox table name, created, and dropped when the
// test ends.
func newTable(t testing.TB, db *sql.DB, d sqlstore.Dialect) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	table := "txinbox_test_" + hex.EncodeToString(b[:])
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

func countRows(t testing.TB, db *sql.DB, table, where string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(ctxT(t), "SELECT COUNT(*) FROM "+table+" WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
