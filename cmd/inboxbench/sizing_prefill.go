package main

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox/stores"
)

// The throughput half of the sizing section: claim and mark of new keys
// (sizingWorkers goroutines, trials of -sizing-trial) on a store holding
// -sizing-prefill retained keys, against the same store empty, the two
// alternated within each repetition; then the same with keys expiring at
// the empty store's write rate and the store's janitor deleting them (the
// SQL store's cleanup_interval; Redis's own expiry).

// retainedTag and the bucket tags are the fourth group of the bulk-loaded
// keys' UUID-shaped ids: the retained keys' and those of each second of
// expiring keys differ there.
const retainedTag = "ffff"

func bucketTag(j int) string { return fmt.Sprintf("%04x", j) }

// trialPair runs, for each of reps repetitions, a trial on a and one on b,
// in an order that alternates, after prepA (which empties a); it returns
// their rates and the keys b marked.
func trialPair(ctx context.Context, reps int, d time.Duration, a, b stores.Store, prepA func() error, logf func(string, ...any), what string) (ra, rb []float64, bKeys float64, err error) {
	for rep := range reps {
		order := []bool{true, false}
		if rep%2 == 1 {
			order = []bool{false, true}
		}
		for _, isA := range order {
			if isA {
				if err := prepA(); err != nil {
					return nil, nil, 0, err
				}
				x, err := claimFor(ctx, a, d)
				if err != nil {
					return nil, nil, 0, fmt.Errorf("empty store: %w", err)
				}
				ra = append(ra, x)
				continue
			}
			x, err := claimFor(ctx, b, d)
			if err != nil {
				return nil, nil, 0, fmt.Errorf("%s: %w", what, err)
			}
			rb = append(rb, x)
			bKeys += x * d.Seconds()
		}
		logf("sizing: repetition %d: empty %.0f keys/s, %s %.0f keys/s", rep+1, ra[len(ra)-1], what, rb[len(rb)-1])
	}
	return ra, rb, bKeys, nil
}

// expiringBuckets is how many seconds of expiring keys, at rate keys a
// second, cover the janitor's trials when the first second expires offset
// from now.
func expiringBuckets(o options, offset time.Duration) int {
	trials := time.Duration(o.sizingReps) * 2 * (o.sizingTrial + time.Second)
	return int(math.Ceil((offset + trials + 10*time.Second).Seconds()))
}

func thrRedis(ctx context.Context, o options, rs *redisServer, logf func(string, ...any)) (thrRow, error) {
	var row thrRow
	empty, err := startRedis(ctx, o.redisServer)
	if err != nil {
		return row, err
	}
	defer empty.close()
	// FLUSHALL of millions of keys takes seconds.
	c := redis.NewClient(&redis.Options{Addr: rs.addr, ReadTimeout: 2 * time.Minute})
	defer c.Close()
	ce := redis.NewClient(&redis.Options{Addr: empty.addr, ReadTimeout: 2 * time.Minute})
	defer ce.Close()
	if err := c.FlushAll(ctx).Err(); err != nil {
		return row, err
	}
	params := map[string]string{"prefix": sizingRedisPrefix, "retention": sizingRetention.String(), "pool_size": "64"}
	full, err := openStore(ctx, rs.url(0), params)
	if err != nil {
		return row, err
	}
	defer full.Close()
	emptyStore, err := openStore(ctx, empty.url(0), params)
	if err != nil {
		return row, err
	}
	defer emptyStore.Close()
	tpl := sizingKey()
	if err := claimOne(ctx, full, tpl); err != nil {
		return row, err
	}
	dump, err := c.Dump(ctx, sizingRedisPrefix+tpl).Result()
	if err != nil {
		return row, fmt.Errorf("DUMP of the template: %w", err)
	}
	ttl, err := c.PTTL(ctx, sizingRedisPrefix+tpl).Result()
	if err != nil || ttl <= 0 {
		return row, fmt.Errorf("PTTL of the template: %v, %v", ttl, err)
	}
	start := time.Now()
	if err := restoreMany(ctx, c, dump, o.sizingPrefill, retainedTag, func(int) time.Duration { return ttl }); err != nil {
		return row, err
	}
	loadRate := float64(o.sizingPrefill) / time.Since(start).Seconds()
	n, err := c.DBSize(ctx).Result()
	if err != nil {
		return row, err
	}
	row.retained = n
	logf("sizing: redis: %d keys restored from the template, %.0f a second", n, loadRate)
	if err := finishRehash(ctx, c, sizingRedisPrefix+tpl, logf); err != nil {
		return row, err
	}
	flush := func() error { return ce.FlushAll(ctx).Err() }
	row.empty, row.full, _, err = trialPair(ctx, o.sizingReps, o.sizingTrial, emptyStore, full, flush, logf, "prefilled")
	if err != nil {
		return row, err
	}
	// Keys expiring at the empty store's rate, from a few seconds after
	// they are loaded until the janitor's trials are over: Redis deletes
	// them itself (its active expiry).
	rate := median(row.empty)
	perBucket := int(math.Ceil(rate))
	offset := time.Second
	offset += time.Duration(float64(time.Second) * float64(expiringBuckets(o, offset)*perBucket) / loadRate)
	buckets := expiringBuckets(o, offset)
	row.writeRate = float64(perBucket)
	for j := range buckets {
		at := offset + time.Duration(j)*time.Second
		if err := restoreMany(ctx, c, dump, perBucket, bucketTag(j), func(int) time.Duration { return at }); err != nil {
			return row, err
		}
	}
	before, err := c.DBSize(ctx).Result()
	if err != nil {
		return row, err
	}
	jStart := time.Now()
	var added float64
	row.emptyJ, row.janitor, added, err = trialPair(ctx, o.sizingReps, o.sizingTrial, emptyStore, full, flush, logf, "prefilled with keys expiring")
	if err != nil {
		return row, err
	}
	row.janSecs = time.Since(jStart).Seconds()
	after, err := c.DBSize(ctx).Result()
	if err != nil {
		return row, err
	}
	row.deleted = before + int64(added) - after
	// The servers are stopped, their keys with them: nothing to flush.
	return row, nil
}

// finishRehash brings the server's keyspace out of the rehash that the bulk
// load left it in. Loading millions of keys grows Redis's tables of keys
// and of expiries past a power of two; Redis 7.0 then moves the entries of
// the table of expiries to the new one a bucket at each command that looks
// in it (its cron left it half done for minutes in an idle server here),
// and meanwhile every such command looks in both tables and moves a
// bucket. A store that has held its keys for days is not rehashing: the
// trials measure that one, not the load's aftermath (without this, the
// first trial after the load ran at 0.60 of the empty store's throughput,
// the third, minutes later, at 0.90). PTTL of an existing key looks in the
// table of expiries: it moves one bucket a call until the rehash ends.
func finishRehash(ctx context.Context, c *redis.Client, key string, logf func(string, ...any)) error {
	start := time.Now()
	for round := 0; ; round++ {
		out, err := c.Do(ctx, "DEBUG", "HTSTATS", "0").Text()
		if err != nil {
			return fmt.Errorf("DEBUG HTSTATS: %w", err)
		}
		if !strings.Contains(out, "rehashing target") {
			logf("sizing: redis: the keyspace's rehash finished in %s, %d PTTL calls", time.Since(start).Round(100*time.Millisecond), round*rehashRound)
			return nil
		}
		if round == 400 {
			return fmt.Errorf("the keyspace was still being rehashed after %d PTTL calls", round*rehashRound)
		}
		p := c.Pipeline()
		for range rehashRound {
			p.PTTL(ctx, key)
		}
		if _, err := p.Exec(ctx); err != nil {
			return fmt.Errorf("PTTL of the template: %w", err)
		}
	}
}

// rehashRound is the PTTL calls finishRehash sends between two looks.
const rehashRound = 50_000

// restoreMany restores n copies of dump under keys of the bulk-loaded
// shape with tag, each with the TTL ttl(i), pipelined.
func restoreMany(ctx context.Context, c *redis.Client, dump string, n int, tag string, ttl func(int) time.Duration) error {
	const chunk = 5000
	for i := 0; i < n; i += chunk {
		p := c.Pipeline()
		for g := i + 1; g <= min(i+chunk, n); g++ {
			p.Restore(ctx, sizingRedisPrefix+bulkKey(g, tag), ttl(g), dump)
		}
		if _, err := p.Exec(ctx); err != nil {
			return fmt.Errorf("RESTORE of copies of the template: %w", err)
		}
	}
	return nil
}

// bulkKey is the g-th bulk-loaded key with tag: the shape of the
// benchmark's keys (a UUID's), its first group spread over the key space
// as a random UUID's is, as the SQL bulk loads make them.
func bulkKey(g int, tag string) string {
	h := fmt.Sprintf("%08x", uint32(g)*2654435761)
	return sizingKeyPrefix + h + "-" + tag + "-4000-8000-" + fmt.Sprintf("%012x", g)
}

// sqlColumn is a column of a store's table, from the database's catalog.
type sqlColumn struct {
	name, typ string
	key       bool
}

func (t *sqlTarget) columns(ctx context.Context, table string) ([]sqlColumn, error) {
	q := `SELECT a.attname, format_type(a.atttypid, a.atttypmod),
	COALESCE((SELECT true FROM pg_index i WHERE i.indrelid = a.attrelid AND i.indisprimary AND a.attnum = ANY(i.indkey)), false)
FROM pg_attribute a WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`
	if t.dialect != "postgres" {
		q = "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_KEY = 'PRI' FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION"
	}
	rows, err := t.db.QueryContext(ctx, q, table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var cols []sqlColumn
	keys := 0
	for rows.Next() {
		var c sqlColumn
		if err := rows.Scan(&c.name, &c.typ, &c.key); err != nil {
			return nil, err
		}
		if c.key {
			keys++
		}
		cols = append(cols, c)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if keys != 1 {
		return nil, fmt.Errorf("table %s: %d primary key columns in the catalog, want one (the key)", table, keys)
	}
	return cols, nil
}

func (t *sqlTarget) quote(name string) string {
	if t.dialect == "postgres" {
		return `"` + name + `"`
	}
	return "`" + name + "`"
}

// copyTemplate inserts the keys from..to (bulkKey's numbering) with tag
// into table as copies of the template row of key tpl: every column but
// the key copied, the key generated; in key order, so that the indexes
// grow at their ends.
// A template that is gone (an expiring one the janitor deleted already)
// is an error unless gone is allowed: its copies would have expired too.
func (t *sqlTarget) copyTemplate(ctx context.Context, table string, cols []sqlColumn, tpl string, from, to int, tag string, gone bool) error {
	// values follows the catalog's order of the columns, the key's
	// expression in the key's place (not always the first: the PostgreSQL
	// layout orders its columns by alignment).
	var names, values []string
	var keyCol sqlColumn
	keyAt := -1
	for i, c := range cols {
		names = append(names, t.quote(c.name))
		values = append(values, "t."+t.quote(c.name))
		if c.key {
			keyCol, keyAt = c, i
		}
	}
	selectList := func(expr string) string {
		values[keyAt] = expr
		return strings.Join(values, ", ")
	}
	var q string
	var args []any
	if t.dialect == "postgres" {
		expr := "'" + sizingKeyPrefix + "' || lpad(to_hex((g * 2654435761) % 4294967296), 8, '0') || '-" + tag + "-4000-8000-' || lpad(to_hex(g), 12, '0')"
		match := "$3"
		if keyCol.typ == "bytea" {
			expr, match = "convert_to("+expr+", 'UTF8')", "convert_to($3, 'UTF8')"
		}
		q = "INSERT INTO " + table + " (" + strings.Join(names, ", ") + ") SELECT " + selectList(expr) +
			" FROM generate_series($1::bigint, $2::bigint) AS g, (SELECT * FROM " + table + " WHERE " + t.quote(keyCol.name) + " = " + match + ") AS t ORDER BY " + strconv.Itoa(keyAt+1)
		args = []any{from, to, tpl}
	} else {
		expr := "CONCAT('" + sizingKeyPrefix + "', LPAD(LOWER(HEX((s.seq * 2654435761) % 4294967296)), 8, '0'), '-" + tag + "-4000-8000-', LPAD(LOWER(HEX(s.seq)), 12, '0'))"
		q = "INSERT INTO " + table + " (" + strings.Join(names, ", ") + ") SELECT " + selectList(expr) +
			" FROM seq_" + strconv.Itoa(from) + "_to_" + strconv.Itoa(to) + " AS s, (SELECT * FROM " + table + " WHERE " + t.quote(keyCol.name) + " = ?) AS t ORDER BY " + strconv.Itoa(keyAt+1)
		args = []any{tpl}
	}
	res, err := t.db.ExecContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("bulk copy of the template: %w", err)
	}
	if n, err := res.RowsAffected(); err == nil && n != int64(to-from+1) && (n != 0 || !gone) {
		return fmt.Errorf("bulk copy of the template %s: %d rows, want %d (is the template there?)", tpl, n, to-from+1)
	}
	return nil
}

func (t *sqlTarget) count(ctx context.Context, table string) (int64, error) {
	var n int64
	err := t.db.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n)
	return n, err
}

func (t *sqlTarget) analyze(ctx context.Context, table string) error {
	q := "ANALYZE " + table
	if t.dialect != "postgres" {
		q = "ANALYZE TABLE " + table
	}
	rows, err := t.db.QueryContext(ctx, q)
	if err != nil {
		return err
	}
	return rows.Close()
}

func thrSQL(ctx context.Context, o options, dialect, raw, run string, logf func(string, ...any)) (thrRow, error) {
	var row thrRow
	t, err := openSQLTarget(dialect, raw)
	if err != nil {
		return row, err
	}
	defer t.db.Close()
	emptyTab, fullTab := "inboxbench_"+run+"_empty", "inboxbench_"+run+"_full"
	defer func() { _ = t.drop(context.WithoutCancel(ctx), emptyTab, fullTab) }()
	keep := map[string]string{"retention": sizingRetention.String()}
	emptyStore, err := t.open(ctx, emptyTab, keep)
	if err != nil {
		return row, err
	}
	defer emptyStore.Close()
	full, err := t.open(ctx, fullTab, keep)
	if err != nil {
		return row, err
	}
	defer full.Close()
	cols, err := t.columns(ctx, fullTab)
	if err != nil {
		return row, err
	}
	tpl := sizingKey()
	if err := claimOne(ctx, full, tpl); err != nil {
		return row, err
	}
	const chunk = 500_000
	start := time.Now()
	for from := 1; from <= o.sizingPrefill; from += chunk {
		if err := t.copyTemplate(ctx, fullTab, cols, tpl, from, min(from+chunk-1, o.sizingPrefill), retainedTag, false); err != nil {
			return row, err
		}
	}
	loadRate := float64(o.sizingPrefill) / time.Since(start).Seconds()
	if err := t.analyze(ctx, fullTab); err != nil {
		return row, err
	}
	if row.retained, err = t.count(ctx, fullTab); err != nil {
		return row, err
	}
	logf("sizing: %s: %d rows copied from the template, %.0f a second", dialect, row.retained, loadRate)
	t.settle(ctx, logf)
	truncate := func() error {
		_, err := t.db.ExecContext(ctx, "TRUNCATE TABLE "+emptyTab)
		return err
	}
	ckpt := t.checkpoints(ctx)
	row.empty, row.full, _, err = trialPair(ctx, o.sizingReps, o.sizingTrial, emptyStore, full, truncate, logf, "prefilled")
	if err != nil {
		return row, err
	}
	if err := full.Close(); err != nil {
		return row, err
	}
	// The janitor: the store of the trials runs the cleanup every second,
	// in batches of the default size, from before the expiring keys are
	// loaded.
	janitor, err := t.open(ctx, fullTab, map[string]string{"retention": sizingRetention.String(), "migrate": "false", "cleanup_interval": "1s"})
	if err != nil {
		return row, err
	}
	defer janitor.Close()
	// Keys expiring at the empty store's rate: a template per second, made
	// by a store whose retention ends it then, copied that many times.
	rate := median(row.empty)
	perBucket := int(math.Ceil(rate))
	row.writeRate = float64(perBucket)
	// The first second expires about when the copies are in: the
	// templates take some 50 ms each, the copies the bulk load's rate.
	offset := time.Second
	buckets := expiringBuckets(o, offset)
	offset += time.Duration(float64(time.Second) * (float64(buckets*perBucket)/loadRate + float64(buckets)*0.05))
	buckets = expiringBuckets(o, offset)
	tpls := make([]string, buckets)
	for j := range tpls {
		s, err := t.open(ctx, fullTab, map[string]string{"retention": (offset + time.Duration(j)*time.Second).String(), "migrate": "false"})
		if err != nil {
			return row, err
		}
		tpls[j] = sizingKey()
		err = claimOne(ctx, s, tpls[j])
		if cerr := s.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return row, err
		}
	}
	for j, k := range tpls {
		if err := t.copyTemplate(ctx, fullTab, cols, k, 1, perBucket, bucketTag(j), true); err != nil {
			return row, fmt.Errorf("second %d of the expiring keys: %w", j, err)
		}
	}
	settled := t.settle(ctx, logf)
	before, err := t.count(ctx, fullTab)
	if err != nil {
		return row, err
	}
	jStart := time.Now()
	var added float64
	row.emptyJ, row.janitor, added, err = trialPair(ctx, o.sizingReps, o.sizingTrial, emptyStore, janitor, truncate, logf, "prefilled with the janitor")
	if err != nil {
		return row, err
	}
	row.janSecs = time.Since(jStart).Seconds()
	after, err := t.count(ctx, fullTab)
	if err != nil {
		return row, err
	}
	row.deleted = before + int64(added) - after
	row.checkpoints = ckpt(settled)
	return row, nil
}

// settle ends the bulk load's part in the trials that follow: on
// PostgreSQL a CHECKPOINT, so that the load's WAL does not force one
// during the first trials. It reports whether it ran one; it logs and
// goes on where it could not (the role lacks the right).
func (t *sqlTarget) settle(ctx context.Context, logf func(string, ...any)) bool {
	if t.dialect != "postgres" {
		return false
	}
	start := time.Now()
	if _, err := t.db.ExecContext(ctx, "CHECKPOINT"); err != nil {
		logf("sizing: postgres: CHECKPOINT after the load: %v (the trials run without it)", err)
		return false
	}
	logf("sizing: postgres: CHECKPOINT after the load took %s", time.Since(start).Round(time.Millisecond))
	return true
}

// checkpoints starts counting PostgreSQL's checkpoints requested by WAL
// volume (max_wal_size reached before checkpoint_timeout), server-wide:
// the function it returns says how many there were since, less the
// CHECKPOINT of settle when it ran one, with the two settings, or ""
// where the server does not say (MariaDB; a statistics view that is not
// there).
func (t *sqlTarget) checkpoints(ctx context.Context) func(settled bool) string {
	none := func(bool) string { return "" }
	if t.dialect != "postgres" {
		return none
	}
	// pg_stat_checkpointer from PostgreSQL 17, pg_stat_bgwriter before.
	var q string
	for _, c := range []string{"SELECT num_requested FROM pg_stat_checkpointer", "SELECT checkpoints_req FROM pg_stat_bgwriter"} {
		var n int64
		if t.db.QueryRowContext(ctx, c).Scan(&n) == nil {
			q = c
			break
		}
	}
	if q == "" {
		return none
	}
	var start int64
	if t.db.QueryRowContext(ctx, q).Scan(&start) != nil {
		return none
	}
	return func(settled bool) string {
		var n int64
		if settled {
			start++
		}
		var walMax, timeout string
		if t.db.QueryRowContext(ctx, q).Scan(&n) != nil ||
			t.db.QueryRowContext(ctx, "SELECT current_setting('max_wal_size'), current_setting('checkpoint_timeout')").Scan(&walMax, &timeout) != nil {
			return ""
		}
		return fmt.Sprintf("%d checkpoints requested by WAL volume during the trials (max_wal_size %s, checkpoint_timeout %s)", n-start, walMax, timeout)
	}
}
