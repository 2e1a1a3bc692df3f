// Command inboxctl is the operators' command line of an inbox store: it shows
// a key's record, lists records by state, prefix and age, ends a stuck lease,
// forgets a key so that its message runs again (the replay path for dead
// keys), and creates a SQL store's table. It works over any store URL that
// package [github.com/watermill-inbox/inbox/stores] opens: redis://,
// postgres://, mysql://, sqlite://, mongodb://, http:// (a remote inbox
// service) and memory:// (a new, empty store: only useful in tests).
//
//	inboxctl [-store URL] [-json] <command> [flags] [args]
//
// -store defaults to $INBOX_STORE_URL; -store and -json are accepted before
// and after the command's name, and flags after its KEY ("--" ends them, for
// a key that starts with a dash). The store URL is opened as applications
// open it, parameters included (redis://...?prefix=app: lists the keys of
// that prefix); errors never quote its password or token.
//
// # Commands
//
//	get KEY       the key's record: state, attempts, first and last seen, lease until,
//	              retry at, owner, payload hash, reason
//	ls            records in key order: -state available|in-progress|processed|dead,
//	              -prefix P, -older-than D (last seen at least D ago: 30s, 10m, 7d, 1d12h),
//	              -limit N (default 100; pages through the store until N are printed)
//	release KEY   end the key's live lease or backoff now, whoever holds it
//	forget KEY    delete the key's record: its next delivery runs the handler
//	migrate       create a SQL store's table and index; -print shows the DDL, connecting to nothing
//	help [CMD]    every command, or one command's flags, with examples
//
// Live leases, then the stuck ones among them (leases that no claim or
// heartbeat, Extend, has touched for 10 minutes), and ending one at once:
//
//	inboxctl -store redis://127.0.0.1:6379/0 ls -state in-progress
//	inboxctl -store redis://127.0.0.1:6379/0 ls -state in-progress -older-than 10m
//	inboxctl -store redis://127.0.0.1:6379/0 release 'rabbit:billing:charge:42'
//
// Dead keys (a handler that failed MaxAttempts times; inboxmw.Config.MaxAttempts)
// are listed with the reason of their last failure; forgetting one lets the
// next delivery of its message run the handler again, attempts from 1:
//
//	inboxctl -store redis://127.0.0.1:6379/0 ls -state dead
//	inboxctl -store redis://127.0.0.1:6379/0 forget 'rabbit:billing:charge:42'
//
// forget asks nothing and prints the record it deleted. The message itself
// is the broker's: redeliver it (from the poison queue, say) after forgetting
// its key.
//
// For deployments whose applications may not run DDL, an operator creates
// the SQL store's table once, or prints the statements for the team's own
// migration tool (the dialect comes from the URL's scheme, the table from
// its table parameter, default inbox):
//
//	inboxctl migrate -store 'postgres://admin@db:5432/app?table=inbox'
//	inboxctl migrate -print -store 'postgres://db/app?table=inbox'
//
// # Output
//
// Text is for people: get prints one field a line, ls a table (keys and
// reasons holding control characters are quoted; reasons cut to 60
// characters), release and forget the record as it was and as it is. Times
// are RFC 3339 in UTC, on the store's clock.
//
// With -json, output is JSON objects, one a line: ls prints one per record
// (nothing when none matches; "jq -s" makes an array), in key order over all
// pages (a store that lists by scanning, such as Redis, orders each page
// only, so ls collects the records up to -limit first; there -limit keeps
// the first records found, not the first by key); get prints one
// record; release and forget print
// {"key", "before", "after"} with the record before and after. A record's
// fields are those of protocol v1's GET /v1/inbox/{key} answer, so that the
// same parser reads inboxd's and inboxctl's records: key, status (NotFound,
// Available, InProgress, Processed, Dead), attempts, firstSeen, lastSeen,
// leaseUntil, and this project's additions in the same camelCase: retryAt,
// owner, payloadHash, reason. Times are RFC 3339 in UTC. A field without a
// value is left out, as in the protocol; status and attempts are always
// there. migrate -print -json prints {"dialect", "table", "ddl"}.
//
// # Exit status
//
//	0  done; a get, release or forget of a key the store does not know is done too:
//	   it prints "not found" (get -json: status NotFound)
//	1  the store could not be opened, or a call on it failed (one line on stderr says which)
//	2  usage: unknown command or flag, a bad value (-state, -older-than, -limit, KEY),
//	   no store given, migrate of a URL that is not a SQL store's
//
// A store that does not implement inbox.Admin (a third-party store opened by
// a driver of its own) can still get; ls, release and forget fail with exit
// status 1, saying that the store cannot list, forget or release.
package main
