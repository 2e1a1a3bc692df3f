package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
)

func init() {
	commands = []*command{
		{
			name: "get", args: "KEY", nargs: 1,
			summary: "show what the store knows of one key",
			help: `Prints the key's record: state, attempts, first and last seen, lease until,
retry at (the end of a failed attempt's backoff), owner, payload hash and
reason (why the last attempt failed, or why the key is dead). A key the store
does not know, or whose record expired, prints "KEY: not found" and exits 0;
with -json its status is NotFound.`,
			examples: []string{"-store redis://127.0.0.1:6379/0 get 'rabbit:billing:charge:4f1e2a9c'"},
			setup: func(r *runner, _ *flag.FlagSet) func(context.Context, []string) error {
				return r.get
			},
		},
		{
			name:    "ls",
			summary: "list records by state, key prefix and age",
			help: `Lists the records that the flags select, in key order, paging through the
store until -limit records are printed or none is left. Stuck leases are
-stuck 10m: leases still held that were acquired 10 minutes ago or more,
however often their heartbeat extended them since (a handler that hangs
while its heartbeat runs; a crashed consumer's lease ends by itself once its
length has passed). -stuck D is -state in-progress -older-than D: a
heartbeat (Extend) does not move last seen, so an in-progress record's last
seen is when its lease was acquired. Dead keys are -state dead. When -limit
stops the listing before the end, a note on stderr says so. Text output is
a table (keys and reasons holding control characters are quoted, reasons
cut to 60 characters: get or -json show them whole); -json prints one
object a line.`,
			examples: []string{
				"-store redis://127.0.0.1:6379/0 ls -state in-progress",
				"-store redis://127.0.0.1:6379/0 ls -stuck 10m",
				"-store redis://127.0.0.1:6379/0 ls -state dead -prefix rabbit:billing: -json",
			},
			setup: func(r *runner, fs *flag.FlagSet) func(context.Context, []string) error {
				o := &lsOptions{limit: 100}
				fs.Var(&o.state, "state", "keep records in this `state`: available, in-progress, processed or dead (default every state)")
				fs.StringVar(&o.prefix, "prefix", "", "keep keys that start with this `prefix` (byte for byte)")
				fs.Var(&o.olderThan, "older-than", "keep records last seen at least this `age` ago on the store's clock: 30s, 10m, 36h, 7d, 1d12h\n"+
					"(an in-progress record's last seen is when its lease was acquired: heartbeats do not move it)")
				fs.Var(&o.stuck, "stuck", "keep the leases held for at least this `age`, heartbeat or not: -state in-progress -older-than age")
				fs.IntVar(&o.limit, "limit", o.limit, "print at most `n` records")
				return func(ctx context.Context, _ []string) error { return r.ls(ctx, o) }
			},
		},
		{
			name: "release", args: "KEY", nargs: 1,
			summary: "end a key's live lease (-force) or backoff now, whoever holds it",
			help: `For a stuck consumer: the key becomes available, so its next delivery
acquires it at once; the old holder's Complete, Release and Extend then fail
with ErrLeaseLost, and its attempts are kept. A live lease is ended only with
-force: its holder may still be running the handler, which another delivery
would then run too (exit status 3 without it; ls -stuck lists the leases held
for long). A backoff ends without -force. A processed or dead key, or one
without a lease or backoff, is left as it is (forget deletes a record).
Prints the record as it was and as it is; -dry-run prints what would change
and changes nothing (refusing what release would refuse).`,
			examples: []string{
				"-store redis://127.0.0.1:6379/0 release -force 'rabbit:billing:charge:4f1e2a9c'",
				"-store redis://127.0.0.1:6379/0 release -dry-run 'rabbit:billing:charge:4f1e2a9c'",
			},
			setup: func(r *runner, fs *flag.FlagSet) func(context.Context, []string) error {
				r.changeFlags(fs, "end a live lease, whose holder may still be running the handler")
				return r.release
			},
		},
		{
			name: "forget", args: "KEY", nargs: 1,
			summary: "delete a key's record, so that its next delivery runs the handler",
			help: `The replay path for dead keys: after forget, the next delivery of the message
runs the handler as if it were new (attempts start again at 1). It deletes
the record whatever its state, processed included, and prints the record it
deleted. A key whose lease is live is forgotten only with -force (exit status
3 without it): another delivery could then run the handler while the holder
still does (the holder's Complete then fails with ErrLeaseLost); wait for
it, or release it, instead. -dry-run prints what would be deleted and
deletes nothing (refusing what forget would refuse).`,
			examples: []string{
				"-store redis://127.0.0.1:6379/0 forget 'rabbit:billing:charge:4f1e2a9c'",
				"-store redis://127.0.0.1:6379/0 forget -dry-run 'rabbit:billing:charge:4f1e2a9c'",
			},
			setup: func(r *runner, fs *flag.FlagSet) func(context.Context, []string) error {
				r.changeFlags(fs, "forget a key whose lease is live, whose holder may still be running the handler")
				return r.forget
			},
		},
		{
			name: "order", args: "ORDERKEY", nargs: 1,
			summary: "show what an order key's messages wait on",
			help: `With inboxmw.Config.OrderKey, the messages of an order key that come after
a failed one wait behind it, and run once it is processed. Prints the key at
the head (the message the others wait behind) with its record, and the keys
waiting behind it, in their order. A dead head blocks the order key until
an operator lets it go on (order-release), unless the consumers run with
inboxmw.OrderOnDeadSkip. ORDERKEY is the store's order key, as the
middleware's logs show it (inbox_order_key): {bus}:{group}:{alias}:{the
message's order key}. An order key nothing waits on prints "nothing waits";
-json prints {"orderKey", "head", "waiting"}, head a record as get prints
it, left out when nothing waits.`,
			examples: []string{"-store redis://127.0.0.1:6379/0 order 'rabbit:billing:charge:acct-9'"},
			setup: func(r *runner, _ *flag.FlagSet) func(context.Context, []string) error {
				return r.order
			},
		},
		{
			name: "order-release", args: "ORDERKEY", nargs: 1,
			summary: "let an order key's messages go on past its dead head",
			help: `For an order key blocked by a dead message (the log says "its order key is
blocked", outcome order_blocked): the first key waiting behind the head runs
next, and the dead key stays dead (forget replays it, then out of its
order). A head that is not dead (its message will run again: it waits out a
backoff, or its lease is live) is let go only with -force (exit status 3
without it): its message then runs after the ones behind it. Prints the
gate as it was and as it is; -dry-run prints what would change and changes
nothing (refusing what order-release would refuse). -json prints
{"orderKey", "before", "after"}, each {"head", "waiting"} as order prints
them, or with -dry-run {"orderKey", "before", "dryRun": true}.`,
			examples: []string{
				"-store redis://127.0.0.1:6379/0 order-release -dry-run 'rabbit:billing:charge:acct-9'",
				"-store redis://127.0.0.1:6379/0 order-release 'rabbit:billing:charge:acct-9'",
			},
			setup: func(r *runner, fs *flag.FlagSet) func(context.Context, []string) error {
				r.changeFlags(fs, "let the order key go on past a head that is not dead, whose message will run again")
				return r.orderRelease
			},
		},
		{
			name:    "cleanup",
			summary: "delete a SQL store's expired records now (-dry-run: count them)",
			help: `Expired records are ignored by every read; deleting them reclaims their space.
A SQL store's janitor deletes them in the application by default (unless its
URL says cleanup=off); this command does it now, in the store's bounded
batches, and prints how many records it deleted and how many expired ones are
left (the backlog, counted up to 100000: "at least" beyond). -dry-run only
counts the backlog. Other stores delete expired records themselves (Redis,
memory, MongoDB's TTL index, inboxd's store): for them it says so and exits 0.`,
			examples: []string{
				"cleanup -dry-run -store 'postgres://admin@db:5432/app?table=inbox'",
				"cleanup -store 'postgres://admin@db:5432/app?table=inbox'",
			},
			setup: func(r *runner, fs *flag.FlagSet) func(context.Context, []string) error {
				dryRun := fs.Bool("dry-run", false, "count the expired records; delete nothing")
				return func(ctx context.Context, _ []string) error { return r.cleanup(ctx, *dryRun) }
			},
		},
		{
			name:    "migrate",
			summary: "create a SQL store's table and index (or -print their DDL)",
			help: `For deployments whose applications may not run DDL: run it once with a user
that may, then open the store without migrate=true. It connects to the -store
URL (postgres://, postgresql://, mysql://, sqlite://) and creates the table
(the URL's table parameter, default inbox) and its index when they do not
exist, and adds the columns a table of an earlier layout lacks; nothing else
of an existing table is altered. With -print it connects to nothing
and prints the statements for the URL's dialect and table, to apply with the
team's own migration tool. Other stores have no schema: their URLs are a
usage error.`,
			examples: []string{
				"migrate -store 'postgres://admin@db:5432/app?table=inbox'",
				"migrate -print -store 'mysql://db:3306/app?table=inbox'",
			},
			setup: func(r *runner, fs *flag.FlagSet) func(context.Context, []string) error {
				printDDL := fs.Bool("print", false, "print the DDL for the URL's dialect and table; connect to nothing")
				return func(ctx context.Context, _ []string) error { return r.migrate(ctx, *printDDL) }
			},
		},
	}
}

func (r *runner) get(ctx context.Context, args []string) error {
	key := args[0]
	st, label, err := r.openStore(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	rec, err := st.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("get %s on %s: %w", showKey(key), label, err)
	}
	if r.json {
		return r.writeJSON(keyedJSON{Key: key, recordJSON: toJSON(rec)})
	}
	if rec.State == inbox.StateNotFound {
		_, err := fmt.Fprintf(r.env.Stdout, "%s: not found (the store has no live record of it: never seen, expired, or forgotten)\n", showKey(key))
		return err
	}
	return writeRecord(r.env.Stdout, key, rec)
}

type lsOptions struct {
	state     stateFlag
	prefix    string
	olderThan durationFlag
	stuck     durationFlag
	limit     int
}

func (r *runner) ls(ctx context.Context, o *lsOptions) error {
	if o.limit < 1 {
		return usagef("ls: -limit %d must be at least 1", o.limit)
	}
	opts := inbox.ListOptions{State: o.state.State, Prefix: o.prefix, OlderThan: time.Duration(o.olderThan)}
	if o.stuck > 0 {
		if o.olderThan > 0 || (o.state.State != inbox.StateNotFound && o.state.State != inbox.StateInProgress) {
			return usagef("ls: -stuck %s means -state in-progress -older-than %s: it takes no -older-than, nor a -state other than in-progress", &o.stuck, &o.stuck)
		}
		opts.State, opts.OlderThan = inbox.StateInProgress, time.Duration(o.stuck)
	}
	if err := opts.Validate(); err != nil {
		return usagef("ls: %v", err)
	}
	st, label, err := r.openStore(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	a, err := admin(st, label, "ls")
	if err != nil {
		return err
	}
	var items []inbox.ListItem
	more := false
	for {
		left := o.limit - len(items)
		opts.Limit = min(left, inbox.MaxListLimit)
		p, err := a.List(ctx, opts)
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("%w (a page of ls reads the records it examines, and on Redis scans the whole database: on a large one, give the store URL a longer timeout, such as timeout=1m)", err)
			}
			return fmt.Errorf("ls on %s: %w", label, err)
		}
		for _, it := range p.Items {
			if n := len(items); n > 0 && it.Key <= items[n-1].Key {
				return fmt.Errorf("ls on %s: the store listed %s after %s: not in key order, as inbox.Admin.List must", label, showKey(it.Key), showKey(items[n-1].Key))
			}
			if len(items) == o.limit { // more than asked: keep what -limit allows
				more = true
				break
			}
			items = append(items, it)
		}
		if len(items) >= o.limit {
			more = more || p.Next != ""
			break
		}
		if p.Next == "" {
			break
		}
		if p.Next == opts.Cursor {
			return fmt.Errorf("ls on %s: the store returned the same cursor twice (%q); stopping", label, p.Next)
		}
		opts.Cursor = p.Next
	}
	if r.json {
		for _, it := range items {
			if err := r.writeJSON(keyedJSON{Key: it.Key, recordJSON: toJSON(it.Record)}); err != nil {
				return err
			}
		}
	} else if err := writeTable(r.env.Stdout, items); err != nil {
		return err
	}
	if more {
		fmt.Fprintf(r.env.Stderr, "inboxctl: stopped at -limit %d; more records may match (raise -limit, or narrow with -state, -prefix, -older-than)\n", o.limit)
	}
	return nil
}

// changeFlags defines release's and forget's -force (what it allows, for
// its usage line) and -dry-run.
func (r *runner) changeFlags(fs *flag.FlagSet, force string) {
	fs.BoolVar(&r.force, "force", false, force)
	fs.BoolVar(&r.dryRun, "dry-run", false, "print what would change, and change nothing")
}

// refusedError is a change refused because the key's lease is live and
// -force was not given: exit status ExitRefused.
type refusedError struct{ msg string }

func (e *refusedError) Error() string { return e.msg }

// change is what release and forget share: on the -store store it reads
// key's record, calls act when needed says the record calls for it, and
// reads the record again; with -json it prints both records, and the caller
// prints its text otherwise. A live lease is refused without -force, and
// with -dry-run act is not called (after is then before). verb (the
// command's name) and done (its past participle) word the errors.
func (r *runner) change(ctx context.Context, key, verb, done string, needed func(inbox.Record) bool,
	act func(a inbox.Admin, ctx context.Context, key string) error,
) (before, after inbox.Record, err error) {
	st, label, err := r.openStore(ctx)
	if err != nil {
		return before, after, err
	}
	defer st.Close()
	a, err := admin(st, label, verb)
	if err != nil {
		return before, after, err
	}
	before, err = st.Get(ctx, key)
	if err != nil {
		return before, after, fmt.Errorf("%s %s on %s: reading the record: %w", verb, showKey(key), label, err)
	}
	after = before
	if needed(before) && before.State == inbox.StateInProgress && !r.force {
		return before, after, &refusedError{fmt.Sprintf("%s %s on %s: refused: its lease is live (%s): its holder may still be running the handler; pass -force to %s it anyway, or wait for the lease to end (ls -stuck lists leases held for long)",
			verb, showKey(key), label, summary(before), verb)}
	}
	if needed(before) && !r.dryRun {
		if err := act(a, ctx, key); err != nil {
			return before, after, fmt.Errorf("%s %s on %s: %w", verb, showKey(key), label, err)
		}
		if after, err = st.Get(ctx, key); err != nil {
			return before, after, fmt.Errorf("%s %s on %s: %s, but reading the record again failed: %w", verb, showKey(key), label, done, err)
		}
	}
	if r.json {
		c := changeJSON{Key: key, Before: toJSON(before), DryRun: r.dryRun}
		if !r.dryRun {
			c.After = ptr(toJSON(after))
		}
		return before, after, r.writeJSON(c)
	}
	return before, after, nil
}

func ptr[T any](v T) *T { return &v }

// held tells whether a record has a lease or a backoff for release to end.
func held(rec inbox.Record) bool { return rec.State == inbox.StateInProgress || !rec.RetryAt.IsZero() }

func (r *runner) release(ctx context.Context, args []string) error {
	key := args[0]
	before, after, err := r.change(ctx, key, "release", "released", held, inbox.Admin.ForceRelease)
	if err != nil || r.json {
		return err
	}
	w := r.env.Stdout
	switch {
	case before.State == inbox.StateNotFound:
		_, err = fmt.Fprintf(w, "nothing to release: %s not found\n", showKey(key))
	case !held(before):
		_, err = fmt.Fprintf(w, "nothing to release: %s is %s without a lease or backoff (release ends those; forget deletes a record)\n  is:  %s\n",
			showKey(key), before.State, summary(before))
	case r.dryRun:
		_, err = fmt.Fprintf(w, "would release %s (dry run: nothing changed)\n  is:  %s\n", showKey(key), summary(before))
	default:
		_, err = fmt.Fprintf(w, "released %s\n  was: %s\n  now: %s\n", showKey(key), summary(before), summary(after))
	}
	return err
}

func (r *runner) forget(ctx context.Context, args []string) error {
	key := args[0]
	known := func(rec inbox.Record) bool { return rec.State != inbox.StateNotFound }
	before, after, err := r.change(ctx, key, "forget", "forgotten", known, inbox.Admin.Forget)
	if err != nil || r.json {
		return err
	}
	w := r.env.Stdout
	if before.State == inbox.StateNotFound {
		_, err = fmt.Fprintf(w, "nothing to forget: %s not found\n", showKey(key))
		return err
	}
	if r.dryRun {
		_, err = fmt.Fprintf(w, "would forget %s: its next delivery would run the handler (dry run: nothing changed)\n  is:  %s\n", showKey(key), summary(before))
		return err
	}
	fmt.Fprintf(w, "forgot %s: its next delivery runs the handler\n  was: %s\n", showKey(key), summary(before))
	if before.State == inbox.StateInProgress { // -force
		fmt.Fprintf(w, "  note: its lease was live: the holder's Complete will fail with ErrLeaseLost, and another delivery may run the handler meanwhile\n")
	}
	if after.State != inbox.StateNotFound {
		fmt.Fprintf(w, "  now: %s (a delivery claimed it again since)\n", summary(after))
	}
	return nil
}

// orderAdmin returns st's order side, or an error wrapping
// inbox.ErrNotSupported saying that the store keeps no order.
func orderAdmin(st stores.Store, label, what string) (inbox.OrderAdmin, error) {
	o, ok := st.(inbox.OrderAdmin)
	if !ok || !o.KeepsOrder() {
		return nil, fmt.Errorf("%s: this store (%s, a %T) does not keep the order of order keys: %w", what, label, st, inbox.ErrNotSupported)
	}
	return o, nil
}

// orderGate is an order key's gate with its head's record.
type orderGate struct {
	inbox.OrderGate
	head inbox.Record // StateNotFound when Head is ""
}

// readGate reads orderKey's gate and its head's record.
func readGate(ctx context.Context, st stores.Store, o inbox.OrderAdmin, orderKey string) (orderGate, error) {
	g, err := o.Order(ctx, orderKey)
	if err != nil {
		return orderGate{}, err
	}
	out := orderGate{OrderGate: g}
	if g.Head != "" {
		if out.head, err = st.Get(ctx, g.Head); err != nil {
			return out, fmt.Errorf("reading the head's record (%s): %w", showKey(g.Head), err)
		}
	}
	return out, nil
}

// openOrder opens the store and returns its order side; done closes it.
func (r *runner) openOrder(ctx context.Context, what string) (st stores.Store, o inbox.OrderAdmin, label string, err error) {
	st, label, err = r.openStore(ctx)
	if err != nil {
		return nil, nil, label, err
	}
	if o, err = orderAdmin(st, label, what); err != nil {
		st.Close()
		return nil, nil, label, err
	}
	return st, o, label, nil
}

func (r *runner) order(ctx context.Context, args []string) error {
	orderKey := args[0]
	st, o, label, err := r.openOrder(ctx, "order")
	if err != nil {
		return err
	}
	defer st.Close()
	g, err := readGate(ctx, st, o, orderKey)
	if err != nil {
		return fmt.Errorf("order %s on %s: %w", showKey(orderKey), label, err)
	}
	if r.json {
		return r.writeJSON(orderJSON{OrderKey: orderKey, gateJSON: g.toJSON()})
	}
	return writeGate(r.env.Stdout, orderKey, g)
}

func (r *runner) orderRelease(ctx context.Context, args []string) error {
	orderKey := args[0]
	st, o, label, err := r.openOrder(ctx, "order-release")
	if err != nil {
		return err
	}
	defer st.Close()
	fail := func(format string, args ...any) error {
		return fmt.Errorf("order-release %s on %s: "+format, append([]any{showKey(orderKey), label}, args...)...)
	}
	before, err := readGate(ctx, st, o, orderKey)
	if err != nil {
		return fail("%w", err)
	}
	after := before
	if before.Head != "" && before.head.State != inbox.StateDead && !r.force {
		return &refusedError{fmt.Sprintf("order-release %s on %s: refused: its head %s is not dead (%s): its message runs again: the order key goes on once it is processed; pass -force to let the order key go on without it",
			showKey(orderKey), label, showKey(before.Head), summary(before.head))}
	}
	if before.Head != "" && !r.dryRun {
		if err := o.ReleaseOrder(ctx, orderKey, before.Head); err != nil {
			if errors.Is(err, inbox.ErrLeaseLost) {
				return fail("its head is no longer %s (it moved on meanwhile: run inboxctl order again): %w", showKey(before.Head), err)
			}
			return fail("%w", err)
		}
		if after, err = readGate(ctx, st, o, orderKey); err != nil {
			return fail("released, but reading the order key again failed: %w", err)
		}
	}
	if r.json {
		c := orderChangeJSON{OrderKey: orderKey, Before: before.toJSON(), DryRun: r.dryRun}
		if !r.dryRun {
			c.After = ptr(after.toJSON())
		}
		return r.writeJSON(c)
	}
	w := r.env.Stdout
	switch {
	case before.Head == "":
		_, err = fmt.Fprintf(w, "nothing to release: nothing waits on order key %s\n", showKey(orderKey))
	case r.dryRun:
		_, err = fmt.Fprintf(w, "would release order key %s past %s (dry run: nothing changed)\n  is:  %s\n", showKey(orderKey), showKey(before.Head), gateSummary(before))
	default:
		next := "nothing waits now"
		if after.Head != "" {
			next = showKey(after.Head) + " runs next"
		}
		_, err = fmt.Fprintf(w, "released order key %s past %s: %s\n  was: %s\n  now: %s\n", showKey(orderKey), showKey(before.Head), next, gateSummary(before), gateSummary(after))
	}
	return err
}

// cleaner is a store that deletes its expired records on demand: the SQL
// store (package stores/sql).
type cleaner interface {
	Cleanup(ctx context.Context) (int64, error)
	Backlog(ctx context.Context) (int64, error)
}

// maxBacklog is the SQL store's bound on a backlog count
// (sqlstore.MaxBacklog), which this package does not import.
const maxBacklog = 100_000

func (r *runner) cleanup(ctx context.Context, dryRun bool) error {
	st, label, err := r.openStore(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	c, ok := st.(cleaner)
	if !ok {
		if r.json {
			return r.writeJSON(struct {
				Store     string `json:"store"`
				Supported bool   `json:"supported"`
			}{label, false})
		}
		_, err := fmt.Fprintf(r.env.Stdout, "%s deletes expired records itself (a %T): nothing to clean up\n", label, st)
		return err
	}
	var deleted int64
	if !dryRun {
		if deleted, err = c.Cleanup(ctx); err != nil {
			return fmt.Errorf("cleanup on %s: %w (%d expired records deleted before the failure)", label, err, deleted)
		}
	}
	backlog, err := c.Backlog(ctx)
	if err != nil {
		return fmt.Errorf("cleanup on %s: counting the expired records: %w", label, err)
	}
	if r.json {
		out := struct {
			Store     string `json:"store"`
			Supported bool   `json:"supported"`
			DryRun    bool   `json:"dryRun,omitempty"`
			Deleted   *int64 `json:"deleted,omitempty"`
			Backlog   int64  `json:"backlog"`
			AtLeast   bool   `json:"backlogAtLeast,omitempty"`
		}{Store: label, Supported: true, DryRun: dryRun, Backlog: backlog, AtLeast: backlog >= maxBacklog}
		if !dryRun {
			out.Deleted = &deleted
		}
		return r.writeJSON(out)
	}
	left := fmt.Sprintf("%d expired records", backlog)
	if backlog >= maxBacklog {
		left = "at least " + left
	}
	if dryRun {
		_, err = fmt.Fprintf(r.env.Stdout, "%s: %s to delete (dry run: nothing deleted)\n", label, left)
		return err
	}
	_, err = fmt.Fprintf(r.env.Stdout, "%s: %d expired records deleted; %s left (those that expired meanwhile)\n", label, deleted, left)
	return err
}

func (r *runner) migrate(ctx context.Context, printDDL bool) error {
	m := r.env.Migrator
	if m == nil {
		return fmt.Errorf("migrate: this build of inboxctl has no SQL stores")
	}
	u, err := url.Parse(r.store)
	if err != nil {
		return usagef("migrate: cannot parse the -store URL (details withheld: it may hold a password)")
	}
	sqlSchemes := make([]string, 0, len(m.Dialects))
	for s := range m.Dialects {
		sqlSchemes = append(sqlSchemes, s+"://")
	}
	slices.Sort(sqlSchemes)
	dialect, ok := m.Dialects[strings.ToLower(u.Scheme)]
	if !ok {
		return usagef("migrate: %s is not a SQL store URL (%s): only SQL stores have a schema to apply",
			stores.Redact(u), strings.Join(sqlSchemes, ", "))
	}
	q := u.Query()
	if vs := q["table"]; len(vs) > 1 {
		return usagef("migrate: parameter table is given %d times in %s", len(vs), stores.Redact(u))
	}
	table := q.Get("table")
	if table == "" {
		table = m.DefaultTable
	}
	if printDDL {
		ddl, err := m.DDL(dialect, table)
		if err != nil {
			return usagef("migrate: %v", err)
		}
		if r.json {
			return r.writeJSON(struct {
				Dialect string `json:"dialect"`
				Table   string `json:"table"`
				DDL     string `json:"ddl"`
			}{dialect, table, ddl})
		}
		_, err = fmt.Fprint(r.env.Stdout, ddl)
		return err
	}
	label := stores.Redact(u)
	q.Set(m.MigrateParam, "true")
	mu := *u
	mu.RawQuery = q.Encode()
	st, err := r.env.Open(ctx, mu.String())
	if err != nil {
		return fmt.Errorf("migrate %s: %w", label, err)
	}
	if err := st.Close(); err != nil {
		return fmt.Errorf("migrate %s: the table is created, but closing the store failed: %w", label, err)
	}
	if r.json {
		return r.writeJSON(struct {
			Store    string `json:"store"`
			Dialect  string `json:"dialect"`
			Table    string `json:"table"`
			Migrated bool   `json:"migrated"`
		}{label, dialect, table, true})
	}
	_, err = fmt.Fprintf(r.env.Stdout, "migrated %s: table %s and its index exist (created if they were missing, the columns of an earlier layout added; nothing else is altered)\n", label, table)
	return err
}

// stateFlag is -state: a record state by its command-line name.
type stateFlag struct{ inbox.State }

var stateFlagNames = []struct {
	name  string
	state inbox.State
}{
	{"available", inbox.StateAvailable},
	{"in-progress", inbox.StateInProgress},
	{"processed", inbox.StateProcessed},
	{"dead", inbox.StateDead},
}

func (f *stateFlag) String() string {
	for _, n := range stateFlagNames {
		if n.state == f.State {
			return n.name
		}
	}
	return ""
}

// Set takes the names above, case-insensitive, with or without the dash,
// and the protocol's names ("InProgress").
func (f *stateFlag) Set(s string) error {
	norm := func(s string) string { return strings.ToLower(strings.NewReplacer("-", "", "_", "").Replace(s)) }
	for _, n := range stateFlagNames {
		if norm(s) == norm(n.name) {
			f.State = n.state
			return nil
		}
	}
	return fmt.Errorf("want available, in-progress, processed or dead")
}

// durationFlag is -older-than: a positive duration that may start with days,
// read as the store URLs' durations are (stores.ParseDuration).
type durationFlag time.Duration

func (f *durationFlag) String() string {
	if *f == 0 {
		return ""
	}
	return time.Duration(*f).String()
}

// Set's errors follow the flag package's quote of s.
func (f *durationFlag) Set(s string) error {
	d, err := stores.ParseDuration(s)
	if err != nil {
		return err
	}
	if d <= 0 {
		return errors.New("must be positive")
	}
	*f = durationFlag(d)
	return nil
}
