// Package pgdialect links the SQL store's PostgreSQL dialect
// ([sqlstore.Postgres]) into a program, with the database/sql driver of
// github.com/jackc/pgx/v5 (registered as "pgx"), and registers the URL
// schemes postgres:// and postgresql:// with package
// github.com/watermill-inbox/inbox/stores. Import it for its side effects:
//
//	import _ "github.com/watermill-inbox/inbox/stores/sql/postgres"
//
//	store, err := stores.Open(ctx, "postgres://app:secret@db:5432/app?sslmode=disable&migrate=true")
//
// or, over a *sql.DB of your own:
//
//	db, err := sql.Open("pgx", "postgres://app:secret@db:5432/app")
//	store, err := sqlstore.New(ctx, db, sqlstore.Options{Dialect: sqlstore.Postgres})
//
// A postgres:// URL takes the SQL store's parameters (package
// github.com/watermill-inbox/inbox/stores/sql) and libpq's connection
// parameters (sslmode, connect_timeout, application_name, search_path,
// ...; password and sslpassword are masked in logs and errors). Any other
// parameter is an error that names it.
package pgdialect

import (
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/watermill-inbox/inbox/stores"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	"github.com/watermill-inbox/inbox/stores/sql/internal/dialect"
)

// The URL schemes this package registers.
const (
	Scheme           = "postgres"
	SchemePostgreSQL = "postgresql"
)

func init() {
	dialect.Register(&dialect.Driver{
		Dialect:          string(sqlstore.Postgres),
		Schemes:          []string{Scheme, SchemePostgreSQL},
		SecretParams:     []string{"password", "sslpassword"}, // sslpassword: the password of the client's TLS key
		Params:           params,
		Connect:          connect,
		Classify:         classify,
		Cause:            cause,
		Misconfiguration: misconfiguration,
	})
}

// params are the connection parameters of libpq and pgx that a postgres://
// URL may carry.
var params = []string{
	"sslmode", "sslcert", "sslkey", "sslrootcert", "sslpassword", "sslsni", "sslnegotiation",
	"connect_timeout", "application_name", "search_path", "timezone", "options",
	"target_session_attrs", "service", "servicefile", "passfile", "krbsrvname", "krbspn",
	"host", "port", "user", "password", "dbname", "database",
	"statement_cache_capacity", "description_cache_capacity", "default_query_exec_mode",
}

func connect(u *url.URL) (*sql.DB, dialect.Target, error) {
	cfg, err := pgx.ParseConfig(u.String())
	if err != nil {
		// pgx quotes the whole connection string when it cannot parse it,
		// and hides only the password.
		return nil, dialect.Target{}, fmt.Errorf("%w: %s: %v", stores.ErrInvalidURL, stores.Redact(u), stores.Scrub(err.Error(), u))
	}
	return stdlib.OpenDB(*cfg), dialect.Target{
		Dialect: string(sqlstore.Postgres), Database: cfg.Database, User: cfg.User,
		Server: net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))),
	}, nil
}

func classify(err error) dialect.Kind {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return dialect.Other
	}
	switch pg.Code {
	case "40001", "40P01":
		return dialect.Retry
	case "55P03":
		return dialect.LockWait
	case "42P01":
		return dialect.NoTable
	case "23505":
		return dialect.Duplicate
	case "42703":
		return dialect.NoColumn
	case "42701":
		return dialect.DuplicateColumn
	}
	return dialect.Other
}

func cause(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg
	}
	var conn *pgconn.ConnectError
	if errors.As(err, &conn) {
		return conn
	}
	return nil
}

func misconfiguration(t dialect.Target, table string, err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch pg.Code {
		case "28P01":
			return fmt.Sprintf("authentication failed for user %s at %s: check the user and password in the URL", t.User, t.Server)
		case "28000":
			return fmt.Sprintf("the server at %s refused user %s for database %s: check the user in the URL, and that pg_hba.conf lets it in", t.Server, t.User, t.Database)
		case "3D000":
			return fmt.Sprintf("database %s does not exist at %s: create it, or fix the URL's path", t.Database, t.Server)
		case "42P01":
			return dialect.MissingTable(t, table)
		case "42703", "42804":
			return dialect.WrongTable(t, table)
		case "42501":
			return fmt.Sprintf("user %s lacks a right the store needs on table %s in %s: grant SELECT, INSERT, UPDATE and DELETE on it (and CREATE on the schema for migrate=true)", t.User, table, t)
		case "3F000":
			return fmt.Sprintf("the schema of the URL's search_path does not exist in %s: fix search_path, or create the schema", t)
		}
		return ""
	}
	// pgx reports a refused TLS handshake as a plain error.
	if strings.Contains(err.Error(), "server refused TLS connection") {
		return fmt.Sprintf("the server at %s does not accept TLS: add sslmode=disable to the URL, or turn ssl on in the server", t.Server)
	}
	return ""
}
