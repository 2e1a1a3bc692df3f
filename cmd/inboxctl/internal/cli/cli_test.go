package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/cmd/inboxctl/internal/cli"
	"github.com/watermill-inbox/inbox/stores"
	"github.com/watermill-inbox/inbox/stores/memory"
)

// shared is a memory store that several commands run on: Run closes the
// store it opened, so Close here does nothing (the test closes the store).
type shared struct{ *memory.Store }

func (shared) Close() error { return nil }

// noAdmin hides the store's inbox.Admin, as a third-party store would lack it.
type noAdmin struct{ stores.Store }

func (noAdmin) Close() error { return nil }

func newStore(t *testing.T) *memory.Store {
	t.Helper()
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// result is what one run of inboxctl printed and returned.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// env is a test's inboxctl environment: stores opened by URL come from open.
type env struct {
	open     func(ctx context.Context, rawURL string) (stores.Store, error)
	getenv   map[string]string
	migrator *cli.Migrator
}

// onStore runs commands on st, whatever the -store URL says.
func onStore(st stores.Store) env {
	return env{open: func(context.Context, string) (stores.Store, error) { return st, nil }}
}

func (e env) run(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Run(context.Background(), args, cli.Env{
		Stdout: &out, Stderr: &errb,
		Getenv:   func(k string) string { return e.getenv[k] },
		Open:     e.open,
		Migrator: e.migrator,
	})
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// ok runs args with -store and wants exit status 0 and nothing on stderr.
func (e env) ok(t *testing.T, args ...string) result {
	t.Helper()
	r := e.run(t, append([]string{"-store", "memory://"}, args...)...)
	if r.code != cli.ExitOK || r.stderr != "" {
		t.Fatalf("inboxctl %q: %v", args, r)
	}
	return r
}

// fails runs args and wants exit status code and a one-line error on stderr
// that holds every string of want.
func (e env) fails(t *testing.T, code int, args []string, want ...string) result {
	t.Helper()
	r := e.run(t, args...)
	if r.code != code {
		t.Fatalf("inboxctl %q: want exit %d, got %v", args, code, r)
	}
	if r.stdout != "" {
		t.Errorf("inboxctl %q printed on stdout: %q", args, r.stdout)
	}
	if !strings.HasPrefix(r.stderr, "inboxctl: ") || strings.Count(r.stderr, "\n") != 1 || !strings.HasSuffix(r.stderr, "\n") {
		t.Errorf("inboxctl %q: want one line starting with \"inboxctl: \" on stderr, got %q", args, r.stderr)
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("inboxctl %q: stderr %q does not say %q", args, r.stderr, w)
		}
	}
	return r
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func begin(t *testing.T, st inbox.LeaseStore, key string, opts inbox.BeginOptions) inbox.Claim {
	t.Helper()
	if opts.Lease == 0 {
		opts.Lease = time.Hour
	}
	c, err := st.TryBegin(ctxT(t), key, opts)
	if err != nil || c.Status != inbox.Acquired {
		t.Fatalf("TryBegin(%q) = %+v, %v; want Acquired", key, c, err)
	}
	return c
}

func get(t *testing.T, st inbox.LeaseStore, key string) inbox.Record {
	t.Helper()
	r, err := st.Get(ctxT(t), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return r
}

// fixture keys, one in each state, under prefix "p:".
const (
	kAvailable  = "p:a-released"
	kBackoff    = "p:b-backoff"
	kInProgress = "p:c-in-progress"
	kProcessed  = "p:d-processed"
	kDead       = "p:e-dead"
	kOther      = "q:other" // outside the prefix
)

var fixtureKeys = []string{kAvailable, kBackoff, kInProgress, kProcessed, kDead}

func populate(t *testing.T, st inbox.LeaseStore) {
	t.Helper()
	ctx := ctxT(t)
	c := begin(t, st, kAvailable, inbox.BeginOptions{Owner: "host-1"})
	if err := st.Release(ctx, kAvailable, c.LeaseID); err != nil {
		t.Fatal(err)
	}
	c = begin(t, st, kBackoff, inbox.BeginOptions{Owner: "host-2"})
	if err := st.Fail(ctx, kBackoff, c.LeaseID, inbox.FailOptions{RetryAfter: time.Hour, Reason: "timeout\ncalling the bank"}); err != nil {
		t.Fatal(err)
	}
	begin(t, st, kInProgress, inbox.BeginOptions{Owner: "host-3", PayloadHash: "abc123"})
	c = begin(t, st, kProcessed, inbox.BeginOptions{})
	if err := st.Complete(ctx, kProcessed, c.LeaseID); err != nil {
		t.Fatal(err)
	}
	c = begin(t, st, kDead, inbox.BeginOptions{Owner: "host-4"})
	if err := st.Fail(ctx, kDead, c.LeaseID, inbox.FailOptions{Dead: true, Reason: "poison: " + strings.Repeat("x", 100)}); err != nil {
		t.Fatal(err)
	}
	if err := st.MarkProcessed(ctx, kOther); err != nil {
		t.Fatal(err)
	}
}

// record is a record as -json prints it.
type record struct {
	Key         string     `json:"key"`
	Status      string     `json:"status"`
	Attempts    *int       `json:"attempts"`
	FirstSeen   *time.Time `json:"firstSeen"`
	LastSeen    *time.Time `json:"lastSeen"`
	LeaseUntil  *time.Time `json:"leaseUntil"`
	RetryAt     *time.Time `json:"retryAt"`
	Owner       string     `json:"owner"`
	PayloadHash string     `json:"payloadHash"`
	Reason      string     `json:"reason"`
}

// jsonLines decodes stdout as JSON objects, one a line, and checks that
// each holds only known fields and UTC RFC 3339 times.
func jsonLines[T any](t *testing.T, stdout string) []T {
	t.Helper()
	var out []T
	sc := bufio.NewScanner(strings.NewReader(stdout))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		var v T
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("output line %q is not a JSON object of the documented fields: %v", line, err)
		}
		var raw map[string]any
		_ = json.Unmarshal(line, &raw)
		checkTimes(t, raw)
		out = append(out, v)
	}
	return out
}

// checkTimes wants the time fields of a JSON object (and of its before and
// after) in RFC 3339 UTC.
func checkTimes(t *testing.T, obj map[string]any) {
	t.Helper()
	for k, v := range obj {
		switch v := v.(type) {
		case map[string]any:
			checkTimes(t, v)
		case string:
			if k == "firstSeen" || k == "lastSeen" || k == "leaseUntil" || k == "retryAt" {
				if _, err := time.Parse(time.RFC3339Nano, v); err != nil || !strings.HasSuffix(v, "Z") {
					t.Errorf("%s = %q, want an RFC 3339 time in UTC", k, v)
				}
			}
		}
	}
}

func keysOf(rs []record) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Key
	}
	return out
}

func TestGet_prints_the_record(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	populate(t, st)
	e := onStore(shared{st})
	want := get(t, st, kInProgress)

	out := e.ok(t, "get", kInProgress).stdout
	for _, line := range []string{
		"key           " + kInProgress,
		"state         InProgress",
		"attempts      1",
		"first seen    " + want.FirstSeen.UTC().Format(time.RFC3339),
		"last seen     " + want.LastSeen.UTC().Format(time.RFC3339),
		"lease until   " + want.LeaseUntil.UTC().Format(time.RFC3339),
		"retry at      -",
		"owner         host-3",
		"payload hash  abc123",
		"reason        -",
	} {
		if !strings.Contains(out, line+"\n") {
			t.Errorf("get's output lacks the line %q:\n%s", line, out)
		}
	}

	rs := jsonLines[record](t, e.ok(t, "-json", "get", kInProgress).stdout)
	if len(rs) != 1 {
		t.Fatalf("get -json printed %d objects, want 1", len(rs))
	}
	r := rs[0]
	if r.Key != kInProgress || r.Status != "InProgress" || r.Attempts == nil || *r.Attempts != 1 ||
		r.Owner != "host-3" || r.PayloadHash != "abc123" || r.Reason != "" || r.RetryAt != nil ||
		r.LeaseUntil == nil || !r.LeaseUntil.Equal(want.LeaseUntil) ||
		r.FirstSeen == nil || !r.FirstSeen.Equal(want.FirstSeen) || r.LastSeen == nil || !r.LastSeen.Equal(want.LastSeen) {
		t.Fatalf("get -json = %+v, want the record %+v", r, want)
	}

	dead := jsonLines[record](t, e.ok(t, "get", kDead, "-json").stdout)
	if len(dead) != 1 || dead[0].Status != "Dead" || !strings.HasPrefix(dead[0].Reason, "poison: xxx") || len(dead[0].Reason) != 108 {
		t.Fatalf("get -json of the dead key = %+v, want Dead with its whole reason", dead)
	}
	backoff := e.ok(t, "get", kBackoff).stdout
	if !strings.Contains(backoff, `reason        "timeout\ncalling the bank"`) || strings.Contains(backoff, "retry at      -") {
		t.Fatalf("get of a key in a backoff: want its retry time and its reason quoted on one line, got:\n%s", backoff)
	}
}

func TestGet_not_found(t *testing.T) {
	t.Parallel()
	e := onStore(shared{newStore(t)})
	out := e.ok(t, "get", "p:never-seen").stdout
	if out != "p:never-seen: not found (the store has no live record of it: never seen, expired, or forgotten)\n" {
		t.Fatalf("get of an unknown key printed %q", out)
	}
	rs := jsonLines[record](t, e.ok(t, "get", "-json", "p:never-seen").stdout)
	if len(rs) != 1 || rs[0].Key != "p:never-seen" || rs[0].Status != "NotFound" || rs[0].Attempts == nil || *rs[0].Attempts != 0 || rs[0].FirstSeen != nil {
		t.Fatalf("get -json of an unknown key = %+v, want status NotFound, attempts 0 and no times", rs)
	}
}

func TestLs_filters(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	populate(t, st)
	e := onStore(shared{st})

	all := jsonLines[record](t, e.ok(t, "ls", "-prefix", "p:", "-json").stdout)
	if !slices.Equal(keysOf(all), fixtureKeys) {
		t.Fatalf("ls -prefix p: -json = %q, want %q in key order", keysOf(all), fixtureKeys)
	}
	for _, r := range all {
		if want := get(t, st, r.Key).State.String(); r.Status != want {
			t.Errorf("ls says %s is %s, Get says %s", r.Key, r.Status, want)
		}
	}
	if got := jsonLines[record](t, e.ok(t, "ls", "-json").stdout); len(got) != len(fixtureKeys)+1 {
		t.Fatalf("ls without filters listed %q, want every key", keysOf(got))
	}
	for state, want := range map[string][]string{
		"available":   {kAvailable, kBackoff},
		"in-progress": {kInProgress},
		"InProgress":  {kInProgress},
		"processed":   {kProcessed},
		"dead":        {kDead},
	} {
		got := jsonLines[record](t, e.ok(t, "-json", "ls", "-prefix", "p:", "-state", state).stdout)
		if !slices.Equal(keysOf(got), want) {
			t.Errorf("ls -state %s = %q, want %q", state, keysOf(got), want)
		}
	}
	if out := e.ok(t, "ls", "-older-than", "1h").stdout; out != "no records match\n" {
		t.Fatalf("ls -older-than 1h of records just written printed %q, want none", out)
	}
	if out := e.ok(t, "ls", "-json", "-state", "dead", "-prefix", "q:").stdout; out != "" {
		t.Fatalf("ls -json that matches nothing printed %q, want nothing", out)
	}

	table := e.ok(t, "ls", "-prefix", "p:").stdout
	lines := strings.Split(strings.TrimSuffix(table, "\n"), "\n")
	if len(lines) != 1+len(fixtureKeys) || !strings.HasPrefix(lines[0], "KEY ") {
		t.Fatalf("ls's table: want a header and %d rows, got:\n%s", len(fixtureKeys), table)
	}
	for _, h := range []string{"STATE", "ATTEMPTS", "LAST SEEN", "LEASE UNTIL", "RETRY AT", "OWNER", "REASON"} {
		if !strings.Contains(lines[0], h) {
			t.Errorf("ls's header %q lacks %s", lines[0], h)
		}
	}
	for i, k := range fixtureKeys {
		f := strings.Fields(lines[1+i])
		if f[0] != k || f[1] != get(t, st, k).State.String() || f[2] != "1" {
			t.Errorf("ls's row %q: want key %s, its state and 1 attempt", lines[1+i], k)
		}
	}
	if row := lines[5]; !strings.Contains(row, "poison: xxx") || !strings.HasSuffix(row, "x…") || strings.Count(row, "x") > 60 {
		t.Errorf("ls's row of the dead key %q: want its reason cut to 60 characters", row)
	}
	if row := lines[2]; !strings.Contains(row, `"timeout\ncalling the bank"`) {
		t.Errorf("ls's row of the key in a backoff %q: want its reason quoted on one line", row)
	}
}

// The older-than filter on the store's clock: records appear once old
// enough.
func TestLs_older_than(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	populate(t, st)
	e := onStore(shared{st})
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := jsonLines[record](t, e.ok(t, "ls", "-json", "-prefix", "p:", "-older-than", "50ms").stdout)
		if slices.Equal(keysOf(got), fixtureKeys) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ls -older-than 50ms still lists %q after 10 s, want %q", keysOf(got), fixtureKeys)
		}
		time.Sleep(10 * time.Millisecond) // polling: the records must age
	}
}

// ls -stuck D lists the leases acquired at least D ago, however often their
// heartbeat extended them since: a handler that hangs while its heartbeat
// runs.
func TestLs_stuck(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	populate(t, st)
	e := onStore(shared{st})
	const hung = "p:hung"
	c := begin(t, st, hung, inbox.BeginOptions{Lease: time.Second, Owner: "stuck-host"})
	var until time.Time
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		if until, err = st.Extend(ctxT(t), hung, c.LeaseID, time.Second); err != nil { // the heartbeat
			t.Fatal(err)
		}
		got := jsonLines[record](t, e.ok(t, "ls", "-json", "-stuck", "200ms").stdout)
		if slices.Contains(keysOf(got), hung) {
			// The fixture's lease is older still; the processed, dead and
			// released keys are not leases.
			if !slices.Equal(keysOf(got), []string{kInProgress, hung}) {
				t.Fatalf("ls -stuck 200ms = %q, want %q", keysOf(got), []string{kInProgress, hung})
			}
			if r := got[1]; r.LeaseUntil == nil || !r.LeaseUntil.After(c.ExpiresAt) || r.LastSeen == nil || r.Owner != "stuck-host" {
				t.Fatalf("the stuck lease is listed as %+v: want its heartbeat's lease until (after %s), its last seen and owner", r, c.ExpiresAt)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ls -stuck 200ms never listed the lease extended for 10 s; last %q (extended until %s)", keysOf(got), until)
		}
		time.Sleep(50 * time.Millisecond) // the heartbeat's period; the listing decides
	}
	begin(t, st, "p:fresh", inbox.BeginOptions{})
	if got := keysOf(jsonLines[record](t, e.ok(t, "ls", "-json", "-stuck", "1h", "-prefix", "p:").stdout)); len(got) != 0 {
		t.Fatalf("ls -stuck 1h = %q, want none", got)
	}
	table := e.ok(t, "ls", "-stuck", "200ms", "-prefix", "p:").stdout
	if strings.Contains(table, "p:fresh") || !strings.Contains(table, hung+" ") {
		t.Fatalf("ls -stuck 200ms printed:\n%s\nwant the hung lease, not the fresh one", table)
	}
}

// recorder records the ListOptions of each List call, and serves at most
// pageSize records a page, with an empty page (and a new cursor) before each
// real one when gaps is set, as a store may answer (inbox.Admin.List).
type recorder struct {
	*memory.Store
	pageSize int
	gaps     bool

	mu    sync.Mutex
	calls []inbox.ListOptions
}

func (*recorder) Close() error { return nil }

func (r *recorder) List(ctx context.Context, opts inbox.ListOptions) (inbox.ListPage, error) {
	r.mu.Lock()
	r.calls = append(r.calls, opts)
	r.mu.Unlock()
	if r.gaps {
		inner, real := strings.CutPrefix(opts.Cursor, "gap:")
		if !real {
			return inbox.ListPage{Next: "gap:" + opts.Cursor}, nil
		}
		opts.Cursor = inner
	}
	if r.pageSize > 0 {
		opts.Limit = min(opts.Limit, r.pageSize)
	}
	return r.Store.List(ctx, opts)
}

func (r *recorder) Calls() []inbox.ListOptions {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

func TestLs_passes_its_flags_to_List(t *testing.T) {
	t.Parallel()
	rec := &recorder{Store: newStore(t)}
	onStore(rec).ok(t, "ls", "-state", "dead", "-prefix", "rabbit:billing:", "-older-than", "1d12h", "-limit", "5")
	want := inbox.ListOptions{State: inbox.StateDead, Prefix: "rabbit:billing:", OlderThan: 36 * time.Hour, Limit: 5}
	if calls := rec.Calls(); len(calls) != 1 || calls[0] != want {
		t.Fatalf("List calls %+v, want one with %+v", calls, want)
	}
	rec2 := &recorder{Store: newStore(t)}
	onStore(rec2).ok(t, "ls", "-state", "in-progress", "-older-than", "10m")
	want = inbox.ListOptions{State: inbox.StateInProgress, OlderThan: 10 * time.Minute, Limit: 100}
	if calls := rec2.Calls(); len(calls) != 1 || calls[0] != want {
		t.Fatalf("List calls %+v, want one with %+v (the default -limit)", calls, want)
	}
	for _, args := range [][]string{{"ls", "-stuck", "10m"}, {"ls", "-stuck", "10m", "-state", "in-progress"}} {
		rec3 := &recorder{Store: newStore(t)}
		onStore(rec3).ok(t, args...)
		if calls := rec3.Calls(); len(calls) != 1 || calls[0] != want {
			t.Fatalf("%q: List calls %+v, want one with %+v", args, calls, want)
		}
	}
}

func TestLs_pages_through_the_store(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	var want []string
	for i := range 7 {
		k := fmt.Sprintf("page:%02d", i)
		if err := st.MarkProcessed(ctxT(t), k); err != nil {
			t.Fatal(err)
		}
		want = append(want, k)
	}
	for _, gaps := range []bool{false, true} {
		t.Run(fmt.Sprintf("gaps=%v", gaps), func(t *testing.T) {
			rec := &recorder{Store: st, pageSize: 2, gaps: gaps}
			e := onStore(rec)
			got := jsonLines[record](t, e.ok(t, "ls", "-json").stdout)
			if !slices.Equal(keysOf(got), want) {
				t.Fatalf("ls over pages of 2 = %q, want %q once each, in order", keysOf(got), want)
			}
			if n := len(rec.Calls()); n < 4 {
				t.Fatalf("ls made %d List calls for 7 records in pages of 2", n)
			}
			if r := e.ok(t, "ls", "-json", "-limit", "7"); len(jsonLines[record](t, r.stdout)) != 7 {
				t.Fatalf("ls -limit 7 of 7 records: %v", r)
			}

			r := e.run(t, "-store", "memory://", "ls", "-json", "-limit", "5")
			if got := jsonLines[record](t, r.stdout); r.code != 0 || !slices.Equal(keysOf(got), want[:5]) {
				t.Fatalf("ls -limit 5: want the first 5 keys, got %v", r)
			}
			if r.stderr != "inboxctl: stopped at -limit 5; more records may match (raise -limit, or narrow with -state, -prefix, -older-than)\n" {
				t.Fatalf("ls that stops at -limit: stderr %q, want the note that more may match", r.stderr)
			}
			table := e.run(t, "-store", "memory://", "ls", "-limit", "3")
			if table.code != 0 || strings.Count(table.stdout, "\n") != 4 || !strings.Contains(table.stderr, "stopped at -limit 3") {
				t.Fatalf("ls -limit 3 as text: want a header, 3 rows and the note, got %v", table)
			}
		})
	}
}

// unordered is a store whose List breaks the contract: its second page
// starts before the end of its first.
type unordered struct{ *memory.Store }

func (unordered) Close() error { return nil }

func (u unordered) List(ctx context.Context, opts inbox.ListOptions) (inbox.ListPage, error) {
	if opts.Cursor == "" {
		return inbox.ListPage{Items: []inbox.ListItem{{Key: "b"}}, Next: "b"}, nil
	}
	return inbox.ListPage{Items: []inbox.ListItem{{Key: "a"}}}, nil
}

// ls prints records in key order as the store lists them, and fails on a
// store that lists out of order rather than print what it says it does not.
func TestLs_refuses_a_listing_out_of_key_order(t *testing.T) {
	t.Parallel()
	r := onStore(unordered{newStore(t)}).run(t, "-store", "memory://", "ls", "-json")
	if r.code != cli.ExitFailure || !strings.Contains(r.stderr, `the store listed a after b: not in key order`) {
		t.Fatalf("ls over a store that lists out of key order: %v; want exit 1 saying so", r)
	}
}

// A listing longer than inbox.MaxListLimit takes several pages of the real
// memory store.
func TestLs_beyond_one_page(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	n := inbox.MaxListLimit + 100
	for i := range n {
		if err := st.MarkProcessed(ctxT(t), fmt.Sprintf("many:%05d", i)); err != nil {
			t.Fatal(err)
		}
	}
	rec := &recorder{Store: st}
	e := onStore(rec)
	got := keysOf(jsonLines[record](t, e.ok(t, "ls", "-json", "-limit", "5000").stdout))
	if len(got) != n || !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != n {
		t.Fatalf("ls -limit 5000 of %d records printed %d, want each once in order", n, len(got))
	}
	if calls := rec.Calls(); len(calls) != 2 || calls[0].Limit != inbox.MaxListLimit || calls[1].Cursor == "" {
		t.Fatalf("List calls %+v, want a full page of %d then the rest from its cursor", calls, inbox.MaxListLimit)
	}
	r := e.run(t, "-store", "memory://", "ls", "-json", "-limit", "1050")
	if got := jsonLines[record](t, r.stdout); r.code != 0 || len(got) != 1050 || !strings.Contains(r.stderr, "stopped at -limit 1050") {
		t.Fatalf("ls -limit 1050 of %d records: printed %d, exit %d, stderr %q", n, len(got), r.code, r.stderr)
	}
}

// change is what release and forget print with -json.
type change struct {
	Key    string  `json:"key"`
	Before record  `json:"before"`
	After  *record `json:"after"`
	DryRun bool    `json:"dryRun"`
}

func TestRelease(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	populate(t, st)
	e := onStore(shared{st})

	// A live lease: refused without -force, dry runs change nothing.
	for _, args := range [][]string{{"release", kInProgress}, {"release", "-dry-run", kInProgress}, {"-json", "release", kInProgress}} {
		e.fails(t, cli.ExitRefused, append([]string{"-store", "memory://"}, args...),
			"release "+kInProgress+" on memory://: refused: its lease is live (InProgress, attempts 1, lease until ", `owner "host-3"`, "pass -force to release it anyway")
	}
	if out := e.ok(t, "release", "-force", "-dry-run", kInProgress).stdout; !strings.HasPrefix(out, "would release "+kInProgress+" (dry run: nothing changed)\n  is:  InProgress, attempts 1, lease until ") {
		t.Fatalf("release -force -dry-run printed:\n%s", out)
	}
	cs := jsonLines[change](t, e.ok(t, "release", "-force", "-dry-run", "-json", kInProgress).stdout)
	if len(cs) != 1 || !cs[0].DryRun || cs[0].Before.Status != "InProgress" || cs[0].After != nil {
		t.Fatalf("release -force -dry-run -json = %+v, want dryRun and the record before, no after", cs)
	}
	if r := get(t, st, kInProgress); r.State != inbox.StateInProgress {
		t.Fatalf("after the refused and dry-run releases: %+v, want the lease still live", r)
	}

	out := e.ok(t, "release", "-force", kInProgress).stdout
	if !strings.HasPrefix(out, "released "+kInProgress+"\n  was: InProgress, attempts 1, lease until ") ||
		!strings.Contains(out, "\n  now: Available, attempts 1, owner \"host-3\"") {
		t.Fatalf("release of a live lease printed:\n%s", out)
	}
	if r := get(t, st, kInProgress); r.State != inbox.StateAvailable || r.Attempts != 1 {
		t.Fatalf("after release: %+v, want Available with its attempt kept", r)
	}
	if c := begin(t, st, kInProgress, inbox.BeginOptions{}); c.Attempts != 2 {
		t.Fatalf("claim after release: attempts %d, want 2", c.Attempts)
	}

	// A backoff needs no -force.
	if out := e.ok(t, "release", "-dry-run", kBackoff).stdout; !strings.HasPrefix(out, "would release "+kBackoff+" (dry run: nothing changed)") {
		t.Fatalf("release -dry-run of a backoff printed:\n%s", out)
	}
	if r := get(t, st, kBackoff); r.RetryAt.IsZero() {
		t.Fatalf("release -dry-run ended the backoff: %+v", r)
	}
	cs = jsonLines[change](t, e.ok(t, "release", "-json", kBackoff).stdout)
	if len(cs) != 1 || cs[0].Key != kBackoff || cs[0].Before.Status != "Available" || cs[0].Before.RetryAt == nil || cs[0].DryRun ||
		cs[0].After == nil || cs[0].After.Status != "Available" || cs[0].After.RetryAt != nil {
		t.Fatalf("release -json of a backoff = %+v, want before with retryAt, after without", cs)
	}
	begin(t, st, kBackoff, inbox.BeginOptions{}) // acquirable at once

	for _, k := range []string{kProcessed, kDead, kAvailable} {
		before := get(t, st, k)
		out := e.ok(t, "release", k).stdout
		if !strings.HasPrefix(out, "nothing to release: "+k+" is "+before.State.String()+" without a lease or backoff") {
			t.Errorf("release of a %v key printed %q", before.State, out)
		}
		if after := get(t, st, k); after.State != before.State {
			t.Errorf("release changed %v key %s to %v", before.State, k, after.State)
		}
	}
	if out := e.ok(t, "release", "p:never-seen").stdout; out != "nothing to release: p:never-seen not found\n" {
		t.Fatalf("release of an unknown key printed %q", out)
	}
	cs = jsonLines[change](t, e.ok(t, "release", "p:never-seen", "-json").stdout)
	if len(cs) != 1 || cs[0].Before.Status != "NotFound" || cs[0].After == nil || cs[0].After.Status != "NotFound" {
		t.Fatalf("release -json of an unknown key = %+v", cs)
	}
}

func TestForget(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	populate(t, st)
	e := onStore(shared{st})

	if out := e.ok(t, "forget", "-dry-run", kDead).stdout; !strings.HasPrefix(out, "would forget "+kDead+": its next delivery would run the handler (dry run: nothing changed)\n  is:  Dead, attempts 1") {
		t.Fatalf("forget -dry-run printed:\n%s", out)
	}
	if r := get(t, st, kDead); r.State != inbox.StateDead {
		t.Fatalf("after forget -dry-run: %+v, want the key still dead", r)
	}
	out := e.ok(t, "forget", kDead).stdout
	if !strings.HasPrefix(out, "forgot "+kDead+": its next delivery runs the handler\n  was: Dead, attempts 1, owner \"host-4\", reason \"poison: xxx") ||
		strings.Contains(out, "note:") {
		t.Fatalf("forget of a dead key printed:\n%s", out)
	}
	if r := get(t, st, kDead); r.State != inbox.StateNotFound {
		t.Fatalf("after forget: %+v, want NotFound", r)
	}
	if c := begin(t, st, kDead, inbox.BeginOptions{}); c.Attempts != 1 {
		t.Fatalf("claim after forget: attempts %d, want 1 (a new record)", c.Attempts)
	}

	cs := jsonLines[change](t, e.ok(t, "-json", "forget", kProcessed).stdout)
	if len(cs) != 1 || cs[0].Key != kProcessed || cs[0].Before.Status != "Processed" || cs[0].Before.FirstSeen == nil ||
		cs[0].After == nil || cs[0].After.Status != "NotFound" || cs[0].After.FirstSeen != nil {
		t.Fatalf("forget -json = %+v, want before Processed and after NotFound", cs)
	}

	e.fails(t, cli.ExitRefused, []string{"-store", "memory://", "forget", kInProgress},
		"forget "+kInProgress+" on memory://: refused: its lease is live", "pass -force to forget it anyway")
	if r := get(t, st, kInProgress); r.State != inbox.StateInProgress {
		t.Fatalf("after the refused forget: %+v, want the lease still live", r)
	}
	out = e.ok(t, "forget", "-force", kInProgress).stdout
	if !strings.Contains(out, "\n  note: its lease was live") {
		t.Fatalf("forget of a live lease must warn; printed:\n%s", out)
	}
	if out := e.ok(t, "forget", "p:never-seen").stdout; out != "nothing to forget: p:never-seen not found\n" {
		t.Fatalf("forget of an unknown key printed %q", out)
	}
}

// Flags stand before or after the command and after its KEY; "--" ends
// them; -store defaults to INBOX_STORE_URL.
func TestFlags_anywhere(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	populate(t, st)
	var urls []string
	var mu sync.Mutex
	e := env{open: func(_ context.Context, raw string) (stores.Store, error) {
		mu.Lock()
		urls = append(urls, raw)
		mu.Unlock()
		return shared{st}, nil
	}}
	for _, args := range [][]string{
		{"-store", "memory://1", "-json", "get", kDead},
		{"get", "-store", "memory://1", "-json", kDead},
		{"get", kDead, "-json", "-store", "memory://1"},
		{"-json", "get", "-store=memory://1", "--", kDead},
	} {
		r := e.run(t, args...)
		if rs := jsonLines[record](t, r.stdout); r.code != 0 || len(rs) != 1 || rs[0].Key != kDead {
			t.Errorf("inboxctl %q: %v", args, r)
		}
	}
	begin(t, st, "-dash", inbox.BeginOptions{})
	if r := e.run(t, "-store", "memory://1", "get", "--", "-dash"); r.code != 0 || !strings.Contains(r.stdout, "state         InProgress") {
		t.Errorf("get -- -dash: %v", r)
	}
	e.getenv = map[string]string{"INBOX_STORE_URL": "memory://from-env"}
	if r := e.run(t, "get", kDead); r.code != 0 {
		t.Errorf("get with INBOX_STORE_URL: %v", r)
	}
	if r := e.run(t, "get", kDead, "-store", "memory://flag"); r.code != 0 {
		t.Errorf("get with INBOX_STORE_URL and -store: %v", r)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"memory://1", "memory://1", "memory://1", "memory://1", "memory://1", "memory://from-env", "memory://flag"}; !slices.Equal(urls, want) {
		t.Fatalf("opened %q, want %q", urls, want)
	}
}

func TestUsage_errors(t *testing.T) {
	t.Parallel()
	opened := false
	e := env{open: func(context.Context, string) (stores.Store, error) {
		opened = true
		return nil, errors.New("must not open")
	}}
	s := []string{"-store", "memory://"}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"ls"}, []string{"no store given", "-store URL", "INBOX_STORE_URL"}},
		{[]string{"get", "k"}, []string{"no store given"}},
		{[]string{}, []string{"no command given", "get, ls, release, forget, order, order-release, cleanup, migrate, help"}},
		{[]string{"-store", "memory://"}, []string{"no command given"}},
		{append(s, "frobnicate"), []string{`unknown command "frobnicate"`, "get, ls, release, forget, order, order-release, cleanup, migrate"}},
		{append(s, "-bogus", "ls"), []string{"-bogus"}},
		{append(s, "ls", "-bogus"), []string{"ls:", "-bogus", "inboxctl ls -h"}},
		{append(s, "ls", "-state", "stuck"), []string{`invalid value "stuck" for flag -state`, "available, in-progress, processed or dead"}},
		{append(s, "ls", "-older-than", "7x"), []string{`invalid value "7x" for flag -older-than`, "not a duration like 30s, 168h, 7d or 1d12h"}},
		{append(s, "ls", "-older-than", "-5m"), []string{`"-5m"`, "-older-than", "must be positive"}},
		{append(s, "ls", "-older-than", "0"), []string{"-older-than", "must be positive"}},
		{append(s, "ls", "-limit", "0"), []string{"-limit 0 must be at least 1"}},
		{append(s, "ls", "-stuck", "10m", "-state", "dead"), []string{"ls: -stuck 10m0s means -state in-progress -older-than 10m0s", "nor a -state other than in-progress"}},
		{append(s, "ls", "-stuck", "10m", "-older-than", "1h"), []string{"-stuck 10m0s means", "no -older-than"}},
		{append(s, "ls", "-stuck", "0"), []string{"-stuck", "must be positive"}},
		{append(s, "ls", "-limit", "many"), []string{"-limit"}},
		{append(s, "ls", "extra"), []string{`unexpected argument(s) ["extra"]`}},
		{append(s, "get"), []string{"get: want one KEY, got 0 arguments"}},
		{append(s, "release", "a", "b"), []string{"release: want one KEY, got 2 arguments"}},
		{append(s, "forget", ""), []string{"forget:", "key is empty"}},
		{append(s, "get", "-h2"), []string{"-h2"}},
		{[]string{"help", "frobnicate"}, []string{`help: unknown command "frobnicate"`}},
		{append(s, "migrate", "-prnt"), []string{"-prnt"}},
	} {
		e.fails(t, cli.ExitUsage, c.args, c.want...)
	}
	if opened {
		t.Fatal("a usage error opened the store")
	}
}

// failing is a store whose every call fails, as one whose server went away.
type failing struct{ *memory.Store }

func (failing) Close() error { return nil }

var errDown = fmt.Errorf("%w: redis store: dial tcp 127.0.0.1:6379: connection refused", inbox.ErrStoreUnavailable)

func (failing) Get(context.Context, string) (inbox.Record, error) { return inbox.Record{}, errDown }
func (failing) List(context.Context, inbox.ListOptions) (inbox.ListPage, error) {
	return inbox.ListPage{}, errDown
}

func TestStore_errors(t *testing.T) {
	t.Parallel()
	secret := "redis://ops:s3cr3t@10.0.0.1:6379/0?token=t0k3n"
	e := env{open: func(context.Context, string) (stores.Store, error) {
		return nil, fmt.Errorf("%w: redis store: cannot reach 10.0.0.1:6379\nline two", inbox.ErrStoreUnavailable)
	}}
	for _, cmd := range [][]string{{"get", "k"}, {"ls"}, {"release", "k"}, {"forget", "k"}} {
		r := e.fails(t, cli.ExitFailure, append([]string{"-store", secret}, cmd...), "cannot open store redis://ops:xxxxx@10.0.0.1:6379/0?token=xxxxx", "cannot reach", "; line two")
		if strings.Contains(r.stderr, "s3cr3t") || strings.Contains(r.stderr, "t0k3n") {
			t.Fatalf("error quotes a secret: %q", r.stderr)
		}
	}
	e.fails(t, cli.ExitFailure, []string{"-store", "redis://ops:pa%zz@h/", "ls"}, "cannot open store (the -store URL, which does not parse)")

	down := onStore(failing{newStore(t)})
	down.fails(t, cli.ExitFailure, []string{"-store", secret, "get", "k"}, "get k on redis://ops:xxxxx@10.0.0.1:6379/0?token=xxxxx:", "connection refused")
	down.fails(t, cli.ExitFailure, []string{"-store", secret, "ls"}, "ls on redis://ops:xxxxx@", "connection refused")
	down.fails(t, cli.ExitFailure, []string{"-store", secret, "release", "k"}, "release k on", "reading the record", "connection refused")
	down.fails(t, cli.ExitFailure, []string{"-store", secret, "forget", "k"}, "forget k on", "connection refused")
}

func TestStore_without_Admin(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	populate(t, st)
	e := onStore(noAdmin{st})
	for _, cmd := range [][]string{{"ls"}, {"release", kInProgress}, {"forget", kDead}} {
		e.fails(t, cli.ExitFailure, append([]string{"-store", "thirdparty://x"}, cmd...),
			cmd[0]+": this store (thirdparty://x", "cannot list, forget or release keys: it does not implement inbox.Admin")
	}
	if r := get(t, st, kDead); r.State != inbox.StateDead {
		t.Fatalf("a refused forget changed the record: %+v", r)
	}
	e.ok(t, "get", kDead) // get needs no Admin
}

// Through stores.Open itself, with the memory driver registered.
func TestStores_Open(t *testing.T) {
	t.Parallel()
	e := env{open: stores.Open}
	if r := e.ok(t, "ls"); r.stdout != "no records match\n" {
		t.Fatalf("ls of a new memory store printed %q", r.stdout)
	}
	e.fails(t, cli.ExitFailure, []string{"-store", "memory://?bogus=1", "ls"}, "cannot open store memory://?bogus=1", "unknown parameter(s) bogus")
	r := e.fails(t, cli.ExitFailure, []string{"-store", "nosuch://u:s3cr3t@h/", "get", "k"}, "cannot open store nosuch://u:xxxxx@h/", `unknown URL scheme "nosuch"`)
	if strings.Contains(r.stderr, "s3cr3t") {
		t.Fatalf("error quotes the password: %q", r.stderr)
	}
}

// fakeMigrator stands for the SQL store's schema.
var fakeMigrator = &cli.Migrator{
	Dialects:     map[string]string{"postgres": "postgres", "postgresql": "postgres", "mysql": "mysql", "sqlite": "sqlite"},
	DefaultTable: "inbox",
	DDL: func(dialect, table string) (string, error) {
		if table == "bad name" {
			return "", fmt.Errorf("%w: sql store: table name %q is not an identifier", inbox.ErrInvalidArgument, table)
		}
		return fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (-- %s\n);\n", table, dialect), nil
	},
	MigrateParam: "migrate",
}

func TestMigrate_print(t *testing.T) {
	t.Parallel()
	e := env{migrator: fakeMigrator, open: func(context.Context, string) (stores.Store, error) {
		t.Error("migrate -print opened the store")
		return nil, errors.New("no")
	}}
	for url, want := range map[string]string{
		"postgres://u:pw@db:5432/app?table=orders_inbox": "CREATE TABLE IF NOT EXISTS orders_inbox (-- postgres\n);\n",
		"POSTGRESQL://db/app":                            "CREATE TABLE IF NOT EXISTS inbox (-- postgres\n);\n",
		"mysql://db:3306/app?table=x":                    "CREATE TABLE IF NOT EXISTS x (-- mysql\n);\n",
		"sqlite:///var/lib/app/inbox.db":                 "CREATE TABLE IF NOT EXISTS inbox (-- sqlite\n);\n",
		"sqlite::memory:?table=t":                        "CREATE TABLE IF NOT EXISTS t (-- sqlite\n);\n",
	} {
		if r := e.run(t, "migrate", "-print", "-store", url); r.code != 0 || r.stdout != want || r.stderr != "" {
			t.Errorf("migrate -print -store %s: %v; want stdout %q", url, r, want)
		}
	}
	r := e.run(t, "-json", "migrate", "-store", "mysql://db/app?table=x", "-print")
	var got struct{ Dialect, Table, DDL string }
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &got) != nil || got.Dialect != "mysql" || got.Table != "x" || !strings.HasPrefix(got.DDL, "CREATE TABLE") {
		t.Fatalf("migrate -print -json: %v", r)
	}

	for _, url := range []string{"redis://u:s3cr3t@127.0.0.1:6379/0", "memory://", "http://h:8080/?token=s3cr3t"} {
		r := e.fails(t, cli.ExitUsage, []string{"migrate", "-print", "-store", url}, "is not a SQL store URL (mysql://, postgres://, postgresql://, sqlite://)", "only SQL stores have a schema")
		if strings.Contains(r.stderr, "s3cr3t") {
			t.Fatalf("error quotes a secret: %q", r.stderr)
		}
	}
	e.fails(t, cli.ExitUsage, []string{"migrate", "-print", "-store", "postgres://db/app?table=a&table=b"}, "parameter table is given 2 times")
	e.fails(t, cli.ExitUsage, []string{"migrate", "-print", "-store", "postgres://db/app?table=bad+name"}, `table name "bad name" is not an identifier`)
	e.fails(t, cli.ExitUsage, []string{"migrate", "-print"}, "no store given")
	e.migrator = nil
	e.fails(t, cli.ExitFailure, []string{"migrate", "-print", "-store", "postgres://db/app"}, "this build of inboxctl has no SQL stores")
}

func TestMigrate_applies(t *testing.T) {
	t.Parallel()
	var opened []string
	e := env{migrator: fakeMigrator, open: func(_ context.Context, raw string) (stores.Store, error) {
		opened = append(opened, raw)
		return shared{newStore(t)}, nil
	}}
	r := e.run(t, "migrate", "-store", "postgres://admin:s3cr3t@db:5432/app?sslmode=disable&table=orders_inbox&migrate=false")
	want := "migrated postgres://admin:xxxxx@db:5432/app?migrate=false&sslmode=disable&table=orders_inbox: table orders_inbox and its index exist (created if they were missing, the columns of an earlier layout added; nothing else is altered)\n"
	if r.code != 0 || r.stdout != want || r.stderr != "" {
		t.Fatalf("migrate: %v\nwant stdout %q", r, want)
	}
	if len(opened) != 1 || opened[0] != "postgres://admin:s3cr3t@db:5432/app?migrate=true&sslmode=disable&table=orders_inbox" {
		t.Fatalf("migrate opened %q, want the URL with migrate=true", opened)
	}
	r = e.run(t, "migrate", "-json", "-store", "sqlite:///tmp/x.db")
	var got struct {
		Store, Dialect, Table string
		Migrated              bool
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &got) != nil || got != (struct {
		Store, Dialect, Table string
		Migrated              bool
	}{"sqlite:///tmp/x.db", "sqlite", "inbox", true}) {
		t.Fatalf("migrate -json: %v", r)
	}
	if opened[1] != "sqlite:///tmp/x.db?migrate=true" {
		t.Fatalf("migrate opened %q", opened[1])
	}

	e.open = func(context.Context, string) (stores.Store, error) {
		return nil, fmt.Errorf("%w: sql store (postgres): permission denied to create table", inbox.ErrStoreUnavailable)
	}
	r = e.fails(t, cli.ExitFailure, []string{"migrate", "-store", "postgres://admin:s3cr3t@db/app"}, "migrate postgres://admin:xxxxx@db/app: inbox: store unavailable: sql store (postgres): permission denied")
	if strings.Contains(r.stderr, "s3cr3t") {
		t.Fatalf("error quotes the password: %q", r.stderr)
	}
	e.fails(t, cli.ExitUsage, []string{"migrate", "-store", "redis://127.0.0.1:6379/0"}, "is not a SQL store URL")
}

var commandFlags = map[string][]string{
	"get":     {"-store", "-json"},
	"ls":      {"-store", "-json", "-state", "-prefix", "-older-than", "-limit"},
	"release": {"-store", "-json"},
	"forget":  {"-store", "-json"},
	"migrate": {"-store", "-json", "-print"},
	"order":   {"-store", "-json"},

	"order-release": {"-store", "-json", "-force", "-dry-run"},
}

func TestHelp(t *testing.T) {
	t.Parallel()
	e := env{open: func(context.Context, string) (stores.Store, error) {
		t.Error("help opened a store")
		return nil, errors.New("no")
	}}
	for _, args := range [][]string{{"-h"}, {"-help"}, {"--help"}, {"help"}, {"-store", "x", "-h", "ls"}} {
		r := e.run(t, args...)
		if r.code != 0 || r.stderr != "" {
			t.Fatalf("inboxctl %q: %v", args, r)
		}
		for c := range commandFlags {
			if !strings.Contains(r.stdout, "\n  "+c+" ") {
				t.Errorf("inboxctl %q does not document the command %s:\n%s", args, c, r.stdout)
			}
		}
		for _, w := range []string{"-store URL", "INBOX_STORE_URL", "-json", "Exit status", "help [COMMAND]",
			"inboxctl -store redis://127.0.0.1:6379/0 ls -state in-progress", "ls -state dead", "forget", "migrate -print"} {
			if !strings.Contains(r.stdout, w) {
				t.Errorf("inboxctl %q does not mention %q", args, w)
			}
		}
	}
	for c, flags := range commandFlags {
		for _, args := range [][]string{{"help", c}, {c, "-h"}, {"-store", "memory://", c, "-help"}} {
			r := e.run(t, args...)
			if r.code != 0 || r.stderr != "" || !strings.HasPrefix(r.stdout, "Usage: inboxctl [-store URL] [-json] "+c) {
				t.Fatalf("inboxctl %q: %v", args, r)
			}
			for _, f := range flags {
				if !strings.Contains(r.stdout, "\n  "+f) {
					t.Errorf("inboxctl %q does not document %s:\n%s", args, f, r.stdout)
				}
			}
			if !strings.Contains(r.stdout, "Examples:\n  inboxctl ") {
				t.Errorf("inboxctl %q has no example", args)
			}
		}
	}
}

// order keys of the order fixture: oDead's head is dead, oBackoff's waits
// out a backoff, two keys wait behind each; nothing waits on oNone.
const (
	oDead    = "p:order:A"
	oBackoff = "p:order:B"
	oNone    = "p:order:C"
)

var (
	deadHead, deadWaiting       = "p:o1", []string{"p:o2", "p:o3"}
	backoffHead, backoffWaiting = "p:o4", []string{"p:o5", "p:o6"}
)

// populateOrder gives the order keys of the fixture their gates.
func populateOrder(t *testing.T, st inbox.LeaseStore) {
	t.Helper()
	ctx := ctxT(t)
	for _, g := range []struct {
		orderKey, head string
		waiting        []string
		fail           inbox.FailOptions
	}{
		{oDead, deadHead, deadWaiting, inbox.FailOptions{Dead: true, Reason: "poison"}},
		{oBackoff, backoffHead, backoffWaiting, inbox.FailOptions{RetryAfter: time.Hour, Reason: "timeout"}},
	} {
		c := begin(t, st, g.head, inbox.BeginOptions{Owner: "host-5", OrderKey: g.orderKey})
		g.fail.OrderKey = g.orderKey
		if err := st.Fail(ctx, g.head, c.LeaseID, g.fail); err != nil {
			t.Fatal(err)
		}
		for _, k := range g.waiting {
			if c, err := st.TryBegin(ctx, k, inbox.BeginOptions{OrderKey: g.orderKey}); err != nil || c.Status != inbox.Behind {
				t.Fatalf("TryBegin(%q) = %+v, %v; want Behind", k, c, err)
			}
		}
	}
}

// gate is an order key's gate as -json prints it.
type gate struct {
	Head    *record  `json:"head"`
	Waiting []string `json:"waiting"`
}

// orderOut is the output of order -json.
type orderOut struct {
	OrderKey string `json:"orderKey"`
	gate
}

// orderChange is the output of order-release -json.
type orderChange struct {
	OrderKey string `json:"orderKey"`
	Before   gate   `json:"before"`
	After    *gate  `json:"after"`
	DryRun   bool   `json:"dryRun"`
}

func wantGate(t *testing.T, st inbox.OrderAdmin, orderKey, head string, waiting ...string) {
	t.Helper()
	g, err := st.Order(ctxT(t), orderKey)
	if err != nil || g.Head != head || !slices.Equal(g.Waiting, waiting) {
		t.Fatalf("Order(%q) = %+v, %v; want head %q, waiting %q", orderKey, g, err, head, waiting)
	}
}

func TestOrder_shows_the_gate(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	populateOrder(t, st)
	e := onStore(shared{st})

	out := e.ok(t, "order", oDead).stdout
	for _, w := range []string{
		"order key  " + oDead + "\n",
		"head       " + deadHead + "\n  is:      Dead, attempts 1, owner \"host-5\", reason \"poison\", last seen ",
		"waiting    2 keys, in their order:\n  " + deadWaiting[0] + "\n  " + deadWaiting[1] + "\n",
		"blocked: the head is dead; inboxctl order-release " + oDead + " lets the next key run\n",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("order of a dead head printed:\n%s\nwant it to hold %q", out, w)
		}
	}
	if out := e.ok(t, "order", oBackoff).stdout; !strings.Contains(out, "  is:      Available, attempts 1, retry at ") || strings.Contains(out, "blocked") {
		t.Errorf("order of a head in its backoff printed:\n%s", out)
	}
	if out := e.ok(t, "order", oNone).stdout; out != oNone+": nothing waits (no message of the order key waits behind another)\n" {
		t.Errorf("order of an order key without a gate printed %q", out)
	}

	got := jsonLines[orderOut](t, e.ok(t, "-json", "order", oDead).stdout)
	if len(got) != 1 || got[0].OrderKey != oDead || got[0].Head == nil || got[0].Head.Key != deadHead || got[0].Head.Status != "Dead" ||
		got[0].Head.Reason != "poison" || !slices.Equal(got[0].Waiting, deadWaiting) {
		t.Fatalf("order -json = %+v, want the dead head's record and the waiting keys", got)
	}
	got = jsonLines[orderOut](t, e.ok(t, "order", oNone, "-json").stdout)
	if len(got) != 1 || got[0].OrderKey != oNone || got[0].Head != nil || got[0].Waiting == nil || len(got[0].Waiting) != 0 {
		t.Fatalf("order -json of an order key without a gate = %+v, want no head and waiting []", got)
	}
	wantGate(t, st, oDead, deadHead, deadWaiting...) // order changes nothing
}

func TestOrderRelease(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	populateOrder(t, st)
	e := onStore(shared{st})

	// A dead head: dry runs change nothing, then the next key runs.
	out := e.ok(t, "order-release", "-dry-run", oDead).stdout
	if !strings.HasPrefix(out, "would release order key "+oDead+" past "+deadHead+" (dry run: nothing changed)\n  is:  head "+deadHead+" (Dead, attempts 1, ") ||
		!strings.HasSuffix(out, "), 2 waiting\n") {
		t.Fatalf("order-release -dry-run printed:\n%s", out)
	}
	cs := jsonLines[orderChange](t, e.ok(t, "order-release", "-dry-run", "-json", oDead).stdout)
	if len(cs) != 1 || !cs[0].DryRun || cs[0].OrderKey != oDead || cs[0].Before.Head == nil || cs[0].Before.Head.Key != deadHead || cs[0].After != nil {
		t.Fatalf("order-release -dry-run -json = %+v, want dryRun, the gate before, no after", cs)
	}
	wantGate(t, st, oDead, deadHead, deadWaiting...)
	out = e.ok(t, "order-release", oDead).stdout
	if want := "released order key " + oDead + " past " + deadHead + ": " + deadWaiting[0] + " runs next\n  was: head " + deadHead + " (Dead, attempts 1, "; !strings.HasPrefix(out, want) ||
		!strings.HasSuffix(out, "), 2 waiting\n  now: head "+deadWaiting[0]+" (no record), 1 waiting\n") {
		t.Fatalf("order-release printed:\n%s\nwant it to start with %q", out, want)
	}
	wantGate(t, st, oDead, deadWaiting[0], deadWaiting[1])
	if out := e.ok(t, "order", oDead).stdout; !strings.Contains(out, "\n  is:      no record (its message has not run since it waited") || strings.Contains(out, "blocked") {
		t.Fatalf("order of a head whose message has not come back printed:\n%s", out)
	}
	begin(t, st, deadWaiting[0], inbox.BeginOptions{OrderKey: oDead}) // its turn

	// A head that is not dead: refused without -force (its lease is live
	// now, or it waits out a backoff).
	for _, c := range []struct{ orderKey, head, is string }{{oDead, deadWaiting[0], "InProgress"}, {oBackoff, backoffHead, "Available"}} {
		for _, args := range [][]string{{"order-release", c.orderKey}, {"order-release", "-dry-run", c.orderKey}, {"-json", "order-release", c.orderKey}} {
			e.fails(t, cli.ExitRefused, append([]string{"-store", "memory://"}, args...),
				"order-release "+c.orderKey+" on memory://: refused: its head "+c.head+" is not dead ("+c.is+", attempts 1",
				"its message runs again: the order key goes on once it is processed; pass -force to let the order key go on without it")
		}
	}
	wantGate(t, st, oBackoff, backoffHead, backoffWaiting...)
	cs = jsonLines[orderChange](t, e.ok(t, "order-release", "-force", "-json", oBackoff).stdout)
	if len(cs) != 1 || cs[0].DryRun || cs[0].Before.Head == nil || cs[0].Before.Head.Key != backoffHead || cs[0].Before.Head.Status != "Available" ||
		!slices.Equal(cs[0].Before.Waiting, backoffWaiting) || cs[0].After == nil || cs[0].After.Head == nil ||
		cs[0].After.Head.Key != backoffWaiting[0] || !slices.Equal(cs[0].After.Waiting, backoffWaiting[1:]) {
		t.Fatalf("order-release -force -json = %+v, want the gate before and after", cs)
	}
	wantGate(t, st, oBackoff, backoffWaiting[0], backoffWaiting[1])

	// Nothing waits: done, nothing to do.
	if out := e.ok(t, "order-release", oNone).stdout; out != "nothing to release: nothing waits on order key "+oNone+"\n" {
		t.Fatalf("order-release of an order key without a gate printed %q", out)
	}
	cs = jsonLines[orderChange](t, e.ok(t, "order-release", oNone, "-json").stdout)
	if len(cs) != 1 || cs[0].Before.Head != nil || cs[0].After == nil || cs[0].After.Head != nil {
		t.Fatalf("order-release -json of an order key without a gate = %+v", cs)
	}
}

// movingHead is a store whose order key's head moves on between
// order-release's read and its release: ReleaseOrder fails with
// ErrLeaseLost.
type movingHead struct{ shared }

func (m movingHead) ReleaseOrder(ctx context.Context, orderKey, head string) error {
	if err := m.shared.ReleaseOrder(ctx, orderKey, head); err != nil {
		return err
	}
	return m.shared.ReleaseOrder(ctx, orderKey, head)
}

// notKept keeps no order, as the MySQL store.
type notKept struct{ shared }

func (notKept) KeepsOrder() bool { return false }

func TestOrder_errors(t *testing.T) {
	t.Parallel()
	st := newStore(t)
	populateOrder(t, st)
	for _, s := range []stores.Store{noAdmin{st}, notKept{shared{st}}} {
		e := onStore(s)
		for _, cmd := range [][]string{{"order", oDead}, {"order-release", oDead}, {"order-release", "-force", "-dry-run", oDead}} {
			e.fails(t, cli.ExitFailure, append([]string{"-store", "mysql://db/app"}, cmd...),
				cmd[0]+": this store (mysql://db/app, a ", "does not keep the order of order keys: inbox: not supported")
		}
	}
	wantGate(t, st, oDead, deadHead, deadWaiting...)

	e := onStore(movingHead{shared{st}})
	e.fails(t, cli.ExitFailure, []string{"-store", "memory://", "order-release", oDead},
		"order-release "+oDead+" on memory://: its head is no longer "+deadHead+" (it moved on meanwhile: run inboxctl order again)", "lease lost")

	down := onStore(failing{st})
	down.fails(t, cli.ExitFailure, []string{"-store", "memory://", "order", oDead}, "order "+oDead+" on memory://: reading the head's record", "connection refused")
	e = onStore(shared{st})
	e.fails(t, cli.ExitUsage, []string{"-store", "memory://", "order"}, "order: want one ORDERKEY, got 0 arguments")
	e.fails(t, cli.ExitUsage, []string{"-store", "memory://", "order-release", ""}, "order-release:", "key is empty")
}
