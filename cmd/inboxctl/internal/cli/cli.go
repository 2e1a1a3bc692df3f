// Package cli is inboxctl's command line: the parsing of its arguments, its
// commands (get, ls, release, forget, order, order-release, cleanup,
// migrate) and their output, over a store
// opened by a function the caller gives. The program (cmd/inboxctl) gives
// stores.Open with every driver registered and the SQL store's schema; tests
// give a store of their own, so that several commands can run on one
// instance.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
)

// The exit statuses of [Run].
const (
	// ExitOK: the command did what it was asked, or found there was nothing
	// to do (get, release or forget of an unknown key).
	ExitOK = 0
	// ExitFailure: the store could not be opened, or a call on it failed.
	ExitFailure = 1
	// ExitUsage: a command, a flag or an argument is unknown, missing or
	// malformed; nothing was sent to a store.
	ExitUsage = 2
	// ExitRefused: release or forget of a key whose lease is live, or
	// order-release of an order key whose head is not dead, without
	// -force; nothing was changed.
	ExitRefused = 3
)

// StoreURLEnv names the variable that -store defaults to.
const StoreURLEnv = "INBOX_STORE_URL"

// Env is what [Run] works with.
type Env struct {
	// Stdout receives the output of the commands; Stderr errors and notes.
	// Required.
	Stdout, Stderr io.Writer

	// Getenv reads the environment (os.Getenv). Optional: nil reads nothing.
	Getenv func(string) string

	// Open opens a store by URL (stores.Open). Required. Run closes the
	// store when the command is done.
	Open func(ctx context.Context, rawURL string) (stores.Store, error)

	// Migrator gives the migrate command the SQL stores' schema. Optional:
	// without it, migrate fails saying this build has no SQL stores.
	Migrator *Migrator
}

// Migrator is what the migrate command needs of the SQL store (package
// stores/sql), given by the program so that this package does not import it.
type Migrator struct {
	// Dialects maps the URL schemes of the SQL stores (postgres, mysql, ...)
	// to the dialect DDL takes.
	Dialects map[string]string

	// DefaultTable is the table a SQL URL without a table parameter uses.
	DefaultTable string

	// DDL returns the statements that create the table and index of the
	// store for dialect and table.
	DDL func(dialect, table string) (string, error)

	// MigrateParam is the URL parameter that makes opening a SQL store
	// create its table ("migrate", set to true).
	MigrateParam string
}

// usageError is a mistake in the command line: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errHelp asks for help: its text was printed, exit status 0.
var errHelp = errors.New("help printed")

// Run runs the command line args (without the program's name) and returns
// the exit status: [ExitOK], [ExitFailure] or [ExitUsage]. Errors are one
// line on env.Stderr starting with "inboxctl:"; they never quote a password
// or token of the store URL.
func Run(ctx context.Context, args []string, env Env) int {
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	r := &runner{env: env, store: env.Getenv(StoreURLEnv)}
	err := r.run(ctx, args)
	var ue *usageError
	var re *refusedError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return ExitOK
	case errors.As(err, &ue):
		fmt.Fprintf(env.Stderr, "inboxctl: %s\n", oneLine(err.Error()))
		return ExitUsage
	case errors.As(err, &re):
		fmt.Fprintf(env.Stderr, "inboxctl: %s\n", oneLine(err.Error()))
		return ExitRefused
	default:
		fmt.Fprintf(env.Stderr, "inboxctl: %s\n", oneLine(err.Error()))
		return ExitFailure
	}
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

// runner holds one run's settings: the global flags, which every command's
// flag set binds too, so that they are accepted before and after the
// command's name.
type runner struct {
	env   Env
	store string
	json  bool
	// force and dryRun are release's, forget's and order-release's
	// -force and -dry-run.
	force, dryRun bool
}

func (r *runner) globalFlags(fs *flag.FlagSet) {
	fs.StringVar(&r.store, "store", r.store, "store `URL` (default $"+StoreURLEnv+")")
	fs.BoolVar(&r.json, "json", r.json, "machine-readable output: JSON objects, one a line")
}

func (r *runner) run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("inboxctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	r.globalFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(r.env.Stdout, mainHelp())
			return errHelp
		}
		return usagef("%v (run 'inboxctl -h' for usage)", err)
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return usagef("no command given; commands: %s (run 'inboxctl -h' for usage)", commandNames())
	}
	name, rest := rest[0], rest[1:]
	if name == "help" {
		return r.help(rest)
	}
	c := lookup(name)
	if c == nil {
		return usagef("unknown command %q; commands: %s (run 'inboxctl -h' for usage)", name, commandNames())
	}
	cfs := flag.NewFlagSet("inboxctl "+c.name, flag.ContinueOnError)
	cfs.SetOutput(io.Discard)
	r.globalFlags(cfs)
	run := c.setup(r, cfs)
	pos, err := parseInterspersed(cfs, rest)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(r.env.Stdout, commandHelp(c))
			return errHelp
		}
		return usagef("%s: %v (run 'inboxctl %s -h' for usage)", c.name, err, c.name)
	}
	if err := c.checkArgs(pos); err != nil {
		return err
	}
	if r.store == "" {
		return usagef("%s: no store given: pass -store URL or set %s (e.g. -store redis://127.0.0.1:6379/0)", c.name, StoreURLEnv)
	}
	return run(ctx, pos)
}

// parseInterspersed parses fs's flags wherever they stand among args and
// returns the other arguments; "--" ends the flags.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func (r *runner) help(args []string) error {
	switch len(args) {
	case 0:
		fmt.Fprint(r.env.Stdout, mainHelp())
		return errHelp
	case 1:
		if c := lookup(args[0]); c != nil {
			fmt.Fprint(r.env.Stdout, commandHelp(c))
			return errHelp
		}
		return usagef("help: unknown command %q; commands: %s", args[0], commandNames())
	}
	return usagef("help: want at most one command, got %q", args)
}

// command is one of inboxctl's commands.
type command struct {
	name, args, summary string
	// help is the description printed by 'inboxctl help <name>'.
	help string
	// examples are command lines, without "inboxctl ".
	examples []string
	// nargs is the number of positional arguments: when 1, a KEY or an
	// ORDERKEY (args names it), valid as a key.
	nargs int
	// setup defines the command's own flags on fs and returns the function
	// that runs the command with its positional arguments once fs is parsed.
	// Required.
	setup func(r *runner, fs *flag.FlagSet) func(ctx context.Context, args []string) error
}

func (c *command) checkArgs(args []string) error {
	switch {
	case c.nargs == 0 && len(args) > 0:
		return usagef("%s: unexpected argument(s) %q: it takes flags only (run 'inboxctl %s -h' for usage)", c.name, args, c.name)
	case c.nargs == 1 && len(args) != 1:
		return usagef("%s: want one %s, got %d arguments %q (run 'inboxctl %s -h' for usage)", c.name, c.args, len(args), args, c.name)
	case c.nargs == 1:
		if err := inbox.ValidateKey(args[0]); err != nil {
			return usagef("%s: %v", c.name, err)
		}
	}
	return nil
}

var commands []*command

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

func commandNames() string {
	names := make([]string, 0, len(commands)+1)
	for _, c := range commands {
		names = append(names, c.name)
	}
	return strings.Join(append(names, "help"), ", ")
}

// openStore opens the -store URL. label is the URL without secrets, for
// messages.
func (r *runner) openStore(ctx context.Context) (st stores.Store, label string, err error) {
	label = redact(r.store)
	st, err = r.env.Open(ctx, r.store)
	if err != nil {
		return nil, label, fmt.Errorf("cannot open store %s: %w", label, err)
	}
	return st, label, nil
}

// admin returns st's operators' side, or an error saying the store has none.
func admin(st stores.Store, label, what string) (inbox.Admin, error) {
	a, ok := st.(inbox.Admin)
	if !ok {
		return nil, fmt.Errorf("%s: this store (%s, a %T) cannot list, forget or release keys: it does not implement inbox.Admin", what, label, st)
	}
	return a, nil
}

// redact returns raw without its password or tokens; a URL that does not
// parse is not quoted at all, as it may hold them anywhere.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(the -store URL, which does not parse)"
	}
	return stores.Redact(u)
}

// mainHelp is the text of 'inboxctl -h'.
func mainHelp() string {
	var b strings.Builder
	b.WriteString(`inboxctl inspects and repairs an inbox store: any store URL that stores.Open
takes (redis://, postgres://, mysql://, sqlite://, mongodb://, http://, ...).

Usage:
  inboxctl [-store URL] [-json] <command> [flags] [args]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-22s %s\n", strings.TrimSpace(c.name+" "+c.args), c.summary)
	}
	fmt.Fprintf(&b, "  %-22s %s\n", "help [COMMAND]", "this help, or a command's flags and examples")
	b.WriteString(`
Flags, accepted before and after the command and its KEY ("--" ends them):
  -store URL   the store; default $INBOX_STORE_URL. Errors never quote its password or token.
  -json        machine-readable output (see below)

Output: text for people; with -json, JSON objects, one a line (ls prints one
per record, the other commands one in all). A record's fields are named as in
protocol v1's GET /v1/inbox/{key} answer (camelCase): key, status (NotFound,
Available, InProgress, Processed, Dead), attempts, firstSeen, lastSeen,
leaseUntil, retryAt, owner, payloadHash, reason; times are RFC 3339 in UTC;
a field without a value is left out (attempts and status are always there).

Exit status: 0 done (a get, release or forget of an unknown key included:
it says "not found"), 1 the store could not be opened or failed, 2 a usage
error (unknown command or flag, bad value, missing -store or KEY), 3 release
or forget refused: the key's lease is live and -force was not given (and
order-release: the order key's head is not dead).

Examples:
`)
	for _, c := range commands {
		for _, e := range c.examples {
			fmt.Fprintf(&b, "  inboxctl %s\n", e)
		}
	}
	b.WriteString("\nRun 'inboxctl help COMMAND' (or 'inboxctl COMMAND -h') for a command's flags.\n")
	return b.String()
}

// commandHelp is the text of 'inboxctl help <c>'.
func commandHelp(c *command) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: inboxctl [-store URL] [-json] %s [flags]", c.name)
	if c.args != "" {
		b.WriteString(" " + c.args)
	}
	b.WriteString("\n\n" + strings.ToUpper(c.summary[:1]) + c.summary[1:] + ".\n\n" + c.help + "\n\nFlags:\n")
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	r := &runner{}
	r.globalFlags(fs)
	c.setup(r, fs)
	fs.SetOutput(&b)
	fs.PrintDefaults()
	b.WriteString("\nExamples:\n")
	for _, e := range c.examples {
		fmt.Fprintf(&b, "  inboxctl %s\n", e)
	}
	return b.String()
}
