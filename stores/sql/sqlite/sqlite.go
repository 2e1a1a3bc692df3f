// Package sqlitedialect links the SQL store's SQLite dialect
// ([sqlstore.SQLite]) into a program, with the database/sql driver of
// modernc.org/sqlite (pure Go, no cgo; registered as "sqlite"), and
// registers the URL scheme sqlite:// with package
// github.com/watermill-inbox/inbox/stores. Import it for its side effects:
//
//	import _ "github.com/watermill-inbox/inbox/stores/sql/sqlite"
//
//	store, err := stores.Open(ctx, "sqlite:///var/lib/app/inbox.db?migrate=true")
//
// or, over a *sql.DB of your own, opened with [DSN]:
//
//	db, err := sql.Open("sqlite", sqlitedialect.DSN("/var/lib/app/inbox.db", 0))
//	db.SetMaxOpenConns(1)
//	store, err := sqlstore.New(ctx, db, sqlstore.Options{Dialect: sqlstore.SQLite, AutoMigrate: true})
//
// A sqlite:// URL names a file: sqlite:///abs/path.db, sqlite://rel/path.db
// or sqlite:rel/path.db (relative to the working directory), or
// sqlite::memory:. It takes the SQL store's parameters (package
// github.com/watermill-inbox/inbox/stores/sql) and busy_timeout (default
// [DefaultBusyTimeout]); any other parameter is an error that names it. A
// file store opened by URL uses one connection (SQLite has one writer; the
// pool is a cheaper queue than SQLite's busy loop), write-ahead logging and
// immediate transactions. A sqlite::memory: store lives in one connection,
// makes its table itself, and is lost on Close.
package sqlitedialect

import (
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/watermill-inbox/inbox/stores"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	"github.com/watermill-inbox/inbox/stores/sql/internal/dialect"
)

// Scheme is the URL scheme this package registers.
const Scheme = "sqlite"

func init() {
	dialect.Register(&dialect.Driver{
		Dialect:          string(sqlstore.SQLite),
		Schemes:          []string{Scheme},
		Params:           []string{"busy_timeout"},
		Connect:          connect,
		Classify:         classify,
		Cause:            cause,
		Misconfiguration: misconfiguration,
	})
}

// DefaultBusyTimeout is how long a SQLite connection opened by URL waits for
// another process's write lock before failing with inbox.ErrStoreUnavailable.
const DefaultBusyTimeout = 5 * time.Second

// DSN returns the modernc.org/sqlite data source name the sqlite:// opener
// uses for the database file path (or ":memory:"): write-ahead logging,
// synchronous=NORMAL, the busy timeout ([DefaultBusyTimeout] when zero),
// and immediate transactions, so a transaction takes the write lock when it
// begins instead of failing when it first writes.
func DSN(path string, busyTimeout time.Duration) string {
	if busyTimeout <= 0 {
		busyTimeout = DefaultBusyTimeout
	}
	bt := "_pragma=busy_timeout(" + strconv.FormatInt(busyTimeout.Milliseconds(), 10) + ")"
	if path == ":memory:" {
		return ":memory:?" + bt + "&_txlock=immediate"
	}
	return "file:" + path + "?" + bt + "&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
}

// path returns the database path a sqlite URL names:
// sqlite:///abs/path.db, sqlite://rel/path.db or sqlite:rel/path.db
// (relative to the working directory), sqlite::memory:.
func path(u *url.URL) (string, error) {
	var p string
	switch {
	case u.Opaque != "":
		p = u.Opaque // sqlite:relative/path.db, sqlite::memory:
	case u.Host != "":
		p = u.Host + u.Path // sqlite://relative/path.db
	default:
		p = u.Path // sqlite:///absolute/path.db
	}
	if p == "" || p == "/" {
		return "", fmt.Errorf("%w: %s names no database file (sqlite:///abs/path.db, sqlite://rel/path.db, sqlite::memory:)", stores.ErrInvalidURL, stores.Redact(u))
	}
	if strings.ContainsAny(p, "?#") {
		return "", fmt.Errorf("%w: sqlite path %q holds ? or #", stores.ErrInvalidURL, p)
	}
	return p, nil
}

func connect(u *url.URL) (*sql.DB, dialect.Target, error) {
	p, err := path(u)
	if err != nil {
		return nil, dialect.Target{}, err
	}
	bt, err := stores.PopDuration(u.Query(), "busy_timeout")
	if err != nil {
		return nil, dialect.Target{}, err
	}
	db, err := sql.Open("sqlite", DSN(p, bt))
	if err != nil {
		return nil, dialect.Target{}, fmt.Errorf("%w: %s: %v", stores.ErrInvalidURL, stores.Redact(u), err)
	}
	return db, dialect.Target{Dialect: string(sqlstore.SQLite), Database: p}, nil
}

func classify(err error) dialect.Kind {
	var lite *sqlite.Error
	if !errors.As(err, &lite) {
		return dialect.Other
	}
	switch lite.Code() & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return dialect.LockWait
	case sqlite3.SQLITE_CONSTRAINT:
		return dialect.Duplicate
	}
	switch msg := lite.Error(); {
	case strings.Contains(msg, "no such table"):
		return dialect.NoTable
	case strings.Contains(msg, "no such column"):
		return dialect.NoColumn
	case strings.Contains(msg, "duplicate column name"):
		return dialect.DuplicateColumn
	}
	return dialect.Other
}

func cause(err error) error {
	var lite *sqlite.Error
	if errors.As(err, &lite) {
		return lite
	}
	return nil
}

func misconfiguration(t dialect.Target, table string, err error) string {
	var lite *sqlite.Error
	if !errors.As(err, &lite) {
		return ""
	}
	switch code := lite.Code() & 0xff; {
	case code == sqlite3.SQLITE_CANTOPEN:
		return fmt.Sprintf("cannot open %s: check that its directory exists and is writable", t)
	case code == sqlite3.SQLITE_NOTADB:
		return fmt.Sprintf("%s is not a SQLite database file: fix the URL's path", t)
	case code == sqlite3.SQLITE_READONLY || code == sqlite3.SQLITE_PERM:
		return fmt.Sprintf("%s is read-only for this process: the store writes; fix the file's permissions", t)
	case strings.Contains(lite.Error(), "no such table"):
		return dialect.MissingTable(t, table)
	case strings.Contains(lite.Error(), "no such column"):
		return dialect.WrongTable(t, table)
	}
	return ""
}
