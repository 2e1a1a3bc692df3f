package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/faultproxy"
	"github.com/watermill-inbox/inbox/stores"
	redisstore "github.com/watermill-inbox/inbox/stores/redis"
	"github.com/watermill-inbox/inbox/stores/remote"
	"github.com/watermill-inbox/inbox/stores/remote/server"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	_ "github.com/watermill-inbox/inbox/stores/sql/mysql"    // the dialect, and the database/sql driver "mysql"
	_ "github.com/watermill-inbox/inbox/stores/sql/postgres" // the dialect, and the database/sql driver "pgx"
	sqlitedialect "github.com/watermill-inbox/inbox/stores/sql/sqlite"
)

// retention of every benchmark key: long enough for a run, short enough that
// Redis forgets what a crashed run left behind.
const retention = 15 * time.Minute

// env holds the stores the router trials at one store distance share: one
// Redis client, the floors, one PostgreSQL pool and table (and the floor's
// table), one MariaDB pool and table, one SQLite file, one inboxd in front
// of Redis. Each trial gets a queue or topic of its own, and so a consumer
// group and inbox keys of its own. close removes what the env created.
//
// With a store round-trip time (-store-rtt), every connection to Redis,
// PostgreSQL and MariaDB goes through a proxy of the env's own
// (internal/faultproxy) that holds the server's replies for rtt.
type env struct {
	run string // unique per env, in key prefixes and table names
	rtt time.Duration
	// proxies, one per service reached, when rtt > 0.
	proxies []*faultproxy.Proxy

	redis      *redis.Client
	redisStore *redisstore.Store
	dedupRepo  *redisstore.ExpiringKeyRepository
	floor      *floor // floor-redis: a claim, no mark
	floor2     *floor // floor2-redis: a claim and a mark
	floor2f    *floor // floor2f-redis: a claim and a mark under its lease id

	pg         *sql.DB
	pgStore    *sqlstore.Store
	pgTable    string
	pgFloor2   *floor // floor2-postgres, on pgFloorTable
	pgFloorTab string

	my      *sql.DB
	myStore *sqlstore.Store
	myTable string

	liteDir   string
	lite      *sql.DB
	liteStore *sqlstore.Store

	remoteBacking *redisstore.Store
	remoteSrv     *http.Server
	remoteStore   *remote.Store
}

// openRedis opens a Redis store by URL: base with the harness's retention,
// a pool as large as e.redis's, and params.
func openRedis(ctx context.Context, base string, params map[string]string) (*redisstore.Store, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("redis URL: %w", err)
	}
	q := u.Query()
	q.Set("retention", retention.String())
	q.Set("pool_size", "64")
	for k, v := range params {
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	s, err := stores.Open(ctx, u.String())
	if err != nil {
		return nil, err
	}
	return s.(*redisstore.Store), nil
}

func (e *env) prefix() string { return "inboxbench:" + e.run + ":" }

// via returns the address to dial for the server at addr ("host:port"):
// addr itself without a round-trip time, else the address of a new proxy
// to it that holds the server's replies for e.rtt.
func (e *env) via(addr string) (string, error) {
	if e.rtt <= 0 {
		return addr, nil
	}
	p, err := faultproxy.Start(addr)
	if err != nil {
		return "", err
	}
	p.DelayReplies(e.rtt)
	e.proxies = append(e.proxies, p)
	return p.Addr(), nil
}

// viaURL is raw, a URL of a server, with its host:port replaced by via's.
func (e *env) viaURL(flag, raw string) (string, error) {
	if e.rtt <= 0 {
		return raw, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url's errors quote the URL, and so its password.
		return "", fmt.Errorf("-%s: -store-rtt needs a URL with a host and a port; this one does not parse", flag)
	}
	if u.Host == "" || u.Port() == "" {
		return "", fmt.Errorf("-%s: -store-rtt needs a URL with a host and a port, got %q", flag, stores.Redact(u))
	}
	if u.Host, err = e.via(u.Host); err != nil {
		return "", err
	}
	return u.String(), nil
}

// envName is the suffix of the run id of the env at rtt: none at 0, so
// that a run at loopback names its keys and tables as before.
func envName(runID string, rtt time.Duration) string {
	if rtt <= 0 {
		return runID
	}
	return runID + "_rtt" + strconv.FormatInt(rtt.Microseconds(), 10)
}

// newEnv connects what the variants need, through proxies at round-trip
// time rtt when it is positive; a variant whose service is missing fails
// the run (the harness has no skip: a missing row would make the tables lie
// by omission).
func newEnv(ctx context.Context, o options, need map[string]bool, rtt time.Duration) (e *env, err error) {
	e = &env{run: envName(o.runID, rtt), rtt: rtt}
	defer func() {
		if err != nil {
			_ = e.close(context.Background())
		}
	}()
	if need["redis"] || need["remote"] { // the remote store is served over Redis
		redisURL, err := e.viaURL("redis", o.redisURL)
		if err != nil {
			return e, err
		}
		ro, err := redis.ParseURL(redisURL)
		if err != nil {
			return e, fmt.Errorf("redis URL: %w", err)
		}
		ro.PoolSize = 64
		e.redis = redis.NewClient(ro)
		if err := e.redis.Ping(ctx).Err(); err != nil {
			return e, fmt.Errorf("redis %s: %w", ro.Addr, err)
		}
		// The inbox's stores are opened by URL, as an application configures
		// them, so they get the client settings of a URL-opened store (see
		// "Clients made from a URL" in stores/redis); the Deduplicator's
		// repository uses e.redis, a go-redis client with its defaults.
		e.redisStore, err = openRedis(ctx, redisURL, map[string]string{"prefix": e.prefix() + "inbox:"})
		if err != nil {
			return e, err
		}
		e.dedupRepo, err = redisstore.NewExpiringKeyRepository(e.redis, redisstore.ExpiringKeyRepositoryOptions{Prefix: e.prefix() + "dedup:", Window: retention})
		if err != nil {
			return e, err
		}
		e.floor = redisFloor("floor-redis", false, false, e.redis, e.prefix()+"floor:", inbox.DefaultLease, retention)
		e.floor2 = redisFloor("floor2-redis", true, false, e.redis, e.prefix()+"floor2:", inbox.DefaultLease, retention)
		e.floor2f = redisFloor("floor2f-redis", true, true, e.redis, e.prefix()+"floor2f:", inbox.DefaultLease, retention)
		if err := fencedMark.Load(ctx, e.redis).Err(); err != nil {
			return e, fmt.Errorf("redis: loading floor2f-redis's script: %w", err)
		}
	}
	if need["remote"] {
		e.remoteBacking, err = redisstore.New(e.redis, redisstore.Options{Prefix: e.prefix() + "remote:", Retention: retention})
		if err != nil {
			return e, err
		}
		h, err := server.New(server.Config{Store: e.remoteBacking})
		if err != nil {
			return e, err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return e, err
		}
		e.remoteSrv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = e.remoteSrv.Serve(ln) }()
		e.remoteStore, err = remote.New(remote.Options{URL: "http://" + ln.Addr().String()})
		if err != nil {
			return e, err
		}
	}
	if need["postgres"] {
		pgURL, err := e.viaURL("postgres", o.postgresURL)
		if err != nil {
			return e, err
		}
		e.pg, err = sql.Open("pgx", pgURL)
		if err != nil {
			return e, err
		}
		e.pg.SetMaxIdleConns(32)
		e.pgTable = "inboxbench_" + e.run
		e.pgStore, err = sqlstore.New(ctx, e.pg, sqlstore.Options{Dialect: sqlstore.Postgres, Table: e.pgTable, AutoMigrate: true, Retention: retention})
		if err != nil {
			e.pgTable = ""
			return e, fmt.Errorf("postgres: %w", err)
		}
		// The floor's table has the store's columns and indexes, and rows
		// of its own.
		tab := e.pgTable + "_floor2"
		if _, err := e.pg.ExecContext(ctx, "CREATE TABLE "+tab+" (LIKE "+e.pgTable+" INCLUDING ALL)"); err != nil {
			return e, fmt.Errorf("postgres: the floor's table: %w", err)
		}
		e.pgFloorTab = tab
		e.pgFloor2 = postgresFloor("floor2-postgres", e.pg, tab, inbox.DefaultLease, retention)
	}
	if need["mariadb"] {
		cfg, err := mysqlConfig(o.mysqlURL)
		if err != nil {
			return e, err
		}
		if cfg.Addr, err = e.via(cfg.Addr); err != nil {
			return e, err
		}
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			return e, fmt.Errorf("mariadb: %w", err)
		}
		e.my = sql.OpenDB(conn)
		e.my.SetMaxIdleConns(32)
		e.myTable = "inboxbench_" + e.run
		e.myStore, err = sqlstore.New(ctx, e.my, sqlstore.Options{Dialect: sqlstore.MySQL, Table: e.myTable, AutoMigrate: true, Retention: retention})
		if err != nil {
			e.myTable = ""
			return e, fmt.Errorf("mariadb: %w", err)
		}
	}
	if need["sqlite"] {
		e.liteDir, err = os.MkdirTemp("", "inboxbench-")
		if err != nil {
			return e, err
		}
		e.lite, err = sql.Open("sqlite", sqlitedialect.DSN(filepath.Join(e.liteDir, "inbox.db"), 10*time.Second))
		if err != nil {
			return e, err
		}
		e.lite.SetMaxOpenConns(1)
		e.liteStore, err = sqlstore.New(ctx, e.lite, sqlstore.Options{Dialect: sqlstore.SQLite, AutoMigrate: true, Retention: retention})
		if err != nil {
			return e, fmt.Errorf("sqlite: %w", err)
		}
	}
	return e, nil
}

// mysqlConfig is the go-sql-driver/mysql configuration of a
// mysql://user:password@host:port/database URL, with the settings of the
// SQL store's own mysql:// opener (parseTime, clientFoundRows,
// interpolateParams); other query parameters go to the driver.
func mysqlConfig(raw string) (*mysql.Config, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "mysql" || u.Host == "" {
		return nil, fmt.Errorf("-mysql %q: want mysql://user:password@host:port/database", raw)
	}
	cfg, err := mysql.ParseDSN("/?" + u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("-mysql: %w", err)
	}
	cfg.Net, cfg.Addr = "tcp", u.Host
	if u.Port() == "" {
		cfg.Addr = net.JoinHostPort(u.Hostname(), "3306")
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	cfg.ParseTime, cfg.ClientFoundRows, cfg.InterpolateParams = true, true, true
	return cfg, nil
}

// close drops what the run made: its Redis keys, its PostgreSQL and MariaDB
// tables, its SQLite file.
func (e *env) close(ctx context.Context) error {
	var errs []error
	if e.remoteStore != nil {
		errs = append(errs, e.remoteStore.Close())
	}
	if e.remoteSrv != nil {
		errs = append(errs, e.remoteSrv.Shutdown(ctx))
	}
	if e.redisStore != nil {
		errs = append(errs, e.redisStore.Close())
	}
	if e.redis != nil {
		errs = append(errs, deletePrefix(ctx, e.redis, e.prefix()))
		errs = append(errs, e.redis.Close())
	}
	if e.pg != nil {
		if e.pgStore != nil {
			errs = append(errs, e.pgStore.Close())
		}
		tabs := []string{e.pgTable, e.pgFloorTab}
		if e.pgTable != "" {
			tabs = append(tabs, e.pgTable+"_order") // the gate table of order keys, which migrate creates
		}
		for _, tab := range tabs {
			if tab != "" {
				_, err := e.pg.ExecContext(ctx, "DROP TABLE IF EXISTS "+tab)
				errs = append(errs, err)
			}
		}
		errs = append(errs, e.pg.Close())
	}
	if e.my != nil {
		if e.myStore != nil {
			errs = append(errs, e.myStore.Close())
		}
		if e.myTable != "" {
			_, err := e.my.ExecContext(ctx, "DROP TABLE IF EXISTS "+e.myTable)
			errs = append(errs, err)
		}
		errs = append(errs, e.my.Close())
	}
	if e.lite != nil {
		if e.liteStore != nil {
			errs = append(errs, e.liteStore.Close())
		}
		errs = append(errs, e.lite.Close())
	}
	if e.liteDir != "" {
		errs = append(errs, os.RemoveAll(e.liteDir))
	}
	for _, p := range e.proxies {
		p.Close()
	}
	return errors.Join(errs...)
}

// deletePrefix unlinks every key under prefix (SCAN, never FLUSH: the Redis
// is shared).
func deletePrefix(ctx context.Context, c *redis.Client, prefix string) error {
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 1000 {
			if err := c.Unlink(ctx, batch...).Err(); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	if len(batch) > 0 {
		return c.Unlink(ctx, batch...).Err()
	}
	return nil
}
