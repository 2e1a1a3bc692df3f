package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
)

// checkKey is the key the check at Open reads (never writes).
const checkKey = "stores.Open check"

// target names what a URL opens, for the messages of the check at Open:
// database, server and user; never a password.
type target struct {
	dialect  Dialect
	database string // the database name, or the SQLite file
	server   string // host:port; empty for SQLite
	user     string
}

func (t target) String() string {
	if t.dialect == SQLite {
		return "SQLite database " + t.database
	}
	s := fmt.Sprintf("database %s at %s", t.database, t.server)
	if t.user != "" {
		s += " as user " + t.user
	}
	return s
}

// checkTable reads one key through the store's own Get statement, so that
// the table, its columns and the user's right to read it are checked
// without writing anything.
func checkTable(ctx context.Context, s *Store, t target) error {
	if _, err := s.Get(ctx, checkKey); err != nil {
		if classify(err) == kindNoColumn {
			if missing, lerr := s.d.earlierLayout(ctx); lerr == nil && len(missing) > 0 {
				return stores.Misconfigured(fmt.Sprintf("sql store (%s): table %s in %s has the layout of an earlier version of the store (without the column reason): "+
					"migrate it (migrate=true in the URL, inboxctl migrate, or Store.Migrate add the column; so does the ALTER TABLE statement at the end of sqlstore.DDL)",
					t.dialect, s.Table(), t), rootCause(err))
			}
		}
		return openError(ctx, t, s.Table(), "Open", "reading table "+s.Table(), err)
	}
	return nil
}

// openError turns an error met while opening (connecting, asking the
// version, migrating, reading the table) into the error of Open: a mistake
// of configuration wraps stores.ErrMisconfigured and
// inbox.ErrStoreUnavailable and says how to fix it; anything else wraps
// inbox.ErrStoreUnavailable (the store's usual wrapping). Drivers' messages
// quote no password.
//
// at is "Open", or the call that met err on a store opened with check=false.
func openError(ctx context.Context, t target, table, at, step string, err error) error {
	if msg := misconfiguration(t, table, err); msg != "" {
		return stores.Misconfigured(fmt.Sprintf("sql store (%s): %s", t.dialect, msg), rootCause(err))
	}
	op := at + ": " + step + ", " + t.String()
	if errors.Is(ctx.Err(), context.Canceled) {
		return wrapErr(ctx, t.dialect, table, op, err)
	}
	var nerr net.Error
	if ctx.Err() != nil || errors.As(err, &nerr) {
		hint := ""
		if at == "Open" {
			hint = "; is the server up and the address right? check=false in the URL opens without this check"
		}
		return fmt.Errorf("%w: sql store (%s): %s: cannot reach %s: %w%s",
			inbox.ErrStoreUnavailable, t.dialect, at, t, rootCause(err), hint)
	}
	return wrapErr(ctx, t.dialect, table, op, err)
}

// rootCause strips the store's own wrapping (wrapErr's), keeping the
// driver's error.
func rootCause(err error) error {
	var pg *pgconn.PgError
	var my *mysql.MySQLError
	var lite *sqlite.Error
	var conn *pgconn.ConnectError
	var op *net.OpError
	switch {
	case errors.As(err, &pg):
		return pg
	case errors.As(err, &my):
		return my
	case errors.As(err, &lite):
		return lite
	case errors.As(err, &conn):
		return conn
	case errors.As(err, &op):
		return op
	}
	return err
}

// misconfiguration returns what is wrong and how to fix it when err is a
// mistake of configuration, or "".
func misconfiguration(t target, table string, err error) string {
	noTable := fmt.Sprintf("table %s does not exist in %s: add migrate=true to the URL, run Store.Migrate, or apply the statements of sqlstore.DDL", table, t)
	badTable := fmt.Sprintf("table %s in %s is not an inbox table of this version (a column is missing or of another type): use another table name, or migrate it to the statements of sqlstore.DDL", table, t)
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch {
		case pg.Code == "28P01":
			return fmt.Sprintf("authentication failed for user %s at %s: check the user and password in the URL", t.user, t.server)
		case pg.Code == "28000":
			return fmt.Sprintf("the server at %s refused user %s for database %s: check the user in the URL, and that pg_hba.conf lets it in", t.server, t.user, t.database)
		case pg.Code == "3D000":
			return fmt.Sprintf("database %s does not exist at %s: create it, or fix the URL's path", t.database, t.server)
		case pg.Code == "42P01":
			return noTable
		case pg.Code == "42703" || pg.Code == "42804":
			return badTable
		case pg.Code == "42501":
			return fmt.Sprintf("user %s lacks a right the store needs on table %s in %s: grant SELECT, INSERT, UPDATE and DELETE on it (and CREATE on the schema for migrate=true)", t.user, table, t)
		case pg.Code == "3F000":
			return fmt.Sprintf("the schema of the URL's search_path does not exist in %s: fix search_path, or create the schema", t)
		}
		return ""
	}
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		switch my.Number {
		case 1045, 1698: // ER_ACCESS_DENIED_ERROR, ER_ACCESS_DENIED_NO_PASSWORD_ERROR
			return fmt.Sprintf("authentication failed for user %s at %s: check the user and password in the URL", t.user, t.server)
		case 1044: // ER_DBACCESS_DENIED_ERROR
			return fmt.Sprintf("user %s may not use database %s at %s: grant it, or fix the URL's path", t.user, t.database, t.server)
		case 1049: // ER_BAD_DB_ERROR
			return fmt.Sprintf("database %s does not exist at %s: create it, or fix the URL's path", t.database, t.server)
		case 1146: // ER_NO_SUCH_TABLE
			return noTable
		case 1054: // ER_BAD_FIELD_ERROR
			return badTable
		case 1142, 1143: // ER_TABLEACCESS_DENIED_ERROR, ER_COLUMNACCESS_DENIED_ERROR
			return fmt.Sprintf("user %s lacks a right the store needs on table %s in %s: grant SELECT, INSERT, UPDATE and DELETE on it (and CREATE for migrate=true)", t.user, table, t)
		}
		return ""
	}
	var lite *sqlite.Error
	if errors.As(err, &lite) {
		switch {
		case lite.Code()&0xff == sqlite3.SQLITE_CANTOPEN:
			return fmt.Sprintf("cannot open %s: check that its directory exists and is writable", t)
		case lite.Code()&0xff == sqlite3.SQLITE_NOTADB:
			return fmt.Sprintf("%s is not a SQLite database file: fix the URL's path", t)
		case lite.Code()&0xff == sqlite3.SQLITE_READONLY || lite.Code()&0xff == sqlite3.SQLITE_PERM:
			return fmt.Sprintf("%s is read-only for this process: the store writes; fix the file's permissions", t)
		case strings.Contains(lite.Error(), "no such table"):
			return noTable
		case strings.Contains(lite.Error(), "no such column"):
			return badTable
		}
		return ""
	}
	// pgx reports a refused TLS handshake as a plain error.
	if t.dialect == Postgres && strings.Contains(err.Error(), "server refused TLS connection") {
		return fmt.Sprintf("the server at %s does not accept TLS: add sslmode=disable to the URL, or turn ssl on in the server", t.server)
	}
	if t.dialect == MySQL && errors.Is(err, mysql.ErrNoTLS) {
		return fmt.Sprintf("the server at %s does not accept TLS: drop tls from the URL, or configure TLS on the server", t.server)
	}
	return ""
}
