package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
)

// The URL schemes this package registers with
// [github.com/watermill-inbox/inbox/stores].
//
// Besides the parameters listed in the package documentation, every SQL URL
// takes check (shared by all stores, default true), and its durations
// (retention, lease, cleanup_interval, busy_timeout) may start with days:
// retention=7d, retention=1d12h.
//
// Checks at Open: a store opened by URL connects (so authenticates), asks a
// MySQL-protocol server its version, creates the table when migrate=true,
// then reads one key through its own Get statement, which checks that the
// table exists with the store's columns and that the user may read it; it
// writes nothing. A mistake is an error wrapping
// [github.com/watermill-inbox/inbox/stores.ErrMisconfigured] and
// [inbox.ErrStoreUnavailable] that says how to fix it:
//
//	sql store (postgres): table inbox does not exist in database test at 127.0.0.1:5432 as user postgres: add migrate=true to the URL, run Store.Migrate, or apply the statements of sqlstore.DDL (ERROR: relation "inbox" does not exist (SQLSTATE 42P01))
//	sql store (mysql): authentication failed for user root at 127.0.0.1:3306: check the user and password in the URL (Error 1045 (28000): Access denied for user 'root'@'127.0.0.1' (using password: YES))
//	sql store (postgres): database app does not exist at 127.0.0.1:5432: create it, or fix the URL's path (FATAL: database "app" does not exist (SQLSTATE 3D000))
//
// Likewise for a role the server refuses, a table of another layout, a
// table of the earlier layout of this store (the fix: migrate), a missing
// right, a SQLite path that cannot be opened or is not a database. A
// server that does not answer wraps [inbox.ErrStoreUnavailable] only
// ("sql store (postgres): Open: cannot reach database test at
// 127.0.0.1:5432 as user postgres: ...").
//
// check=false sends nothing at Open: the same mistakes then fail the
// store's calls with [inbox.ErrStoreUnavailable]. It excludes migrate=true on
// PostgreSQL and MySQL (creating the table needs the server; SQLite, which
// needs none, migrates as asked). A mysql:// store opened with check=false
// asks the server its version (to tell MariaDB from MySQL, which choose
// different statements) at its first call that reaches the server.
//
// [New], which takes the caller's *sql.DB, checks less: it asks a
// MySQL-protocol server its version and, with [Options.AutoMigrate], creates
// the table; it neither pings nor reads the table.
const (
	SchemePostgres   = "postgres"
	SchemePostgreSQL = "postgresql"
	SchemeMySQL      = "mysql"
	SchemeSQLite     = "sqlite"
)

// secretParams are the parameters of the SQL URLs that carry secrets:
// libpq's and pgx's password and sslpassword (the password of the client's
// TLS key). A MySQL URL carries its password in the user info only. They are
// registered with [stores.RegisterSecretParams], so that [stores.Redact]
// masks them in logs and errors.
var secretParams = []string{"password", "sslpassword"}

func init() {
	stores.RegisterSecretParams(secretParams...)
	stores.Register(SchemePostgres, stores.OpenerFunc(openPostgres))
	stores.Register(SchemePostgreSQL, stores.OpenerFunc(openPostgres))
	stores.Register(SchemeMySQL, stores.OpenerFunc(openMySQL))
	stores.Register(SchemeSQLite, stores.OpenerFunc(openSQLite))
}

// storeParams are the parameters every SQL URL takes besides the shared
// retention and lease.
var storeParams = []string{"table", "migrate", "cleanup_interval", "cleanup_batch", "max_conns"}

type urlOptions struct {
	opts     Options
	maxConns int
	lazy     bool // check=false: no check at Open
}

func popStoreParams(q url.Values, p stores.Params, d Dialect) (urlOptions, error) {
	o := urlOptions{opts: Options{Dialect: d, Retention: p.Retention, Lease: p.Lease}, lazy: p.Lazy}
	if v, ok, err := stores.PopString(q, "table"); err != nil {
		return o, err
	} else if ok {
		if err := ValidateTable(v); err != nil {
			return o, fmt.Errorf("%w: parameter table: %v", stores.ErrInvalidURL, err)
		}
		o.opts.Table = v
	}
	if v, ok, err := stores.PopString(q, "migrate"); err != nil {
		return o, err
	} else if ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return o, fmt.Errorf("%w: parameter migrate=%q is not true or false", stores.ErrInvalidURL, v)
		}
		o.opts.AutoMigrate = b
		if b && p.Lazy && d != SQLite {
			return o, fmt.Errorf("%w: parameters migrate=true and check=false exclude each other: creating the table needs the database server at Open; migrate once (migrate=true, Store.Migrate or sqlstore.DDL), then open with check=false", stores.ErrInvalidURL)
		}
	}
	d2, err := stores.PopDuration(q, "cleanup_interval")
	if err != nil {
		return o, err
	}
	o.opts.CleanupInterval = d2
	for name, dst := range map[string]*int{"cleanup_batch": &o.opts.CleanupBatch, "max_conns": &o.maxConns} {
		if v, ok, err := stores.PopString(q, name); err != nil {
			return o, err
		} else if ok {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return o, fmt.Errorf("%w: parameter %s=%q is not a positive integer", stores.ErrInvalidURL, name, v)
			}
			*dst = n
		}
	}
	return o, nil
}

// popDriverParams moves the parameters in allowed from q to a new set and
// rejects what is left.
func popDriverParams(scheme string, q url.Values, allowed []string) (url.Values, error) {
	out := url.Values{}
	for _, name := range allowed {
		if vs, ok := q[name]; ok {
			out[name] = vs
			delete(q, name)
		}
	}
	return out, stores.RejectUnknown(scheme, q, append(append([]string{}, storeParams...), allowed...)...)
}

// openDB makes the store of a URL over db, which it owns. Unless o.lazy
// (check=false), it checks the store works: it connects (authenticating),
// then New runs (asking a MySQL-protocol server its version, creating the
// table with migrate=true), then it reads one key through the store's Get
// statement, which checks the table and the user's rights on it. With
// o.lazy it sends nothing: New runs now on PostgreSQL and SQLite, where it
// needs no server without migrate=true; on MySQL the store asks the server
// its version at its first call.
func openDB(ctx context.Context, db *sql.DB, o urlOptions, t target) (stores.Store, error) {
	if o.maxConns > 0 {
		db.SetMaxOpenConns(o.maxConns)
	}
	if o.opts.Table == "" {
		o.opts.Table = DefaultTable
	}
	fail := func(step string, err error) (stores.Store, error) {
		_ = db.Close()
		return nil, openError(ctx, t, o.opts.Table, "Open", step, err)
	}
	if o.lazy && o.opts.Dialect == MySQL {
		// New would ask the server its version: the store asks at its
		// first call instead.
		opts := o.opts
		opts.setDefaults()
		if err := opts.Validate(); err != nil {
			_ = db.Close()
			return nil, err
		}
		s, err := newStore(db, opts)
		if err != nil {
			_ = db.Close()
			return nil, err
		}
		s.d.ownsDB = true
		if opts.CleanupInterval > 0 {
			s.d.startJanitor()
		}
		return s, nil
	}
	if !o.lazy {
		if err := db.PingContext(ctx); err != nil {
			return fail("connecting", err)
		}
	}
	s, err := New(ctx, db, o.opts)
	if err != nil {
		if errors.Is(err, inbox.ErrInvalidArgument) {
			_ = db.Close()
			return nil, err
		}
		return fail("asking the server version or migrating", err)
	}
	s.d.ownsDB = true
	if !o.lazy {
		if err := checkTable(ctx, s, t); err != nil {
			_ = s.Close()
			return nil, err
		}
	}
	return s, nil
}

// pgParams are the connection parameters of libpq and pgx that a postgres://
// URL may carry.
var pgParams = []string{
	"sslmode", "sslcert", "sslkey", "sslrootcert", "sslpassword", "sslsni", "sslnegotiation",
	"connect_timeout", "application_name", "search_path", "timezone", "options",
	"target_session_attrs", "service", "servicefile", "passfile", "krbsrvname", "krbspn",
	"host", "port", "user", "password", "dbname", "database",
	"statement_cache_capacity", "description_cache_capacity", "default_query_exec_mode",
}

func openPostgres(ctx context.Context, u *url.URL, p stores.Params) (stores.Store, error) {
	q := u.Query()
	o, err := popStoreParams(q, p, Postgres)
	if err != nil {
		return nil, err
	}
	drv, err := popDriverParams(u.Scheme, q, pgParams)
	if err != nil {
		return nil, err
	}
	c := *u
	c.RawQuery = drv.Encode()
	cfg, err := pgx.ParseConfig(c.String())
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", stores.ErrInvalidURL, stores.Redact(u), redactErr(err, u))
	}
	return openDB(ctx, stdlib.OpenDB(*cfg), o, target{
		dialect: Postgres, database: cfg.Database, user: cfg.User,
		server: net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))),
	})
}

// myParams are the go-sql-driver/mysql parameters a mysql:// URL may carry.
// parseTime and clientFoundRows are always on; interpolateParams defaults to
// true (one round trip per statement instead of prepare, execute, close).
var myParams = []string{
	"tls", "timeout", "readTimeout", "writeTimeout", "charset", "collation",
	"allowCleartextPasswords", "allowNativePasswords", "allowOldPasswords", "allowFallbackToPlaintext",
	"checkConnLiveness", "interpolateParams", "maxAllowedPacket", "serverPubKey", "compress",
	"rejectReadOnly", "connectionAttributes",
}

// mysqlConfig turns a mysql:// URL (its store parameters removed) into a
// go-sql-driver configuration: mysql://user:password@host:port/database?tls=true.
func mysqlConfig(u *url.URL) (*mysql.Config, error) {
	q := u.Query()
	drv, err := popDriverParams(u.Scheme, q, myParams)
	if err != nil {
		return nil, err
	}
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

func openMySQL(ctx context.Context, u *url.URL, p stores.Params) (stores.Store, error) {
	q := u.Query()
	o, err := popStoreParams(q, p, MySQL)
	if err != nil {
		return nil, err
	}
	c := *u
	c.RawQuery = q.Encode()
	cfg, err := mysqlConfig(&c)
	if err != nil {
		return nil, err
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", stores.ErrInvalidURL, stores.Redact(u), err)
	}
	return openDB(ctx, sql.OpenDB(conn), o, target{dialect: MySQL, database: cfg.DBName, server: cfg.Addr, user: cfg.User})
}

// DefaultBusyTimeout is how long a SQLite connection opened by URL waits for
// another process's write lock before failing with inbox.ErrStoreUnavailable.
const DefaultBusyTimeout = 5 * time.Second

// SQLiteDSN returns the modernc.org/sqlite data source name the sqlite://
// opener uses for the database file path (or ":memory:"): write-ahead
// logging, synchronous=NORMAL, the busy timeout, and immediate
// transactions, so a transaction takes the write lock when it begins instead
// of failing when it first writes.
func SQLiteDSN(path string, busyTimeout time.Duration) string {
	if busyTimeout <= 0 {
		busyTimeout = DefaultBusyTimeout
	}
	bt := "_pragma=busy_timeout(" + strconv.FormatInt(busyTimeout.Milliseconds(), 10) + ")"
	if path == ":memory:" {
		return ":memory:?" + bt + "&_txlock=immediate"
	}
	return "file:" + path + "?" + bt + "&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
}

// sqlitePath returns the database path a sqlite URL names:
// sqlite:///abs/path.db, sqlite://rel/path.db or sqlite:rel/path.db
// (relative to the working directory), sqlite::memory:.
func sqlitePath(u *url.URL) (string, error) {
	var path string
	switch {
	case u.Opaque != "":
		path = u.Opaque // sqlite:relative/path.db, sqlite::memory:
	case u.Host != "":
		path = u.Host + u.Path // sqlite://relative/path.db
	default:
		path = u.Path // sqlite:///absolute/path.db
	}
	if path == "" || path == "/" {
		return "", fmt.Errorf("%w: %s names no database file (sqlite:///abs/path.db, sqlite://rel/path.db, sqlite::memory:)", stores.ErrInvalidURL, stores.Redact(u))
	}
	if strings.ContainsAny(path, "?#") {
		return "", fmt.Errorf("%w: sqlite path %q holds ? or #", stores.ErrInvalidURL, path)
	}
	return path, nil
}

func openSQLite(ctx context.Context, u *url.URL, p stores.Params) (stores.Store, error) {
	path, err := sqlitePath(u)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	o, err := popStoreParams(q, p, SQLite)
	if err != nil {
		return nil, err
	}
	bt, err := stores.PopDuration(q, "busy_timeout")
	if err != nil {
		return nil, err
	}
	if err := stores.RejectUnknown(u.Scheme, q, append(append([]string{}, storeParams...), "busy_timeout")...); err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", SQLiteDSN(path, bt))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", stores.ErrInvalidURL, stores.Redact(u), err)
	}
	if path == ":memory:" {
		// Each connection would have its own empty database: keep one, and
		// create the table, since nothing else can.
		o.maxConns = 1
		db.SetConnMaxLifetime(0)
		db.SetConnMaxIdleTime(0)
		o.opts.AutoMigrate = true
	} else if o.maxConns == 0 {
		o.maxConns = 1 // one writer at a time: queue in the pool, not in SQLite's busy loop
	}
	return openDB(ctx, db, o, target{dialect: SQLite, database: path})
}

// redactErr removes u's secrets from a driver's parse error: the password of
// the user info and the values of query parameters such as password and
// sslpassword (pgx quotes the whole connection string when it cannot parse
// it, and hides only the password), with the one list of package stores.
func redactErr(err error, u *url.URL) string { return stores.Scrub(err.Error(), u) }
