package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// The store round trips are measured by the stores' own Go benchmarks, which
// interleave the variants within every iteration: this section builds their
// test binaries once and runs them once per repetition.
//
//   - stores/redis BenchmarkTryBeginCompleteInterleaved: ours, the same two
//     Lua scripts through go-redis (raw-lua), and SET NX + SET (raw-setnx);
//   - stores/sql BenchmarkClaimCompleteInterleaved: the store, its own two
//     statements through database/sql (same-sql), and a plain INSERT +
//     UPDATE on the same table (floor), on PostgreSQL, MariaDB and SQLite.
type rtBench struct {
	pkg   string // store name, as in -roundtrip-stores
	dir   string // package directory, relative to the repository root
	bench string // -test.bench pattern
	iters int    // iterations per run (-roundtrip-scale scales them)
	// row turns one benchmark line into a table row.
	row func(name string, m map[string]float64) rtRow
}

// rtRow is one store's round trip in one repetition: time per message of
// ours, of the raw client running the same work, and of the floor; ratios
// are throughputs relative to ours (raw time over ours).
type rtRow struct {
	store                 string
	ours, same, floor     float64 // ns per message
	sameName, floorName   string
	sameRatio, floorRatio float64
}

var rtBenches = []rtBench{
	{
		pkg: "redis", dir: "stores/redis", bench: "^BenchmarkTryBeginCompleteInterleaved$", iters: 3000,
		row: func(_ string, m map[string]float64) rtRow {
			return rtRow{
				store: "redis", ours: m["ours-ns/msg"], same: m["raw-lua-ns/msg"], floor: m["raw-setnx-ns/msg"],
				sameName: "same Lua scripts", floorName: "SET NX + SET",
				sameRatio: m["raw-lua/ours"], floorRatio: m["raw-setnx/ours"],
			}
		},
	},
	{
		pkg: "sql", dir: "stores/sql", bench: "^BenchmarkClaimCompleteInterleaved$", iters: 1000,
		row: func(name string, m map[string]float64) rtRow {
			db := name
			if i := strings.LastIndex(name, "/"); i >= 0 {
				db = name[i+1:]
			}
			return rtRow{
				store: db, ours: m["store-ns/op"], same: m["same-sql-ns/op"], floor: m["floor-ns/op"],
				sameName: "same statements", floorName: "INSERT + UPDATE",
				sameRatio: m["same-sql-ns/op"] / m["store-ns/op"], floorRatio: m["floor-ns/op"] / m["store-ns/op"],
			}
		},
	},
}

type rtResults struct {
	iters  map[string]int     // store -> iterations per repetition
	stores []string           // in first-seen order
	runs   map[string][]rtRow // store -> one row per repetition
}

// repoRoot finds the root of the library's module from dir upwards.
func repoRoot(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && bytes.HasPrefix(bytes.TrimSpace(b), []byte("module github.com/watermill-inbox/inbox\n")) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod of github.com/watermill-inbox/inbox above %s (set -repo)", dir)
		}
	}
}

func runRoundTrips(ctx context.Context, o options, logf func(string, ...any)) (*rtResults, error) {
	root := o.repo
	if root == "" {
		wd, err := os.Getwd()
		if err != nil {
			return nil, err
		}
		if root, err = repoRoot(wd); err != nil {
			return nil, err
		}
	}
	tmp, err := os.MkdirTemp("", "inboxbench-bin-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	var benches []rtBench
	bins := map[string]string{}
	for _, name := range o.rtPackages {
		var found *rtBench
		for i := range rtBenches {
			if rtBenches[i].pkg == name {
				found = &rtBenches[i]
			}
		}
		if found == nil {
			return nil, fmt.Errorf("unknown round-trip store %q", name)
		}
		bin := filepath.Join(tmp, name+".test")
		logf("building the %s benchmarks", found.dir)
		cmd := exec.CommandContext(ctx, o.goCmd, "test", "-c", "-o", bin, "./"+found.dir)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go test -c ./%s: %w\n%s", found.dir, err, out)
		}
		benches = append(benches, *found)
		bins[name] = bin
	}

	res := &rtResults{iters: map[string]int{}, runs: map[string][]rtRow{}}
	for rep := range o.reps {
		for _, b := range rotate(benches, rep) {
			iters := max(1, int(float64(b.iters)*o.rtScale))
			cmd := exec.CommandContext(ctx, bins[b.pkg], "-test.run", "^$", "-test.bench", b.bench,
				"-test.benchtime", strconv.Itoa(iters)+"x", "-test.count", "1")
			cmd.Dir = filepath.Join(root, b.dir)
			cmd.Env = append(os.Environ(),
				"INBOX_REQUIRE_SERVICES=1",
				"INBOX_TEST_REDIS_URL="+o.redisURL,
				"INBOX_TEST_POSTGRES_URL="+o.postgresURL,
				"INBOX_TEST_MYSQL_URL="+o.mysqlURL,
			)
			out, err := cmd.CombinedOutput()
			if err != nil {
				return nil, fmt.Errorf("%s benchmark: %w\n%s", b.dir, err, out)
			}
			lines, err := parseBench(out)
			if err != nil {
				return nil, fmt.Errorf("%s benchmark: %w\n%s", b.dir, err, out)
			}
			for _, l := range lines {
				r := b.row(l.name, l.metrics)
				if _, ok := res.runs[r.store]; !ok {
					res.stores = append(res.stores, r.store)
				}
				res.iters[r.store] = iters
				res.runs[r.store] = append(res.runs[r.store], r)
				logf("rep %d/%d round trip %-8s ours %6.1f µs, %s %6.1f µs (%.2f), %s %6.1f µs (%.2f)", rep+1, o.reps,
					r.store, r.ours/1e3, r.sameName, r.same/1e3, r.sameRatio, r.floorName, r.floor/1e3, r.floorRatio)
			}
		}
	}
	return res, nil
}

type benchLine struct {
	name    string
	metrics map[string]float64
}

// parseBench reads the result lines of `go test -bench` output.
func parseBench(out []byte) ([]benchLine, error) {
	var lines []benchLine
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		name := f[0]
		if i := strings.LastIndex(name, "-"); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i] // the GOMAXPROCS suffix
			}
		}
		l := benchLine{name: name, metrics: map[string]float64{}}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("bad value %q in %q", f[i], sc.Text())
			}
			l.metrics[f[i+1]] = v
		}
		lines = append(lines, l)
	}
	if len(lines) == 0 {
		return nil, errors.New("no benchmark results")
	}
	return lines, sc.Err()
}

func (r *rtResults) col(store string, f func(rtRow) float64) []float64 {
	var out []float64
	for _, row := range r.runs[store] {
		out = append(out, f(row))
	}
	return out
}
