package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver, to drop the tests' tables

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testenv"
	"github.com/watermill-inbox/inbox/keying"
	inboxmw "github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores"
)

// These tests run inboxctl (its run function, and once the program itself)
// against the real stores, each under a prefix or in a table of its own.

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func randomName(t *testing.T) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// withParams returns raw with the query parameters kv (name, value, ...) set.
func withParams(t *testing.T, raw string, kv ...string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	for i := 0; i < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

type result struct {
	code           int
	stdout, stderr string
}

func ctl(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(ctxT(t, time.Minute), args, &out, &errb, func(string) string { return "" })
	return result{code, out.String(), errb.String()}
}

func ctlOK(t *testing.T, args ...string) result {
	t.Helper()
	r := ctl(t, args...)
	if r.code != 0 {
		t.Fatalf("inboxctl %q: exit %d\nstdout:\n%s\nstderr:\n%s", args, r.code, r.stdout, r.stderr)
	}
	return r
}

type record struct {
	Key      string `json:"key"`
	Status   string `json:"status"`
	Attempts int    `json:"attempts"`
	Reason   string `json:"reason"`
	Owner    string `json:"owner"`
}

func jsonLines(t *testing.T, out string) []record {
	t.Helper()
	var rs []record
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if line == "" {
			continue
		}
		var r record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("line %q is not JSON: %v", line, err)
		}
		rs = append(rs, r)
	}
	return rs
}

func keysOf(rs []record) []string {
	var ks []string
	for _, r := range rs {
		ks = append(ks, r.Key)
	}
	return ks
}

// exercise runs every command but migrate on the store at storeURL, on keys
// under a prefix of its own. private says that the store holds nothing else
// (its own Redis prefix or SQL table), so that ls without -prefix lists
// exactly these keys.
func exercise(t *testing.T, storeURL string, private bool) {
	ctx := ctxT(t, 2*time.Minute)
	st, err := stores.Open(ctx, storeURL)
	if err != nil {
		t.Fatalf("open %s: %v", storeURL, err)
	}
	t.Cleanup(func() { _ = st.Close() })
	a, ok := st.(inbox.Admin)
	if !ok {
		t.Fatalf("the store %T does not implement inbox.Admin", st)
	}
	p := "inboxctl-live-" + randomName(t) + ":"
	avail, inProgress, processed, dead := p+"a-available", p+"b-in-progress", p+"c-processed", p+"d-dead"
	keys := []string{avail, inProgress, processed, dead}
	t.Cleanup(func() {
		for _, k := range keys {
			_ = a.Forget(context.Background(), k)
		}
	})
	claim := func(k string) inbox.Claim {
		c, err := st.TryBegin(ctx, k, inbox.BeginOptions{Lease: time.Hour, Owner: "live-test"})
		if err != nil || c.Status != inbox.Acquired {
			t.Fatalf("TryBegin(%q) = %+v, %v", k, c, err)
		}
		return c
	}
	if err := st.Release(ctx, avail, claim(avail).LeaseID); err != nil {
		t.Fatal(err)
	}
	claim(inProgress)
	if err := st.Complete(ctx, processed, claim(processed).LeaseID); err != nil {
		t.Fatal(err)
	}
	if err := st.Fail(ctx, dead, claim(dead).LeaseID, inbox.FailOptions{Dead: true, Reason: "poison"}); err != nil {
		t.Fatal(err)
	}
	s := []string{"-store", storeURL}

	all := jsonLines(t, ctlOK(t, append(s, "ls", "-prefix", p, "-json")...).stdout)
	if !slices.Equal(keysOf(all), keys) {
		t.Fatalf("ls -prefix = %q, want %q", keysOf(all), keys)
	}
	for i, want := range []string{"Available", "InProgress", "Processed", "Dead"} {
		if all[i].Status != want || all[i].Attempts != 1 {
			t.Errorf("ls lists %+v, want %s with 1 attempt", all[i], want)
		}
	}
	if private {
		if got := keysOf(jsonLines(t, ctlOK(t, append(s, "ls", "-json")...).stdout)); !slices.Equal(got, keys) {
			t.Fatalf("ls of the private store = %q, want %q", got, keys)
		}
	}
	table := ctlOK(t, append(s, "ls", "-prefix", p, "-state", "in-progress")...).stdout
	if lines := strings.Split(strings.TrimSuffix(table, "\n"), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[1], inProgress+" ") {
		t.Fatalf("ls -state in-progress printed:\n%s", table)
	}
	if d := jsonLines(t, ctlOK(t, append(s, "-json", "ls", "-prefix", p, "-state", "dead")...).stdout); len(d) != 1 || d[0].Key != dead || d[0].Reason != "poison" {
		t.Fatalf("ls -state dead = %+v", d)
	}
	// -limit keeps the first records by key.
	r := ctlOK(t, append(s, "ls", "-prefix", p, "-json", "-limit", "3")...)
	if got := keysOf(jsonLines(t, r.stdout)); !slices.Equal(got, keys[:3]) || !strings.Contains(r.stderr, "stopped at -limit 3") {
		t.Fatalf("ls -limit 3 = %q, stderr %q; want %q and the note that more may match", got, r.stderr, keys[:3])
	}
	if g := jsonLines(t, ctlOK(t, append(s, "get", dead, "-json")...).stdout); len(g) != 1 || g[0].Status != "Dead" || g[0].Reason != "poison" || g[0].Owner != "live-test" {
		t.Fatalf("get -json = %+v", g)
	}

	for _, cmd := range []string{"release", "forget"} {
		if r := ctl(t, append(s, cmd, inProgress)...); r.code != 3 || !strings.Contains(r.stderr, "its lease is live") || !strings.Contains(r.stderr, "-force") {
			t.Fatalf("%s of a live lease without -force: exit %d, stderr %q; want 3 and a message asking for -force", cmd, r.code, r.stderr)
		}
	}
	if out := ctlOK(t, append(s, "release", "-dry-run", "-force", inProgress)...).stdout; !strings.HasPrefix(out, "would release "+inProgress) {
		t.Fatalf("release -dry-run printed %q", out)
	}
	if out := ctlOK(t, append(s, "release", "-force", inProgress)...).stdout; !strings.HasPrefix(out, "released "+inProgress) {
		t.Fatalf("release printed %q", out)
	}
	if c := claim(inProgress); c.Attempts != 2 {
		t.Fatalf("claim after release: attempts %d, want 2", c.Attempts)
	}
	if out := ctlOK(t, append(s, "forget", dead)...).stdout; !strings.HasPrefix(out, "forgot "+dead) {
		t.Fatalf("forget printed %q", out)
	}
	if c := claim(dead); c.Attempts != 1 {
		t.Fatalf("claim after forget: attempts %d, want 1", c.Attempts)
	}
}

func TestLive_redis(t *testing.T) {
	t.Parallel()
	base := testenv.Redis.URL(t)
	exercise(t, withParams(t, base, "prefix", "inboxctl-test-"+randomName(t)+":"), true)
}

// ls -limit N prints the first N keys in key order, on Redis too, whose
// SCAN walks keys in the order of its hash table (issue 30: over k001 to
// k250, ls -limit 5 printed k012 k014 k084 k183 k246).
func TestLive_redis_ls_limit_prints_the_first_keys(t *testing.T) {
	t.Parallel()
	storeURL := withParams(t, testenv.Redis.URL(t), "prefix", "inboxctl-order-"+randomName(t)+":")
	ctx := ctxT(t, time.Minute)
	st, err := stores.Open(ctx, storeURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	var keys []string
	for i := 1; i <= 250; i++ {
		k := fmt.Sprintf("k%03d", i)
		if err := st.MarkProcessed(ctx, k); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	t.Cleanup(func() {
		for _, k := range keys {
			_ = st.(inbox.Admin).Forget(context.Background(), k)
		}
	})
	r := ctlOK(t, "-store", storeURL, "ls", "-limit", "5", "-json")
	if got := keysOf(jsonLines(t, r.stdout)); !slices.Equal(got, keys[:5]) {
		t.Fatalf("ls -limit 5 over k001 to k250 printed %q, want %q", got, keys[:5])
	}
	r = ctlOK(t, "-store", storeURL, "ls", "-limit", "1000", "-json")
	if got := keysOf(jsonLines(t, r.stdout)); !slices.Equal(got, keys) || r.stderr != "" {
		t.Fatalf("ls -limit 1000 printed %d keys (stderr %q), want the 250 in key order", len(got), r.stderr)
	}
}

// The acceptance, as written, on the shared Redis (default prefix
// "inbox:", whatever else it holds): it exits 0 and prints a table or says
// that nothing matches.
func TestLive_redis_acceptance_command(t *testing.T) {
	t.Parallel()
	storeURL := "redis://127.0.0.1:6379/0"
	if u, ok := os.LookupEnv(testenv.Redis.Env); ok && u != "" {
		storeURL = u
	}
	testenv.Redis.URL(t)
	cmd := exec.CommandContext(ctxT(t, 10*time.Minute), "go", "run", "./cmd/inboxctl", "-store", storeURL, "ls", "-state", "in-progress")
	cmd.Dir = filepath.Join("..", "..")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("go run ./cmd/inboxctl -store %s ls -state in-progress: %v\nstdout:\n%s\nstderr:\n%s", storeURL, err, out.String(), errb.String())
	}
	if s := out.String(); !strings.HasPrefix(s, "KEY ") && s != "no records match\n" {
		t.Fatalf("ls printed %q, want a table or \"no records match\"", s)
	}
}

// The acceptance for stuck leases, on Redis and PostgreSQL: a
// handler hangs under the inbox middleware, whose heartbeat keeps its
// 1-second lease alive; once the lease is 2 s old, the program itself, `go
// run ./cmd/inboxctl -store URL ls -stuck 2s`, lists it, and not a lease
// acquired just before. Each store under a prefix or in a table of its own.
func TestLive_stuck_lease_acceptance_command(t *testing.T) {
	t.Parallel()
	cases := map[string]func(t *testing.T) string{
		"redis": func(t *testing.T) string {
			return withParams(t, testenv.Redis.URL(t), "prefix", "inboxctl-stuck-"+randomName(t)+":")
		},
		"postgres": func(t *testing.T) string {
			base := testenv.Postgres.URL(t)
			table := "inboxctl_stuck_" + randomName(t)
			t.Cleanup(func() {
				db, err := sql.Open("pgx", base)
				if err != nil {
					t.Error(err)
					return
				}
				defer db.Close()
				if _, err := db.Exec(`DROP TABLE IF EXISTS "` + table + `", "` + table + `_order"`); err != nil {
					t.Errorf("drop %s: %v", table, err)
				}
			})
			return withParams(t, base, "table", table, "migrate", "true")
		},
	}
	for name, mk := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			storeURL := mk(t)
			stuckLease(t, storeURL)
		})
	}
}

func stuckLease(t *testing.T, storeURL string) {
	const lease, stuck = time.Second, 2 * time.Second
	ctx := ctxT(t, 5*time.Minute)
	st, err := stores.Open(ctx, storeURL)
	if err != nil {
		t.Fatalf("open %s: %v", storeURL, err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ib, err := inboxmw.New(inboxmw.Config{Store: st, Bus: "live", Group: "stuck", Alias: keying.StaticAlias("h"), Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	const hungKey, freshKey = "live:stuck:h:hung", "live:stuck:h:fresh"
	started, release := make(chan struct{}), make(chan struct{})
	handled := make(chan error, 1)
	go func() {
		msg := message.NewMessage("hung", nil)
		msg.Metadata.Set("IdempotencyKey", "hung")
		_, err := ib.Middleware(func(*message.Message) ([]*message.Message, error) {
			close(started)
			<-release // hung, until the test ends
			return nil, errors.New("released by the test")
		})(msg)
		handled <- err
	}()
	t.Cleanup(func() {
		close(release)
		<-handled
		if err := ib.Close(context.Background()); err != nil {
			t.Errorf("Inbox.Close: %v", err)
		}
	})
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the handler never ran")
	}
	// Poll (in-process) until the lease is old enough to be listed.
	s := []string{"-store", storeURL}
	var held record
	for held.Key == "" {
		for _, r := range jsonLines(t, ctlOK(t, append(s, "ls", "-stuck", stuck.String(), "-json")...).stdout) {
			if r.Key == hungKey {
				held = r
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("ls -stuck %s never listed the hung handler's lease", stuck)
		}
		time.Sleep(100 * time.Millisecond) // polling: the lease must age
	}
	rec, err := st.Get(ctx, hungKey)
	if err != nil {
		t.Fatal(err)
	}
	// Held for at least 2 s on a 1 s lease, and live: the heartbeat ran.
	if rec.State != inbox.StateInProgress || rec.LeaseUntil.Sub(rec.LastSeen) <= lease+lease/2 {
		t.Fatalf("the hung handler's record %+v: want InProgress with a lease extended past its first second", rec)
	}
	// A lease acquired just now is live, not stuck.
	c, err := st.TryBegin(ctx, freshKey, inbox.BeginOptions{Lease: time.Minute})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin(%q) = %+v, %v", freshKey, c, err)
	}
	if got := keysOf(jsonLines(t, ctlOK(t, append(s, "ls", "-stuck", stuck.String(), "-json")...).stdout)); !slices.Equal(got, []string{hungKey}) {
		t.Fatalf("ls -stuck %s = %q, want the hung lease only, not the one acquired just now", stuck, got)
	}
	if got := keysOf(jsonLines(t, ctlOK(t, append(s, "ls", "-state", "in-progress", "-json")...).stdout)); !slices.Equal(got, []string{freshKey, hungKey}) {
		t.Fatalf("ls -state in-progress = %q, want both leases", got)
	}
	// Processed, so that the command's listing does not depend on how long
	// go run takes to build.
	if err := st.Complete(ctx, freshKey, c.LeaseID); err != nil {
		t.Fatal(err)
	}

	cmd := exec.CommandContext(ctx, "go", "run", "./cmd/inboxctl", "-store", storeURL, "ls", "-stuck", stuck.String())
	cmd.Dir = filepath.Join("..", "..")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("go run ./cmd/inboxctl ls -stuck %s: %v\nstdout:\n%s\nstderr:\n%s", stuck, err, out.String(), errb.String())
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "KEY ") || !strings.HasPrefix(lines[1], hungKey+" ") ||
		!strings.Contains(lines[1], " InProgress ") {
		t.Fatalf("go run ./cmd/inboxctl ls -stuck %s printed:\n%s\nwant a table of the hung handler's lease only", stuck, out.String())
	}
}

// sqlCase is one SQL server: its URL and how to drop a table there.
type sqlCase struct {
	url  string
	drop func(t *testing.T, table string)
}

func TestLive_sql_migrate(t *testing.T) {
	t.Parallel()
	for name, mk := range sqlCases() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := mk(t)
			table := "inboxctl_" + randomName(t)
			storeURL := withParams(t, c.url, "table", table)
			t.Cleanup(func() { c.drop(t, table) })

			ddl := ctlOK(t, "migrate", "-print", "-store", storeURL).stdout
			if !strings.Contains(ddl, "CREATE TABLE IF NOT EXISTS") || !strings.Contains(ddl, table) {
				t.Fatalf("migrate -print printed:\n%s", ddl)
			}
			if st, err := stores.Open(ctxT(t, time.Minute), storeURL); err == nil {
				_ = st.Close()
				t.Fatal("the store opened before migrate: is the table really new?")
			} else if !errors.Is(err, stores.ErrMisconfigured) {
				t.Fatalf("open before migrate: %v, want a missing table (ErrMisconfigured)", err)
			}
			out := ctlOK(t, "migrate", "-store", storeURL).stdout
			if !strings.HasPrefix(out, "migrated ") || !strings.Contains(out, "table "+table+" and its index exist") {
				t.Fatalf("migrate printed %q", out)
			}
			ctlOK(t, "-store", storeURL, "migrate") // again: nothing to do
			exercise(t, storeURL, true)
		})
	}
}

// cleanup counts a SQL store's expired records (-dry-run) and deletes them;
// on a store that deletes them itself it says so. The URL given to inboxctl
// says cleanup=off so that the store's own janitor leaves the rows to the
// command.
func TestLive_sql_cleanup(t *testing.T) {
	t.Parallel()
	for name, mk := range sqlCases() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := mk(t)
			table := "inboxctl_" + randomName(t)
			storeURL := withParams(t, c.url, "table", table, "cleanup", "off")
			t.Cleanup(func() { c.drop(t, table) })
			st, err := stores.Open(ctxT(t, time.Minute), withParams(t, storeURL, "migrate", "true", "retention", "1ms"))
			if err != nil {
				t.Fatal(err)
			}
			for i := range 5 {
				if err := st.MarkProcessed(ctxT(t, time.Minute), fmt.Sprintf("rabbit:billing:charge:%d", i)); err != nil {
					t.Fatal(err)
				}
			}
			testenv.Eventually(t, 30*time.Second, "the five records to expire", func() bool {
				return !slices.ContainsFunc([]int{0, 4}, func(i int) bool {
					ok, err := st.IsProcessed(ctxT(t, time.Minute), fmt.Sprintf("rabbit:billing:charge:%d", i))
					return err != nil || ok
				})
			})
			_ = st.Close()

			out := ctlOK(t, "cleanup", "-dry-run", "-store", storeURL).stdout
			if !strings.HasSuffix(out, ": 5 expired records to delete (dry run: nothing deleted)\n") {
				t.Fatalf("cleanup -dry-run printed %q", out)
			}
			var got struct {
				Supported bool   `json:"supported"`
				Deleted   *int64 `json:"deleted"`
				Backlog   *int64 `json:"backlog"`
			}
			if err := json.Unmarshal([]byte(ctlOK(t, "-json", "cleanup", "-store", storeURL).stdout), &got); err != nil {
				t.Fatal(err)
			}
			if !got.Supported || got.Deleted == nil || *got.Deleted != 5 || got.Backlog == nil || *got.Backlog != 0 {
				t.Fatalf("cleanup -json: %+v, want supported, 5 deleted, a backlog of 0", got)
			}
			out = ctlOK(t, "cleanup", "-store", storeURL).stdout
			if !strings.HasSuffix(out, ": 0 expired records deleted; 0 expired records left (those that expired meanwhile)\n") {
				t.Fatalf("cleanup of a clean table printed %q", out)
			}
		})
	}
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		out := ctlOK(t, "cleanup", "-store", "memory://").stdout
		if !strings.Contains(out, "memory:// deletes expired records itself") {
			t.Fatalf("cleanup of a memory store printed %q", out)
		}
	})
}

// sqlCases are the SQL servers the tests run inboxctl against.
func sqlCases() map[string]func(t *testing.T) sqlCase {
	return map[string]func(t *testing.T) sqlCase{
		"postgres": func(t *testing.T) sqlCase {
			base := testenv.Postgres.URL(t)
			return sqlCase{base, func(t *testing.T, table string) {
				db, err := sql.Open("pgx", base)
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				if _, err := db.Exec(`DROP TABLE IF EXISTS "` + table + `", "` + table + `_order"`); err != nil {
					t.Errorf("drop %s: %v", table, err)
				}
			}}
		},
		"mysql": func(t *testing.T) sqlCase {
			base := testenv.MySQL.URL(t)
			return sqlCase{base, func(t *testing.T, table string) {
				u, _ := url.Parse(base)
				cfg := mysql.NewConfig()
				cfg.User = u.User.Username()
				cfg.Passwd, _ = u.User.Password()
				cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, strings.TrimPrefix(u.Path, "/")
				db, err := sql.Open("mysql", cfg.FormatDSN())
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				if _, err := db.Exec("DROP TABLE IF EXISTS `" + table + "`"); err != nil {
					t.Errorf("drop %s: %v", table, err)
				}
			}}
		},
		"sqlite": func(t *testing.T) sqlCase {
			return sqlCase{"sqlite://" + filepath.ToSlash(filepath.Join(t.TempDir(), "inbox.db")), func(*testing.T, string) {}}
		},
	}
}

func TestLive_migrate_refuses_other_stores(t *testing.T) {
	t.Parallel()
	r := ctl(t, "migrate", "-print", "-store", "redis://u:s3cr3t@127.0.0.1:6379/0")
	if r.code != 2 || !strings.Contains(r.stderr, "is not a SQL store URL (mysql://, postgres://, postgresql://, sqlite://)") || strings.Contains(r.stderr, "s3cr3t") {
		t.Fatalf("migrate of a Redis URL: exit %d, stderr %q", r.code, r.stderr)
	}
}

// orderLive runs order and order-release on the store at storeURL, which
// keeps order, on an order key of its own whose dead head two keys wait
// behind, and leaves nothing waiting on it.
func orderLive(t *testing.T, storeURL string) {
	ctx := ctxT(t, 2*time.Minute)
	st, err := stores.Open(ctx, storeURL)
	if err != nil {
		t.Fatalf("open %s: %v", storeURL, err)
	}
	t.Cleanup(func() { _ = st.Close() })
	p := "inboxctl-order-" + randomName(t) + ":"
	ok, head, a, b := p+"acct-9", p+"o1", p+"o2", p+"o3"
	t.Cleanup(func() {
		for _, k := range []string{head, a, b} {
			_ = st.(inbox.Admin).Forget(context.Background(), k)
		}
	})
	c, err := st.TryBegin(ctx, head, inbox.BeginOptions{OrderKey: ok})
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin(head) = %+v, %v", c, err)
	}
	if err := st.Fail(ctx, head, c.LeaseID, inbox.FailOptions{Dead: true, OrderKey: ok, Reason: "poison"}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{a, b} {
		if c, err := st.TryBegin(ctx, k, inbox.BeginOptions{OrderKey: ok}); err != nil || c.Status != inbox.Behind {
			t.Fatalf("TryBegin(%s) = %+v, %v; want Behind", k, c, err)
		}
	}
	s := []string{"-store", storeURL}
	type gate struct {
		Head    *record  `json:"head"`
		Waiting []string `json:"waiting"`
	}
	var g struct {
		OrderKey string `json:"orderKey"`
		gate
	}
	if err := json.Unmarshal([]byte(ctlOK(t, append(s, "-json", "order", ok)...).stdout), &g); err != nil {
		t.Fatal(err)
	}
	if g.OrderKey != ok || g.Head == nil || g.Head.Key != head || g.Head.Status != "Dead" || g.Head.Reason != "poison" || !slices.Equal(g.Waiting, []string{a, b}) {
		t.Fatalf("order -json = %+v, want the dead head and the two keys behind it", g)
	}
	if out := ctlOK(t, append(s, "order", ok)...).stdout; !strings.Contains(out, "blocked: the head is dead") {
		t.Fatalf("order printed:\n%s", out)
	}
	ctlOK(t, append(s, "order-release", "-dry-run", ok)...)
	if out := ctlOK(t, append(s, "order-release", ok)...).stdout; !strings.HasPrefix(out, "released order key "+ok+" past "+head+": "+a+" runs next") {
		t.Fatalf("order-release printed:\n%s", out)
	}
	// a has not come back: its head is not dead, so -force it is; then b.
	if r := ctl(t, append(s, "order-release", ok)...); r.code != 3 || !strings.Contains(r.stderr, "refused: its head "+a+" is not dead") {
		t.Fatalf("order-release of a head that is not dead: exit %d, stderr %q", r.code, r.stderr)
	}
	ctlOK(t, append(s, "order-release", "-force", ok)...)
	ctlOK(t, append(s, "order-release", "-force", ok)...)
	if out := ctlOK(t, append(s, "order", ok)...).stdout; out != ok+": nothing waits (no message of the order key waits behind another)\n" {
		t.Fatalf("order after releasing every head printed %q", out)
	}
	if c, err := st.TryBegin(ctx, b, inbox.BeginOptions{OrderKey: ok}); err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin(%s) once nothing waits = %+v, %v; want Acquired", b, c, err)
	}
}

// order and order-release on Redis and PostgreSQL, which keep order; a
// store that keeps none says so.
func TestLive_order(t *testing.T) {
	t.Parallel()
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		orderLive(t, withParams(t, testenv.Redis.URL(t), "prefix", "inboxctl-test-"+randomName(t)+":"))
	})
	cases := sqlCases()
	for _, name := range []string{"postgres", "mysql"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := cases[name](t)
			table := "inboxctl_" + randomName(t)
			storeURL := withParams(t, c.url, "table", table, "migrate", "true")
			t.Cleanup(func() { c.drop(t, table) })
			if name == "postgres" {
				orderLive(t, storeURL)
				return
			}
			r := ctl(t, "-store", storeURL, "order", "k")
			if r.code != 1 || !strings.Contains(r.stderr, "does not keep the order of order keys: inbox: not supported") {
				t.Fatalf("order on %s: exit %d, stderr %q", name, r.code, r.stderr)
			}
		})
	}
}
