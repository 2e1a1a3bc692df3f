// Package mysqldialect links the SQL store's MySQL and MariaDB dialect
// ([sqlstore.MySQL]) into a program, with the database/sql driver of
// github.com/go-sql-driver/mysql (registered as "mysql"), and registers the
// URL scheme mysql:// with package github.com/watermill-inbox/inbox/stores.
// Import it for its side effects:
//
//	import _ "github.com/watermill-inbox/inbox/stores/sql/mysql"
//
//	store, err := stores.Open(ctx, "mysql://app:secret@db:3306/app?tls=true&migrate=true")
//
// or, over a *sql.DB of your own (with the settings the URL opener uses):
//
//	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app?parseTime=true&clientFoundRows=true&interpolateParams=true")
//	store, err := sqlstore.New(ctx, db, sqlstore.Options{Dialect: sqlstore.MySQL})
//
// A mysql:// URL names one database in its path and takes the SQL store's
// parameters (package github.com/watermill-inbox/inbox/stores/sql) and
// go-sql-driver's (tls, timeout, readTimeout, writeTimeout, charset,
// collation, interpolateParams, ...), always with parseTime=true and
// clientFoundRows=true, and with interpolateParams=true unless set (one
// round trip per statement instead of three). Any other parameter is an
// error that names it.
package mysqldialect

import (
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/watermill-inbox/inbox/stores"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	"github.com/watermill-inbox/inbox/stores/sql/internal/dialect"
)

// Scheme is the URL scheme this package registers.
const Scheme = "mysql"

func init() {
	dialect.Register(&dialect.Driver{
		Dialect:          string(sqlstore.MySQL),
		Schemes:          []string{Scheme},
		Params:           params,
		Connect:          connect,
		Classify:         classify,
		Cause:            cause,
		Misconfiguration: misconfiguration,
	})
}

// params are the go-sql-driver/mysql parameters a mysql:// URL may carry.
// parseTime and clientFoundRows are always on; interpolateParams defaults to
// true (one round trip per statement instead of prepare, execute, close).
var params = []string{
	"tls", "timeout", "readTimeout", "writeTimeout", "charset", "collation",
	"allowCleartextPasswords", "allowNativePasswords", "allowOldPasswords", "allowFallbackToPlaintext",
	"checkConnLiveness", "interpolateParams", "maxAllowedPacket", "serverPubKey", "compress",
	"rejectReadOnly", "connectionAttributes",
}

// config turns a mysql:// URL whose query holds only params into a
// go-sql-driver configuration: mysql://user:password@host:port/database?tls=true.
func config(u *url.URL) (*mysql.Config, error) {
	drv := u.Query()
	if !drv.Has("interpolateParams") {
		drv.Set("interpolateParams", "true")
	}
	for _, name := range []string{"interpolateParams", "tls"} {
		if len(drv[name]) > 1 {
			return nil, fmt.Errorf("%w: parameter %s is given %d times", stores.ErrInvalidURL, name, len(drv[name]))
		}
	}
	cfg, err := mysql.ParseDSN("/?" + drv.Encode())
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", stores.ErrInvalidURL, stores.Redact(u), err)
	}
	if u.Opaque != "" || u.Host == "" {
		return nil, fmt.Errorf("%w: %s: want mysql://user:password@host:port/database", stores.ErrInvalidURL, stores.Redact(u))
	}
	cfg.Net = "tcp"
	cfg.Addr = u.Host
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		cfg.Addr = net.JoinHostPort(strings.Trim(u.Host, "[]"), "3306")
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if cfg.DBName == "" || strings.Contains(cfg.DBName, "/") {
		return nil, fmt.Errorf("%w: %s: the path must name one database (mysql://host:3306/database)", stores.ErrInvalidURL, stores.Redact(u))
	}
	cfg.ParseTime = true
	cfg.ClientFoundRows = true
	return cfg, nil
}

func connect(u *url.URL) (*sql.DB, dialect.Target, error) {
	cfg, err := config(u)
	if err != nil {
		return nil, dialect.Target{}, err
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, dialect.Target{}, fmt.Errorf("%w: %s: %v", stores.ErrInvalidURL, stores.Redact(u), err)
	}
	return sql.OpenDB(conn), dialect.Target{Dialect: string(sqlstore.MySQL), Database: cfg.DBName, Server: cfg.Addr, User: cfg.User}, nil
}

func classify(err error) dialect.Kind {
	var my *mysql.MySQLError
	if !errors.As(err, &my) {
		return dialect.Other
	}
	switch my.Number {
	case 1213: // ER_LOCK_DEADLOCK
		return dialect.Retry
	case 1205: // ER_LOCK_WAIT_TIMEOUT
		return dialect.LockWait
	case 1146: // ER_NO_SUCH_TABLE
		return dialect.NoTable
	case 1062: // ER_DUP_ENTRY
		return dialect.Duplicate
	case 1054: // ER_BAD_FIELD_ERROR
		return dialect.NoColumn
	case 1060: // ER_DUP_FIELDNAME
		return dialect.DuplicateColumn
	}
	return dialect.Other
}

func cause(err error) error {
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		return my
	}
	return nil
}

func misconfiguration(t dialect.Target, table string, err error) string {
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		switch my.Number {
		case 1045, 1698: // ER_ACCESS_DENIED_ERROR, ER_ACCESS_DENIED_NO_PASSWORD_ERROR
			return fmt.Sprintf("authentication failed for user %s at %s: check the user and password in the URL", t.User, t.Server)
		case 1044: // ER_DBACCESS_DENIED_ERROR
			return fmt.Sprintf("user %s may not use database %s at %s: grant it, or fix the URL's path", t.User, t.Database, t.Server)
		case 1049: // ER_BAD_DB_ERROR
			return fmt.Sprintf("database %s does not exist at %s: create it, or fix the URL's path", t.Database, t.Server)
		case 1146: // ER_NO_SUCH_TABLE
			return dialect.MissingTable(t, table)
		case 1054: // ER_BAD_FIELD_ERROR
			return dialect.WrongTable(t, table)
		case 1142, 1143: // ER_TABLEACCESS_DENIED_ERROR, ER_COLUMNACCESS_DENIED_ERROR
			return fmt.Sprintf("user %s lacks a right the store needs on table %s in %s: grant SELECT, INSERT, UPDATE and DELETE on it (and CREATE for migrate=true)", t.User, table, t)
		}
		return ""
	}
	if errors.Is(err, mysql.ErrNoTLS) {
		return fmt.Sprintf("the server at %s does not accept TLS: drop tls from the URL, or configure TLS on the server", t.Server)
	}
	return ""
}
