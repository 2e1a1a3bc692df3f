package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// sizeMongo runs the MongoDB row in a program of its own (./mongosizing,
// a module that FerretDB can build in; see its package documentation),
// with go run.
func sizeMongo(ctx context.Context, r *sizingResults, o options) error {
	repo := o.repo
	if repo == "" {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		if repo, err = repoRoot(wd); err != nil {
			return err
		}
	}
	cmd := exec.CommandContext(ctx, o.goCmd, "run", ".", "-n", strconv.Itoa(o.sizingMongoN), "-workers", strconv.Itoa(sizingWriters), "-owner", sizingOwner, "-key-prefix", sizingKeyPrefix)
	cmd.Dir = filepath.Join(repo, "cmd", "inboxbench", "mongosizing")
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go run in %s: %w\n%s", cmd.Dir, err, stderr.String())
	}
	var res struct {
		N       int     `json:"n"`
		Bytes   float64 `json:"bytes"`
		Floor   float64 `json:"floor"`
		Version string  `json:"version"`
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return fmt.Errorf("mongosizing printed %q: %w", out.String(), err)
	}
	r.rows = append(r.rows, sizeRow{store: "MongoDB (FerretDB " + res.Version + " over SQLite, in-process)", n: res.N,
		measured:  "`collStats` `totalSize` (FerretDB: SQLite's dbstat pages of the collection's table and indexes)",
		floorDesc: "documents of the key as `_id` and an expiry date, with an index on the expiry",
		bytes:     res.Bytes, floor: res.Floor})
	return nil
}

func (r *sizingResults) markdown(b *strings.Builder) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("## Sizing: bytes per processed key, and claims on a full store\n\n")
	p("Keys of the shape `%s<uuid>` (58 bytes; 66 with the Redis prefix `%s`), claimed and marked through `stores.Open` %s, each claim with a lease id of the caller's, the owner `%s` and a payload hash (hex SHA-256, as the middleware sends), with the default retention (%s). ",
		sizingKeyPrefix, sizingRedisPrefix, writers(sizingWriters), sizingOwner, sizingRetention)
	p("The floor of each store is the least it could keep for a processed key: the key and its expiry, stored the same way (%s) and measured the same way; Redis's floor is `SET key 1 PX <retention>`. ", writers(sizingWriters))
	p("One writer, because concurrent inserts make PostgreSQL take heap pages in bulk and leave some part-filled, which no later row of the measure fills: with 16, the floor's rows of 100 bytes measured 120 to 167 bytes a key from run to run. Redis runs in a redis-server of the section's own; the SQL tables, the SQLite files and the FerretDB state are the section's own and dropped after.\n\n")
	if len(r.rows) > 0 {
		p("| store | keys | measured as | bytes per processed key | the floor | floor bytes per key | ratio |\n|---|--:|---|--:|---|--:|--:|\n")
		for _, row := range r.rows {
			ratio := ""
			if row.floor > 0 {
				ratio = fmt.Sprintf("%.2f", row.bytes/row.floor)
			}
			p("| %s | %d | %s | %.0f | %s | %.0f | %s |\n", row.store, row.n, row.measured, row.bytes, row.floorDesc, row.floor, ratio)
		}
		p("\n")
	}
	if r.pgCompactFloor > 0 {
		p("PostgreSQL's table and floor rewritten compactly (`VACUUM FULL`), without the space that the claims' updates (a new row version each, the old one freed by `VACUUM` for later rows) and the indexes' page splits leave: %.0f bytes per processed key against %.0f, %.2f.\n\n",
			r.pgCompact, r.pgCompactFloor, r.pgCompact/r.pgCompactFloor)
	}
	if r.walStore > 0 {
		p("PostgreSQL WAL per message (claim and mark): %.0f bytes, against %.0f for the floor's (an `INSERT` of the key with the lease's expiry, then an `UPDATE` of the expiry to the retention's, on the floor's table, one statement each, by as many writers): %.2f. Measured as %s.\n\n",
			r.walStore, r.walFloor, r.walStore/r.walFloor, r.walHow)
	}
	if len(r.thr) == 0 {
		return
	}
	p("Claim and mark of new keys, %d goroutines, trials of %s: the store holding %d retained keys (bulk-loaded as copies of a record the store wrote: Redis `DUMP` and `RESTORE`, SQL `INSERT ... SELECT` of the template row with generated keys, in key order) against the same store empty (a table of its own truncated, or a redis-server of its own flushed, before each of its trials), the two alternated within each of %d repetitions. ",
		sizingWorkers, r.trial, r.prefill, r.reps)
	p("Then the same with, besides, keys expiring at the empty store's write rate (a second's worth of keys expiring each second, from before the first trial to after the last) and the store's janitor deleting them: the SQL store's (`cleanup_interval=1s`, batches of the default size), Redis's own expiry. Deleted per second: the expiring keys deleted during those trials over their time.")
	if r.pgOwn != "" {
		p(" PostgreSQL's rows run on %s, whose WAL room holds the trials' without a forced checkpoint, as docs/stores.md advises; the server of `-postgres` is not touched.", r.pgOwn)
	}
	if r.mariaOwn != "" {
		p(" MariaDB's rows run on %s, whose pool holds the prefilled table; the server of `-mysql` is not touched.", r.mariaOwn)
	}
	p("\n\n")
	p("| store | retained keys | empty keys/s | prefilled keys/s | prefilled ÷ empty | empty keys/s (janitor's repetitions) | prefilled, keys expiring, keys/s | ÷ empty | keys expiring per second | deleted per second |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, t := range r.thr {
		full, jan := ratios(t.full, t.empty), ratios(t.janitor, t.emptyJ)
		deleted := ""
		if t.janSecs > 0 {
			deleted = fmt.Sprintf("%.0f", float64(t.deleted)/t.janSecs)
		}
		p("| %s | %d | %.0f %s | %.0f %s | %.2f %s | %.0f | %.0f %s | %.2f %s | %.0f | %s |\n", t.store, t.retained,
			median(t.empty), rangeOf(t.empty, "%.0f"), median(t.full), rangeOf(t.full, "%.0f"), median(full), rangeOf(full, "%.2f"),
			median(t.emptyJ), median(t.janitor), rangeOf(t.janitor, "%.0f"), median(jan), rangeOf(jan, "%.2f"), t.writeRate, deleted)
	}
	p("\n")
	for _, t := range r.thr {
		if t.checkpoints != "" {
			p("%s: a CHECKPOINT after each bulk load, so that the load's WAL does not force one during the trials; %s. After a checkpoint, the first change to a page goes to the WAL as the whole page (full_page_writes), and a prefilled store's claims change pages all over its primary key's index, an empty store's few.\n\n", t.store, t.checkpoints)
		}
	}
}

// sizingTargets are the sizing rows of the targets table.
func (rep *report) sizingTargets() []targetRow {
	r := rep.sizing
	bytesRatio := func(store string) []float64 {
		if row := r.row(store); row != nil && row.floor > 0 {
			return []float64{row.bytes / row.floor}
		}
		return nil
	}
	thr := func(store string, janitor bool) []float64 {
		t := r.thrOf(store)
		if t == nil {
			return nil
		}
		if janitor {
			return ratios(t.janitor, t.emptyJ)
		}
		return ratios(t.full, t.empty)
	}
	var wal []float64
	if r != nil && r.walFloor > 0 {
		wal = []float64{r.walStore / r.walFloor}
	}
	const at = "Sizing (issue 46): "
	return []targetRow{
		{what: at + "Redis bytes per processed key ÷ its floor", values: bytesRatio("Redis"), target: "≤ 1.4", ok: atMost(1.4)},
		{what: at + "PostgreSQL bytes per processed key ÷ its floor", values: bytesRatio("PostgreSQL"), target: "≤ 1.35", ok: atMost(1.35)},
		{what: at + "MariaDB bytes per processed key ÷ its floor", values: bytesRatio("MariaDB"), target: "≤ 1.35", ok: atMost(1.35)},
		{what: at + "PostgreSQL WAL bytes per message ÷ its floor's", values: wal},
		{what: at + "Redis, claim and mark with the retained keys ÷ empty", values: thr("redis", false), target: "≥ 0.9", ok: atLeast(0.9)},
		{what: at + "PostgreSQL, claim and mark with the retained keys ÷ empty", values: thr("postgres", false), target: "≥ 0.9", ok: atLeast(0.9)},
		{what: at + "MariaDB, claim and mark with the retained keys ÷ empty", values: thr("mariadb", false), target: "≥ 0.8", ok: atLeast(0.8)},
		{what: at + "Redis, the same with keys expiring at the write rate (its own expiry) ÷ empty", values: thr("redis", true)},
		{what: at + "PostgreSQL, the same with the janitor deleting at the write rate ÷ empty", values: thr("postgres", true), target: "≥ 0.85", ok: atLeast(0.85)},
		{what: at + "MariaDB, the same with the janitor deleting at the write rate ÷ empty", values: thr("mariadb", true), target: "≥ 0.85", ok: atLeast(0.85)},
	}
}

// writers says how many goroutines wrote a measure's keys.
func writers(n int) string {
	if n == 1 {
		return "one after the other"
	}
	return fmt.Sprintf("by %d goroutines", n)
}
