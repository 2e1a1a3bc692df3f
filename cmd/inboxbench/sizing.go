package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
	_ "github.com/watermill-inbox/inbox/stores/memory" // memory://
	_ "github.com/watermill-inbox/inbox/stores/redis"  // redis://
	sqlitedialect "github.com/watermill-inbox/inbox/stores/sql/sqlite"
)

// The sizing section: what a kept key costs each store against
// its floor (the key and its expiry alone), the WAL a message writes on
// PostgreSQL against its floor's, and the claim-and-mark throughput of a
// store that holds millions of kept keys against the same store empty,
// without and with its janitor deleting expired keys as fast as they are
// written.
//
// Its keys have the shape of a RabbitMQ inbox's, rabbit:billing:orders:
// and a UUID (58 bytes; 66 with the Redis prefix inboxsz:), and are claimed
// and marked through stores.Open with a payload hash (hex SHA-256, as the
// middleware sends) and a lease id of the caller's, as the middleware does.
//
// The retained keys of the throughput trials are bulk-loaded as copies of a
// template record that the store itself wrote (Redis: DUMP, then RESTORE;
// SQL: INSERT ... SELECT of the template row's columns, read from the
// database's catalog, with a generated key), so the figures never depend on
// a store's record layout.

const (
	sizingKeyPrefix = "rabbit:billing:orders:"
	// sizingRedisPrefix makes the Redis keys 66 bytes.
	sizingRedisPrefix = "inboxsz:"
	// sizingOwner is the owner of the claims: a Kubernetes pod's name and a
	// pid, as the middleware's default owner (hostname/pid) would be in a
	// cluster, so that the figures do not depend on this machine's name.
	sizingOwner = "billing-7d9f8c6b5-x2k4q/1"
	// sizingWorkers is the claim-and-mark concurrency of the throughput
	// trials.
	sizingWorkers = 16
	// sizingWriters is the concurrency of the bytes-per-key measures, the
	// stores' and their floors': one writer, as the sizing test in
	// stores/sql measures. With 16, PostgreSQL's concurrent inserts take
	// heap pages in bulk and leave some of them part-filled, so the floor's
	// 100-byte rows measured 120 to 167 bytes a key from one run to the
	// next, and the ratio moved with the floor alone.
	sizingWriters = 1
	// sizingRetention is the retention of the sizing stores and floors:
	// the default.
	sizingRetention = inbox.DefaultRetention
)

type sizeRow struct {
	store     string
	measured  string // how bytes were measured
	floorDesc string
	n         int
	bytes     float64 // per processed key
	floor     float64 // per key of the floor
}

type thrRow struct {
	store     string
	retained  int64
	empty     []float64 // keys/s of the empty store, one per repetition
	full      []float64 // keys/s of the prefilled store
	emptyJ    []float64 // keys/s of the empty store, in the janitor's repetitions
	janitor   []float64 // keys/s of the prefilled store with keys expiring and the janitor on
	writeRate float64   // the expiring keys per second
	deleted   int64     // expired keys deleted during the janitor's trials
	janSecs   float64   // how long those trials and the pauses between them took
	// checkpoints says how many checkpoints PostgreSQL's WAL volume
	// forced during the trials, and its settings; empty elsewhere.
	checkpoints string
}

type sizingResults struct {
	n, reps  int
	prefill  int
	trial    time.Duration
	rows     []sizeRow
	walStore float64 // PostgreSQL WAL bytes per message of the store
	walFloor float64 // of the floor
	walHow   string
	// PostgreSQL's bytes per key and its floor's after VACUUM FULL.
	pgCompact, pgCompactFloor float64
	thr                       []thrRow
	// mariaOwn describes the server of the prefilled MariaDB rows when it
	// is the section's own; empty when it is -mysql's.
	mariaOwn string
	// pgOwn, the same for PostgreSQL's rows and -postgres.
	pgOwn string
}

func (r *sizingResults) row(store string) *sizeRow {
	if r == nil {
		return nil
	}
	for i := range r.rows {
		if r.rows[i].store == store {
			return &r.rows[i]
		}
	}
	return nil
}

func (r *sizingResults) thrOf(store string) *thrRow {
	if r == nil {
		return nil
	}
	for i := range r.thr {
		if r.thr[i].store == store {
			return &r.thr[i]
		}
	}
	return nil
}

// ratios is a ÷ b per repetition.
func ratios(a, b []float64) []float64 {
	var out []float64
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			out = append(out, a[i]/b[i])
		}
	}
	return out
}

func sizingKey() string { return sizingKeyPrefix + watermill.NewUUID() }

func payloadHash(key string) string {
	h := sha256.Sum256([]byte("payload of " + key))
	return hex.EncodeToString(h[:])
}

// claimAndMark claims and marks each key once, with workers goroutines.
func claimAndMark(ctx context.Context, s inbox.LeaseStore, keys []string, workers int) error {
	return eachKey(keys, workers, func(key string) error { return claimOne(ctx, s, key) })
}

// eachKey calls f with each key once, from workers goroutines, and
// returns the first error of each goroutine (a goroutine stops at its
// first).
func eachKey(keys []string, workers int, f func(key string) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(keys) {
					return
				}
				if err := f(keys[i]); err != nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func claimOne(ctx context.Context, s inbox.LeaseStore, key string) error {
	c, err := s.TryBegin(ctx, key, inbox.BeginOptions{Owner: sizingOwner, Lease: inbox.DefaultLease, LeaseID: inbox.NewLeaseID(), PayloadHash: payloadHash(key)})
	if err != nil {
		return fmt.Errorf("claim of %s: %w", key, err)
	}
	if c.Status != inbox.Acquired {
		return fmt.Errorf("claim of the new key %s: %s, want Acquired", key, c.Status)
	}
	if err := s.Complete(ctx, key, c.LeaseID); err != nil {
		return fmt.Errorf("mark of %s: %w", key, err)
	}
	return nil
}

// claimFor claims and marks new keys with sizingWorkers goroutines for d,
// and returns the keys marked per second.
func claimFor(ctx context.Context, s inbox.LeaseStore, d time.Duration) (float64, error) {
	var done atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, sizingWorkers)
	start := time.Now()
	deadline := start.Add(d)
	for w := range sizingWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				if err := claimOne(ctx, s, sizingKey()); err != nil {
					errs[w] = err
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	return float64(done.Load()) / time.Since(start).Seconds(), nil
}

func newKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = sizingKey()
	}
	return keys
}

// withParams returns raw with the query parameters params set.
func withParams(raw string, params map[string]string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("URL does not parse")
	}
	q := u.Query()
	for k, v := range params {
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func openStore(ctx context.Context, raw string, params map[string]string) (stores.Store, error) {
	u, err := withParams(raw, params)
	if err != nil {
		return nil, err
	}
	return stores.Open(ctx, u)
}

// runSizing runs the sizing section.
func runSizing(ctx context.Context, o options, logf func(string, ...any)) (*sizingResults, error) {
	r := &sizingResults{n: o.sizingN, reps: o.sizingReps, prefill: o.sizingPrefill, trial: o.sizingTrial}
	run := "sz" + o.runID
	var rs *redisServer
	if o.sizingHas("redis") || o.sizingThrHas("redis") {
		var err error
		if rs, err = startRedis(ctx, o.redisServer); err != nil {
			return nil, fmt.Errorf("starting a redis-server of the section's own (-redis-server %s): %w", o.redisServer, err)
		}
		defer rs.close()
	}
	type step struct {
		name string
		n    int
		f    func() error
	}
	var steps []step
	for _, s := range o.sizingStores {
		switch s {
		case "redis":
			steps = append(steps, step{"redis", o.sizingN, func() error { return sizeRedis(ctx, r, rs) }})
		case "postgres":
			steps = append(steps, step{"postgres", o.sizingN, func() error { return sizePostgres(ctx, r, o.postgresURL, run) }})
		case "mariadb":
			steps = append(steps, step{"mariadb", o.sizingN, func() error { return sizeMariaDB(ctx, r, o.mysqlURL, run) }})
		case "sqlite":
			steps = append(steps, step{"sqlite", o.sizingN, func() error { return sizeSQLite(ctx, r) }})
		case "memory":
			steps = append(steps, step{"memory", o.sizingN, func() error { return sizeMemory(ctx, r) }})
		case "mongo":
			steps = append(steps, step{"mongo", o.sizingMongoN, func() error { return sizeMongo(ctx, r, o) }})
		default:
			return nil, fmt.Errorf("-sizing-stores: unknown store %q (known: redis, postgres, mariadb, sqlite, mongo, memory)", s)
		}
	}
	for _, st := range steps {
		logf("sizing: bytes per key, %s (%d keys)", st.name, st.n)
		if err := st.f(); err != nil {
			return nil, fmt.Errorf("%s: %w", st.name, err)
		}
	}
	mysqlThr := o.mysqlURL
	if o.sizingThrHas("mariadb") && o.mariadbd != "" {
		ms, err := startMariaDB(ctx, o.mariadbd, o.mariadbPool)
		if err != nil {
			return nil, fmt.Errorf("starting a mariadbd of the section's own (-sizing-mariadbd %s): %w", o.mariadbd, err)
		}
		defer ms.close()
		mysqlThr = ms.url()
		r.mariaOwn = fmt.Sprintf("a mariadbd of the section's own (buffer pool %s, redo log %s)", o.mariadbPool, mariaRedoLog)
		logf("sizing: mariadb: the prefilled rows run on %s on %s", r.mariaOwn, ms.addr)
	}
	pgThr := o.postgresURL
	if o.sizingThrHas("postgres") && o.pgBin != "" {
		ps, err := startPostgres(ctx, o.pgBin)
		if err != nil {
			return nil, fmt.Errorf("starting a postgres of the section's own (-sizing-postgres %s): %w", o.pgBin, err)
		}
		defer ps.close()
		pgThr = ps.url()
		r.pgOwn = fmt.Sprintf("a postgres of the section's own (max_wal_size %s, autovacuum off, initdb's defaults otherwise)", pgMaxWAL)
		logf("sizing: postgres: the prefilled rows run on %s on %s", r.pgOwn, ps.addr)
	}
	for _, s := range o.sizingThr {
		logf("sizing: throughput with %d retained keys, %s", o.sizingPrefill, s)
		var row thrRow
		var err error
		switch s {
		case "redis":
			row, err = thrRedis(ctx, o, rs, logf)
		case "postgres":
			row, err = thrSQL(ctx, o, s, pgThr, run, logf)
		case "mariadb":
			row, err = thrSQL(ctx, o, s, mysqlThr, run, logf)
		default:
			return nil, fmt.Errorf("-sizing-prefill-stores: unknown store %q (known: redis, postgres, mariadb)", s)
		}
		if err != nil {
			return nil, fmt.Errorf("%s, prefilled: %w", s, err)
		}
		row.store = s
		r.thr = append(r.thr, row)
	}
	return r, nil
}

func (o options) sizingHas(s string) bool {
	for _, x := range o.sizingStores {
		if x == s {
			return true
		}
	}
	return false
}

func (o options) sizingThrHas(s string) bool {
	for _, x := range o.sizingThr {
		if x == s {
			return true
		}
	}
	return false
}

// ownServer is a server process of the section's own, on a free loopback
// port, with a directory of its own that close removes.
type ownServer struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited; err is then its Wait's
	err    error
	dir    string
	port   string
	addr   string
}

// newOwnServer finds a free loopback port and makes the directory of a
// server of kind.
func newOwnServer(kind string) (*ownServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	_ = ln.Close()
	dir, err := os.MkdirTemp("", "inboxbench-"+kind+"-")
	if err != nil {
		return nil, err
	}
	return &ownServer{dir: dir, port: port, addr: net.JoinHostPort("127.0.0.1", port)}, nil
}

// start runs cmd as the server, then calls ready until it succeeds, for at
// most wait, or until the server exits (a wrong flag, a port taken): then
// at once. On failure the caller closes the server.
func (s *ownServer) start(ctx context.Context, cmd *exec.Cmd, wait time.Duration, ready func() error) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	go func() { s.err = cmd.Wait(); close(s.exited) }()
	deadline := time.Now().Add(wait)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s on %s did not answer: %w", filepath.Base(cmd.Path), s.addr, err)
		}
		select {
		case <-s.exited:
			return fmt.Errorf("%s on %s exited before it answered (%v): %w", filepath.Base(cmd.Path), s.addr, s.err, err)
		case <-time.After(50 * time.Millisecond): // polling for the server's start
		}
	}
}

// stop ends the server with sig, or kills it after grace, and waits for
// it to exit.
func (s *ownServer) stop(sig os.Signal, grace time.Duration) {
	if s.exited == nil {
		return
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(grace):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

func (s *ownServer) close() {
	s.stop(os.Kill, 0)
	_ = os.RemoveAll(s.dir)
}

// redisServer is a redis-server of the section's own, without
// persistence: its figures are its own, and FLUSHALL disturbs no one.
type redisServer struct{ *ownServer }

func startRedis(ctx context.Context, bin string) (*redisServer, error) {
	s, err := newOwnServer("redis")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--port", s.port, "--bind", "127.0.0.1", "--dir", s.dir,
		"--daemonize", "no", "--save", "", "--appendonly", "no", "--logfile", filepath.Join(s.dir, "redis.log"),
		"--enable-debug-command", "yes") // DEBUG HTSTATS: finishRehash
	c := redis.NewClient(&redis.Options{Addr: s.addr})
	defer c.Close()
	if err := s.start(ctx, cmd, 15*time.Second, func() error { return c.Ping(ctx).Err() }); err != nil {
		s.close()
		return nil, err
	}
	return &redisServer{s}, nil
}

func (s *redisServer) url(db int) string { return "redis://" + s.addr + "/" + strconv.Itoa(db) }

// usedMemory is the server's used_memory.
func usedMemory(ctx context.Context, c *redis.Client) (int64, error) {
	info, err := c.InfoMap(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(info["Memory"]["used_memory"], 10, 64)
}

func sizeRedis(ctx context.Context, r *sizingResults, rs *redisServer) error {
	c := redis.NewClient(&redis.Options{Addr: rs.addr, ReadTimeout: 2 * time.Minute})
	defer c.Close()
	s, err := openStore(ctx, rs.url(0), map[string]string{"prefix": sizingRedisPrefix, "retention": sizingRetention.String()})
	if err != nil {
		return err
	}
	defer s.Close()
	// Warm up: the store's scripts loaded and its connections open before
	// the measure.
	if err := claimAndMark(ctx, s, newKeys(4*sizingWorkers), sizingWorkers); err != nil {
		return err
	}
	if err := c.FlushAll(ctx).Err(); err != nil {
		return err
	}
	keys := newKeys(r.n)
	before, err := usedMemory(ctx, c)
	if err != nil {
		return err
	}
	if err := claimAndMark(ctx, s, keys, sizingWriters); err != nil {
		return err
	}
	after, err := usedMemory(ctx, c)
	if err != nil {
		return err
	}
	if n, err := c.DBSize(ctx).Result(); err != nil || n != int64(r.n) {
		return fmt.Errorf("the store holds %d keys after %d claims and marks (%v)", n, r.n, err)
	}
	if err := c.FlushAll(ctx).Err(); err != nil {
		return err
	}
	fBefore, err := usedMemory(ctx, c)
	if err != nil {
		return err
	}
	for i := 0; i < len(keys); i += 1000 {
		p := c.Pipeline()
		for _, k := range keys[i:min(i+1000, len(keys))] {
			p.Set(ctx, sizingRedisPrefix+k, "1", sizingRetention)
		}
		if _, err := p.Exec(ctx); err != nil {
			return err
		}
	}
	fAfter, err := usedMemory(ctx, c)
	if err != nil {
		return err
	}
	r.rows = append(r.rows, sizeRow{store: "Redis", n: r.n,
		measured:  "`used_memory` before and after, a redis-server of the section's own",
		floorDesc: "`SET key 1 PX <retention>`, the same keys",
		bytes:     float64(after-before) / float64(r.n), floor: float64(fAfter-fBefore) / float64(r.n)})
	return c.FlushAll(ctx).Err()
}

// sqlTarget is a database of the section: PostgreSQL or MariaDB.
type sqlTarget struct {
	dialect string // "postgres" or "mariadb"
	db      *sql.DB
	url     string // the store's URL, without table
}

func openSQLTarget(dialect, raw string) (*sqlTarget, error) {
	t := &sqlTarget{dialect: dialect, url: raw}
	switch dialect {
	case "postgres":
		db, err := sql.Open("pgx", raw)
		if err != nil {
			return nil, err
		}
		t.db = db
	default:
		cfg, err := mysqlConfig(raw)
		if err != nil {
			return nil, err
		}
		cfg.MultiStatements = false
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			return nil, err
		}
		t.db = sql.OpenDB(conn)
	}
	t.db.SetMaxOpenConns(2 * sizingWorkers)
	t.db.SetMaxIdleConns(2 * sizingWorkers)
	return t, nil
}

// drop drops tables, and the gate tables of order keys that PostgreSQL's
// migrate creates beside them.
func (t *sqlTarget) drop(ctx context.Context, tables ...string) error {
	var errs []error
	for _, tab := range tables {
		for _, tb := range []string{tab, tab + "_order"} {
			_, err := t.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+tb)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// open opens the store of table by URL, with migrate=true and params.
func (t *sqlTarget) open(ctx context.Context, table string, params map[string]string) (stores.Store, error) {
	p := map[string]string{"table": table, "migrate": "true", "max_conns": strconv.Itoa(2 * sizingWorkers)}
	for k, v := range params {
		p[k] = v
	}
	return openStore(ctx, t.url, p)
}

// pgRelSize is pg_total_relation_size of table after VACUUM.
func pgRelSize(ctx context.Context, db *sql.DB, table string) (int64, error) {
	if _, err := db.ExecContext(ctx, "VACUUM "+table); err != nil {
		return 0, err
	}
	var n int64
	err := db.QueryRowContext(ctx, "SELECT pg_total_relation_size($1::regclass)", table).Scan(&n)
	return n, err
}

// pgWAL measures the WAL that f writes to table: with pg_walinspect, the
// records between the LSNs before and after f that touch the table's
// relations (heap, indexes, TOAST) or belong to a transaction that does
// (its commit records), so that other clients of the server do not count;
// without it, every record between the two LSNs. It returns the bytes and
// whether they are the table's alone.
func pgWAL(ctx context.Context, db *sql.DB, table string, f func() error) (int64, bool, error) {
	_, inspectErr := db.ExecContext(ctx, "CREATE EXTENSION IF NOT EXISTS pg_walinspect")
	var start string
	if err := db.QueryRowContext(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&start); err != nil {
		return 0, false, err
	}
	if err := f(); err != nil {
		return 0, false, err
	}
	var end string
	if err := db.QueryRowContext(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&end); err != nil {
		return 0, false, err
	}
	if inspectErr == nil {
		var n sql.NullInt64
		err := db.QueryRowContext(ctx, `
WITH rels AS (
	SELECT pg_relation_filenode(c.oid)::text AS node FROM pg_class c
	WHERE c.oid = $3::regclass
	   OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = $3::regclass)
	   OR c.oid = (SELECT reltoastrelid FROM pg_class WHERE oid = $3::regclass)
	   OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = (SELECT reltoastrelid FROM pg_class WHERE oid = $3::regclass))
), recs AS (
	SELECT xid, record_length, block_ref FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)
), mine AS (
	SELECT DISTINCT r.xid FROM recs r, rels WHERE r.block_ref ~ ('/' || rels.node || ' ') AND r.xid <> 0
)
SELECT sum(record_length) FROM recs r
WHERE r.xid IN (SELECT xid FROM mine)
   OR (r.xid = 0 AND EXISTS (SELECT 1 FROM rels WHERE r.block_ref ~ ('/' || rels.node || ' ')))`, start, end, table).Scan(&n)
		if err == nil {
			return n.Int64, true, nil
		}
	}
	var n int64
	err := db.QueryRowContext(ctx, "SELECT pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn)::bigint", start, end).Scan(&n)
	return n, false, err
}

// walFloor is the floor of the WAL: each key inserted into the floor table
// with the lease's expiry (the claim), then updated to the retention's (the
// mark), one statement each, by sizingWriters goroutines.
func walFloor(ctx context.Context, t *sqlTarget, table string, keys []string) error {
	var ins, upd string
	var lease, keep any
	switch t.dialect {
	case "postgres":
		ins = "INSERT INTO " + table + " (msg_key, expires_at) VALUES ($1, clock_timestamp() + $2::interval)"
		upd = "UPDATE " + table + " SET expires_at = clock_timestamp() + $2::interval WHERE msg_key = $1"
		lease, keep = fmt.Sprintf("%d milliseconds", inbox.DefaultLease.Milliseconds()), fmt.Sprintf("%d milliseconds", sizingRetention.Milliseconds())
	default:
		ins = "INSERT INTO " + table + " (msg_key, expires_at) VALUES (?, ?)"
		upd = "UPDATE " + table + " SET expires_at = ? WHERE msg_key = ?"
	}
	return eachKey(keys, sizingWriters, func(key string) error {
		if t.dialect == "postgres" {
			if _, err := t.db.ExecContext(ctx, ins, key, lease); err != nil {
				return err
			}
			_, err := t.db.ExecContext(ctx, upd, key, keep)
			return err
		}
		now := time.Now()
		if _, err := t.db.ExecContext(ctx, ins, key, now.Add(inbox.DefaultLease).UnixMilli()); err != nil {
			return err
		}
		_, err := t.db.ExecContext(ctx, upd, now.Add(sizingRetention).UnixMilli(), key)
		return err
	})
}

func sizePostgres(ctx context.Context, r *sizingResults, raw, run string) error {
	t, err := openSQLTarget("postgres", raw)
	if err != nil {
		return err
	}
	defer t.db.Close()
	table, floorTab, walTab := "inboxbench_"+run, "inboxbench_"+run+"_floor", "inboxbench_"+run+"_walfloor"
	defer func() { _ = t.drop(context.WithoutCancel(ctx), table, floorTab, walTab) }()
	// pgWAL creates the extension pg_walinspect where it can: dropped
	// after unless it was there before.
	var had bool
	if err := t.db.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_walinspect')").Scan(&had); err != nil {
		return err
	}
	if !had {
		defer func() { _, _ = t.db.ExecContext(context.WithoutCancel(ctx), "DROP EXTENSION IF EXISTS pg_walinspect") }()
	}
	s, err := t.open(ctx, table, map[string]string{"retention": sizingRetention.String()})
	if err != nil {
		return err
	}
	defer s.Close()
	keys := newKeys(r.n)
	wal, own, err := pgWAL(ctx, t.db, table, func() error { return claimAndMark(ctx, s, keys, sizingWriters) })
	if err != nil {
		return err
	}
	size, err := pgRelSize(ctx, t.db, table)
	if err != nil {
		return err
	}
	for _, tab := range []string{floorTab, walTab} {
		if _, err := t.db.ExecContext(ctx, "CREATE TABLE "+tab+` (msg_key TEXT COLLATE "C" NOT NULL PRIMARY KEY, expires_at TIMESTAMPTZ NOT NULL)`); err != nil {
			return err
		}
		if _, err := t.db.ExecContext(ctx, "CREATE INDEX "+tab+"_expires_at ON "+tab+" (expires_at)"); err != nil {
			return err
		}
	}
	if err := insertFloorAt(ctx, t, floorTab, keys); err != nil {
		return err
	}
	fsize, err := pgRelSize(ctx, t.db, floorTab)
	if err != nil {
		return err
	}
	fwal, fown, err := pgWAL(ctx, t.db, walTab, func() error { return walFloor(ctx, t, walTab, keys) })
	if err != nil {
		return err
	}
	// The same rewritten compactly (VACUUM FULL): what the layout takes
	// without the space its claims' updates left free for later rows.
	var full [2]int64
	for i, tab := range []string{table, floorTab} {
		if _, err := t.db.ExecContext(ctx, "VACUUM FULL "+tab); err != nil {
			return err
		}
		if err := t.db.QueryRowContext(ctx, "SELECT pg_total_relation_size($1::regclass)", tab).Scan(&full[i]); err != nil {
			return err
		}
	}
	r.pgCompact, r.pgCompactFloor = float64(full[0])/float64(r.n), float64(full[1])/float64(r.n)
	r.rows = append(r.rows, sizeRow{store: "PostgreSQL", n: r.n,
		measured:  "`pg_total_relation_size` after `VACUUM`",
		floorDesc: "key `text COLLATE \"C\"` primary key, `timestamptz` expiry with its index",
		bytes:     float64(size) / float64(r.n), floor: float64(fsize) / float64(r.n)})
	r.walStore, r.walFloor = float64(wal)/float64(r.n), float64(fwal)/float64(r.n)
	r.walHow = "the WAL records between `pg_current_wal_insert_lsn()` before and after that touch the table (heap, indexes) or belong to a transaction that does (pg_walinspect), so that other clients of the server do not count"
	if !own || !fown {
		r.walHow = "`pg_current_wal_insert_lsn()` before and after: the whole server's WAL (pg_walinspect was not available), other clients' included"
	}
	return nil
}

// insertFloorAt inserts keys into the size floor's table with the expiry of
// a processed key, one statement each, by sizingWriters goroutines.
func insertFloorAt(ctx context.Context, t *sqlTarget, table string, keys []string) error {
	return eachKey(keys, sizingWriters, func(key string) error {
		var err error
		if t.dialect == "postgres" {
			_, err = t.db.ExecContext(ctx, "INSERT INTO "+table+" (msg_key, expires_at) VALUES ($1, clock_timestamp() + $2::interval)",
				key, fmt.Sprintf("%d milliseconds", sizingRetention.Milliseconds()))
		} else {
			_, err = t.db.ExecContext(ctx, "INSERT INTO "+table+" (msg_key, expires_at) VALUES (?, ?)", key, time.Now().Add(sizingRetention).UnixMilli())
		}
		return err
	})
}

// myTableSize is DATA_LENGTH + INDEX_LENGTH of table after ANALYZE TABLE.
func myTableSize(ctx context.Context, db *sql.DB, table string) (int64, error) {
	rows, err := db.QueryContext(ctx, "ANALYZE TABLE "+table)
	if err != nil {
		return 0, err
	}
	_ = rows.Close()
	var n int64
	err = db.QueryRowContext(ctx, "SELECT DATA_LENGTH + INDEX_LENGTH FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?", table).Scan(&n)
	return n, err
}

func sizeMariaDB(ctx context.Context, r *sizingResults, raw, run string) error {
	t, err := openSQLTarget("mariadb", raw)
	if err != nil {
		return err
	}
	defer t.db.Close()
	table, floorTab := "inboxbench_"+run, "inboxbench_"+run+"_floor"
	defer func() { _ = t.drop(context.WithoutCancel(ctx), table, floorTab) }()
	s, err := t.open(ctx, table, map[string]string{"retention": sizingRetention.String()})
	if err != nil {
		return err
	}
	defer s.Close()
	keys := newKeys(r.n)
	if err := claimAndMark(ctx, s, keys, sizingWriters); err != nil {
		return err
	}
	size, err := myTableSize(ctx, t.db, table)
	if err != nil {
		return err
	}
	if _, err := t.db.ExecContext(ctx, "CREATE TABLE "+floorTab+" (msg_key VARBINARY(1024) NOT NULL PRIMARY KEY, expires_at BIGINT NOT NULL, KEY "+floorTab+"_expires_at (expires_at)) ENGINE=InnoDB"); err != nil {
		return err
	}
	if err := insertFloorAt(ctx, t, floorTab, keys); err != nil {
		return err
	}
	fsize, err := myTableSize(ctx, t.db, floorTab)
	if err != nil {
		return err
	}
	r.rows = append(r.rows, sizeRow{store: "MariaDB", n: r.n,
		measured:  "`DATA_LENGTH + INDEX_LENGTH` after `ANALYZE TABLE`",
		floorDesc: "key `varbinary(1024)` primary key, `bigint` expiry with its index",
		bytes:     float64(size) / float64(r.n), floor: float64(fsize) / float64(r.n)})
	return nil
}

// liteSize is the bytes of the pages in use of the SQLite database at path
// after VACUUM: (page_count - freelist_count) × page_size.
func liteSize(ctx context.Context, path string) (int64, error) {
	db, err := sql.Open("sqlite", sqlitedialect.DSN(path, 10*time.Second))
	if err != nil {
		return 0, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, "VACUUM"); err != nil {
		return 0, err
	}
	var pages, free, size int64
	for q, dst := range map[string]*int64{"PRAGMA page_count": &pages, "PRAGMA freelist_count": &free, "PRAGMA page_size": &size} {
		if err := db.QueryRowContext(ctx, q).Scan(dst); err != nil {
			return 0, err
		}
	}
	return (pages - free) * size, nil
}

func sizeSQLite(ctx context.Context, r *sizingResults) error {
	dir, err := os.MkdirTemp("", "inboxbench-sizing-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path, floorPath := filepath.Join(dir, "inbox.db"), filepath.Join(dir, "floor.db")
	s, err := openStore(ctx, "sqlite://"+path, map[string]string{"migrate": "true", "retention": sizingRetention.String()})
	if err != nil {
		return err
	}
	empty, err := liteSize(ctx, path)
	if err != nil {
		_ = s.Close()
		return err
	}
	keys := newKeys(r.n)
	err = claimAndMark(ctx, s, keys, sizingWriters)
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	size, err := liteSize(ctx, path)
	if err != nil {
		return err
	}
	db, err := sql.Open("sqlite", sqlitedialect.DSN(floorPath, 10*time.Second))
	if err != nil {
		return err
	}
	db.SetMaxOpenConns(1)
	err = func() error {
		defer db.Close()
		for _, q := range []string{"CREATE TABLE floor (msg_key TEXT NOT NULL PRIMARY KEY, expires_at INTEGER NOT NULL)", "CREATE INDEX floor_expires_at ON floor (expires_at)"} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				return err
			}
		}
		return nil
	}()
	if err != nil {
		return err
	}
	fempty, err := liteSize(ctx, floorPath)
	if err != nil {
		return err
	}
	db, err = sql.Open("sqlite", sqlitedialect.DSN(floorPath, 10*time.Second))
	if err != nil {
		return err
	}
	err = func() error {
		defer db.Close()
		db.SetMaxOpenConns(1)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		for _, k := range keys {
			if _, err := tx.ExecContext(ctx, "INSERT INTO floor (msg_key, expires_at) VALUES (?, ?)", k, time.Now().Add(sizingRetention).UnixMilli()); err != nil {
				return err
			}
		}
		return tx.Commit()
	}()
	if err != nil {
		return err
	}
	fsize, err := liteSize(ctx, floorPath)
	if err != nil {
		return err
	}
	r.rows = append(r.rows, sizeRow{store: "SQLite", n: r.n,
		measured:  "pages in use (`page_count - freelist_count`, × `page_size`) after `VACUUM`, less those of the empty table",
		floorDesc: "key `TEXT` primary key, `INTEGER` expiry (ms) with its index, the same way",
		bytes:     float64(size-empty) / float64(r.n), floor: float64(fsize-fempty) / float64(r.n)})
	return nil
}

// heapInUse is the live heap after a collection.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

func sizeMemory(ctx context.Context, r *sizingResults) error {
	s, err := stores.Open(ctx, "memory://?retention="+sizingRetention.String())
	if err != nil {
		return err
	}
	defer s.Close()
	if err := claimAndMark(ctx, s, newKeys(4*sizingWorkers), sizingWorkers); err != nil {
		return err
	}
	// The keys are made inside the measure and kept by the store alone, as
	// a consumer's keys are: their bytes count.
	before := heapInUse()
	keys := newKeys(r.n)
	if err := claimAndMark(ctx, s, keys, sizingWriters); err != nil {
		return err
	}
	keys = nil
	after := heapInUse()
	runtime.KeepAlive(s)
	fBefore := heapInUse()
	floor := make(map[string]int64)
	for range r.n {
		floor[sizingKey()] = time.Now().Add(sizingRetention).UnixNano()
	}
	fAfter := heapInUse()
	runtime.KeepAlive(floor)
	_ = keys
	r.rows = append(r.rows, sizeRow{store: "memory", n: r.n,
		measured:  "Go heap in use after a collection, before and after (the keys' own bytes included)",
		floorDesc: "a Go `map[string]int64`, key to expiry, grown the same way",
		bytes:     float64(after-before) / float64(r.n), floor: float64(fAfter-fBefore) / float64(r.n)})
	return nil
}
