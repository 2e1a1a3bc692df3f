// Command inboxctl is the operators' command line of an inbox store: it shows
// a key's record, lists records by state, prefix and age, ends a stuck lease,
// forgets a key so that its message runs again (the replay path for dead
// keys), shows and releases an order key blocked by a dead message, and
// creates a SQL store's table. It works over any store URL that
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
//	              -stuck D (leases held at least D, heartbeat or not),
//	              -limit N (default 100; pages through the store until N are printed;
//	              on Redis each page scans the whole database: on a large one give
//	              the store URL a longer timeout, such as timeout=1m)
//	release KEY   end the key's backoff, or its live lease with -force, now, whoever holds it
//	forget KEY    delete the key's record (with -force if its lease is live): its next
//	              delivery runs the handler
//	              release and forget take -dry-run: print what would change, change nothing
//	order ORDERKEY
//	              the key an order key's messages wait behind (its head, with its record)
//	              and the keys waiting, in their order
//	order-release ORDERKEY
//	              let the order key's messages go on past its head: a dead head, or any
//	              with -force; -dry-run as release
//	cleanup       delete a SQL store's expired records now and count those left;
//	              -dry-run only counts them
//	migrate       create a SQL store's table and index; -print shows the DDL, connecting to nothing
//	help [CMD]    every command, or one command's flags, with examples
//
// Live leases, then the stuck ones among them (leases acquired 10 minutes
// ago or more and still held, however often their heartbeat extended them:
// a handler that hangs while the middleware's heartbeat keeps its lease
// alive), and ending one at once:
//
//	inboxctl -store redis://127.0.0.1:6379/0 ls -state in-progress
//	inboxctl -store redis://127.0.0.1:6379/0 ls -stuck 10m
//	inboxctl -store redis://127.0.0.1:6379/0 release -force 'rabbit:billing:charge:42'
//
// Without -force, release and forget refuse a key whose lease is live (exit
// status 3): its holder may still be running the handler, and the next
// delivery would run it too. -stuck D is -state in-progress -older-than D: a heartbeat (Extend) does
// not move a record's last seen, so an in-progress record's last seen is
// when its lease was acquired. A consumer that crashed leaves no stuck
// lease: its lease ends by itself once its length (30 s by default) has
// passed, and the record is then available.
//
// Dead keys (a handler that failed on the key's last attempt allowed,
// inboxmw.Config.MaxAttempts, or with a permanent error) are listed with the reason of their last failure; forgetting one lets the
// next delivery of its message run the handler again, attempts from 1:
//
//	inboxctl -store redis://127.0.0.1:6379/0 ls -state dead
//	inboxctl -store redis://127.0.0.1:6379/0 forget 'rabbit:billing:charge:42'
//
// forget prints the record it deleted (-dry-run: the record it would
// delete, deleting nothing). The message itself
// is the broker's: redeliver it (from the poison queue, say) after forgetting
// its key.
//
// With inboxmw.Config.OrderKey, a dead message blocks its order key: the
// later messages of the order key wait behind it (the middleware logs "its
// order key is blocked" with the order key, inbox_order_key, and counts
// outcome order_blocked) until an operator lets them go on, unless the
// consumers run with inboxmw.OrderOnDeadSkip. An order key is the store's:
// {bus}:{group}:{alias}:{the message's order key}. order shows what it
// waits on; order-release refuses a head that is not dead (exit status 3)
// unless given -force, as its message runs again:
//
//	inboxctl -store redis://127.0.0.1:6379/0 order 'rabbit:billing:charge:acct-9'
//	inboxctl -store redis://127.0.0.1:6379/0 order-release 'rabbit:billing:charge:acct-9'
//
// A store that keeps no order (MySQL, SQLite, MongoDB, Redis Cluster, the
// remote store of inboxd) fails order and order-release with exit status
// 1, saying so.
//
// For deployments whose applications may not run DDL, an operator creates
// the SQL store's table once, or prints the statements for the team's own
// migration tool (the dialect comes from the URL's scheme, the table from
// its table parameter, default inbox):
//
//	inboxctl migrate -store 'postgres://admin@db:5432/app?table=inbox'
//	inboxctl migrate -print -store 'postgres://db/app?table=inbox'
//
// A SQL store's janitor deletes expired records in the application (unless
// its URL says cleanup=off). When it falls behind (the alert
// InboxCleanupBehind), count the expired records, then delete them now, in
// the store's bounded batches; other stores delete theirs themselves, and
// cleanup says so:
//
//	inboxctl cleanup -dry-run -store 'postgres://admin@db:5432/app?table=inbox'
//	inboxctl cleanup -store 'postgres://admin@db:5432/app?table=inbox'
//
// # Output
//
// Text is for people: get prints one field a line, ls a table (keys and
// reasons holding control characters are quoted; reasons cut to 60
// characters), release and forget the record as it was and as it is (with
// -dry-run, as it is and what would be done). Times
// are RFC 3339 in UTC, on the store's clock.
//
// With -json, output is JSON objects, one a line: ls prints one per record
// (nothing when none matches; "jq -s" makes an array), in key order, as
// every store lists them (inbox.Admin.List), so -limit N keeps the first N
// keys; get prints one record; release and forget print
// {"key", "before", "after"} with the record before and after, or with
// -dry-run {"key", "before", "dryRun": true}. order prints {"orderKey",
// "head", "waiting"}: head is a record as get prints it (left out when
// nothing waits), waiting the keys behind it, in their order;
// order-release prints {"orderKey", "before", "after"} with the gate
// ({"head", "waiting"}) before and after, or with -dry-run {"orderKey",
// "before", "dryRun": true}. A record's
// fields are those of protocol v1's GET /v1/inbox/{key} answer, so that the
// same parser reads inboxd's and inboxctl's records: key, status (NotFound,
// Available, InProgress, Processed, Dead), attempts, firstSeen, lastSeen,
// leaseUntil, and this project's additions in the same camelCase: retryAt,
// owner, payloadHash, reason. Times are RFC 3339 in UTC. A field without a
// value is left out, as in the protocol; status and attempts are always
// there. migrate -print -json prints {"dialect", "table", "ddl"}; cleanup
// prints {"store", "supported", "deleted", "backlog"} ("dryRun": true and no
// deleted with -dry-run; "backlogAtLeast": true when the count stopped at
// its bound; "supported": false alone for a store that cleans up itself).
//
// # Exit status
//
//	0  done; a get, release or forget of a key the store does not know is done too:
//	   it prints "not found" (get -json: status NotFound), and so is an order or
//	   order-release of an order key nothing waits on
//	1  the store could not be opened, or a call on it failed (one line on stderr says which)
//	2  usage: unknown command or flag, a bad value (-state, -older-than, -limit, KEY),
//	   no store given, migrate of a URL that is not a SQL store's
//	3  release or forget refused: the key's lease is live and -force was not given;
//	   order-release refused: the order key's head is not dead and -force was not
//	   given (nothing changed; one line on stderr shows the lease or the head)
//
// A store that does not implement inbox.Admin (a third-party store opened by
// a driver of its own) can still get; ls, release and forget fail with exit
// status 1, saying that the store cannot list, forget or release.
package main
