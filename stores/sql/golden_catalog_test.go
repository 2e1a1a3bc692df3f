package sqlstore

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
)

// This file lists, per dialect, every statement the store sends for the
// default table: the golden files testdata/*.sql are rendered from it
// (golden_test.go), and a change to a statement shows in review as a diff of
// SQL. A statement built for a batch's number of rows appears for 1 and 3
// rows; PostgreSQL's wave statements, one per set of kinds of operations a
// wave holds, appear all 31.

// GoldenStatement is one statement of a golden file.
type GoldenStatement struct {
	// Name is unique in its file: what the diff of a failing test names.
	Name string
	// About says what the statement is and when the store sends it.
	About string
	// Params names its parameters in order (and what it returns, if any).
	Params string
	// SQL is its text, byte for byte as sent.
	SQL string
}

// GoldenFile is the content of testdata/Name.
type GoldenFile struct {
	Name       string // file name under testdata/
	Dialect    Dialect
	About      string // the file's preamble
	Statements []GoldenStatement
}

// GoldenFiles returns the golden files, one per dialect.
func GoldenFiles() []GoldenFile {
	return []GoldenFile{goldenPostgres(), goldenMySQL(), goldenSQLite()}
}

// goldenDriver is a driver of the default table, as New builds it, without
// a database.
func goldenDriver(d Dialect, returning bool) *sqlDriver {
	opts := Options{Dialect: d}
	opts.setDefaults()
	return &sqlDriver{opts: opts, q: buildQueries(d, opts.Table, returning), txq: buildTxQueries(d, opts.Table), returning: returning}
}

// The sizes at which statements built for a batch's number of rows appear.
var goldenSizes = []int{1, 3}

const (
	aboutSizes = `Statements built for a batch's number of rows appear for 1 and 3 rows ` +
		`(the name ends in -1 or -3); n rows repeat the row (or the placeholder) n times, separated by ", ".`
	aboutFile = `Every statement the SQL store (package sqlstore, and the transactional ` +
		`mode of package txinbox) sends to %s, for the default table "inbox": the text byte for byte, ` +
		`with a header per statement (-- name:, then what it is, when it is sent, its parameters). ` +
		`Durations are integer microseconds (µs); "retention" is Options.Retention.` + "\n\n" +
		`Regenerate with: go test ./stores/sql -run Golden -update (then review the diff: it is the change to the SQL).`
)

func goldenPostgres() GoldenFile {
	d := goldenDriver(Postgres, true)
	q := d.q
	f := GoldenFile{Name: "postgres.sql", Dialect: Postgres,
		About: fmt.Sprintf(aboutFile, "PostgreSQL") + "\n\n" +
			`Every statement reads the clock once, through a materialized clock_timestamp() ("n.now"). ` +
			`A batch of several calls is sent in waves (each key once per wave), each wave one statement ` +
			`whatever its mix of operations (wave-...: all 31 sets of kinds of operations appear).`}
	add := func(s GoldenStatement) { f.Statements = append(f.Statements, s) }
	addSchema(&f, d)
	add(GoldenStatement{Name: "migrate-lock",
		About:  `Migrate: the first statement of its transaction, which then runs create-table and create-index, and of a second one that runs add-column-reason on a table of the earlier layout, so that concurrent migrations wait for each other.`,
		Params: `$1 the lock: the FNV-64a hash of "watermill-inbox:inbox", as a bigint.`,
		SQL:    pgAdvisoryLock})
	add(GoldenStatement{Name: "claim",
		About:  `TryBegin alone in its batch (a batch of one call). An upsert whose CASE arms decide on the row, under its lock: expired (start afresh), free (acquire, attempts + 1), held by the caller's lease id (renew), else unchanged.`,
		Params: `$1 key, $2 lease id, $3 owner, $4 lease (µs), $5 payload hash, $6 lease + retention (µs). Returns one row: msg_key, state, lease, lease_until, payload_hash, last_seen, attempts, reason, now.`,
		SQL:    q.claimOne})
	add(GoldenStatement{Name: "complete",
		About:  `Complete alone in its batch: an UPDATE fenced by the lease id, which keeps of the lease only its fingerprint (the first 8 bytes of its SHA-256) and no owner, and leaves expires_at as the claim set it when that is within a 64th of the retention past now + retention (then no indexed column changes: a HOT update). Affects the key's row when the lease holds it (a repeated Complete of the same lease too, by the fingerprint); no row is ErrLeaseLost.`,
		Params: `$1 retention (µs), $2 key, $3 lease id (bytes).`,
		SQL:    q.complete})
	add(GoldenStatement{Name: "release",
		About:  `Release alone in its batch: an UPDATE fenced by the lease id of an open row; no row is ErrLeaseLost.`,
		Params: `$1 retention (µs), $2 key, $3 lease id.`,
		SQL:    q.release})
	add(GoldenStatement{Name: "fail",
		About:  `Fail alone in its batch: an UPDATE fenced by the lease id of an open row, which empties the lease and sets the backoff (a lease nobody holds) or the dead state; no row is ErrLeaseLost.`,
		Params: `$1 retention (µs), $2 key, $3 lease id, $4 reason, $5 new state (0, or 2 for Dead), $6 backoff (µs; 0 for none and for Dead).`,
		SQL:    q.failOne})
	add(GoldenStatement{Name: "mark",
		About:  `MarkProcessed alone in its batch: an upsert of the processed row.`,
		Params: `$1 key, $2 retention (µs).`,
		SQL:    q.markOne})
	for mask := 1; mask < len(q.pg); mask++ {
		about, params := pgWaveDoc(mask)
		add(GoldenStatement{Name: "wave-" + maskName(mask, "-"), About: about, Params: params, SQL: q.pg[mask]})
	}
	add(GoldenStatement{Name: "extend",
		About:  `Extend: an UPDATE fenced by the lease id of an open, unexpired row; no row is ErrLeaseLost.`,
		Params: `$1 key, $2 lease id, $3 lease (µs), $4 lease + retention (µs). Returns lease_until.`,
		SQL:    q.extend})
	add(GoldenStatement{Name: "order-lock",
		About:  `A TryBegin or Fail with an OrderKey (taken out of the batch's waves), Order and ReleaseOrder: the first statement of the op's own transaction, the advisory lock of its order key (the text of migrate-lock), so that the ops of one order key take turns. The transaction then runs order-get and order-records, order-put or order-delete when the gate changes, and claim or fail.`,
		Params: `$1 the lock: the FNV-64a hash of "watermill-inbox-order:inbox", a NUL byte and the order key, as a bigint.`,
		SQL:    pgAdvisoryLock})
	add(GoldenStatement{Name: "order-live",
		About:  `A batch with a TryBegin that carries an OrderKey, first: which of their order keys have a live gate. A TryBegin whose order key has none (and no Fail of the batch before it carries it) runs as a TryBegin without an order key, in the batch's waves; the others run in order-lock's transaction.`,
		Params: `$1 the order keys (a text array literal). Returns the order keys with a live gate.`,
		SQL:    q.order.live})
	add(GoldenStatement{Name: "order-get",
		About:  `In the transaction of order-lock: the order key's live gate.`,
		Params: `$1 order key. Returns head, the waiting keys as a JSON array.`,
		SQL:    q.order.get})
	add(GoldenStatement{Name: "order-records",
		About:  `In the transaction of order-lock, after order-get: the live records of the gate's keys and of the claim's key, to move the gate past the processed heads and answer Behind.`,
		Params: `$1 the keys (a text array literal). Returns per live record: msg_key, state, attempts, payload_hash, the backoff left (µs; 0 when none runs).`,
		SQL:    q.order.records})
	add(GoldenStatement{Name: "order-put",
		About:  `In the transaction of order-lock: writes the order key's gate when it changed (a key queued, the head passed, a Fail that heads it).`,
		Params: `$1 order key, $2 head, $3 the waiting keys (a text array literal), $4 retention + default lease (µs): the gate's life from now.`,
		SQL:    q.order.put})
	add(GoldenStatement{Name: "order-delete",
		About:  `In the transaction of order-lock: removes the order key's gate when its last key has passed.`,
		Params: `$1 order key.`,
		SQL:    q.order.del})
	add(GoldenStatement{Name: "order-cleanup",
		About:  `Cleanup and the janitor, after cleanup: deletes expired gates (their head never came back), at most a batch, skipping those locked; repeated while a statement deletes a whole batch. A missing gate table is not an error here.`,
		Params: `$1 the batch (Options.CleanupBatch).`,
		SQL:    q.order.cleanup})
	addCommon(&f, d)
	addTx(&f, d)
	return f
}

func goldenMySQL() GoldenFile {
	d, d8 := goldenDriver(MySQL, true), goldenDriver(MySQL, false)
	q, q8 := d.q, d8.q
	f := GoldenFile{Name: "mysql.sql", Dialect: MySQL,
		About: fmt.Sprintf(aboutFile, "MySQL 8 and MariaDB") + "\n\n" +
			`The store asks SELECT VERSION() which it is: MariaDB 10.5+ has INSERT ... RETURNING, MySQL 8 does not; ` +
			`the statements that differ appear twice, the MySQL 8 one with the suffix -mysql8. ` +
			`The clock is UTC_TIMESTAMP(6), fixed for one statement. ON DUPLICATE KEY UPDATE and single-table UPDATE ` +
			`assign left to right, each assignment seeing the ones before it: the order of assignments is part of the statement. ` +
			`A batch of several calls (or on MySQL 8 one TryBegin) is one transaction, in waves (each key once per wave); ` +
			`a wave sends, for the kinds it holds, in this order: claims-n (on MySQL 8 claims-n-mysql8 then claims-read-n-mysql8), ` +
			`settle-read-n over its completes, releases and fails, completes-n, releases-n and fails-n over the rows whose lease held them, marks-n.` +
			"\n\n" + aboutSizes}
	add := func(s GoldenStatement) { f.Statements = append(f.Statements, s) }
	add(GoldenStatement{Name: "version",
		About:  `New (or the first call of a store opened with check=false): tells MariaDB 10.5+ (RETURNING) from MySQL 8.`,
		Params: `None. Returns the version string.`,
		SQL:    versionQuery})
	addSchema(&f, d)
	rowParams := `per row: key, lease id, owner, lease (µs), payload hash, lease + retention (µs)`
	for _, n := range goldenSizes {
		about := `TryBegin: the upsert of n claims (rows in key order), on MariaDB. With one row it is also a TryBegin alone in its batch.`
		if n > 1 {
			about = `TryBegin: the upsert of the n claims of a wave (rows in key order), on MariaDB.`
		}
		add(GoldenStatement{Name: "claims-" + strconv.Itoa(n), About: about,
			Params: `6 ` + rowParams + `. Returns per row: msg_key, state, lease, lease_until, payload_hash, last_seen, attempts, reason, now.`,
			SQL:    q.claimsQuery(n)})
	}
	for _, n := range goldenSizes {
		add(GoldenStatement{Name: "claims-" + strconv.Itoa(n) + "-mysql8",
			About:  `TryBegin on MySQL 8: the upsert of a wave's n claims (one alone is a batch of its own), in the batch's transaction, followed by claims-read-n-mysql8.`,
			Params: `6 ` + rowParams + `.`,
			SQL:    q8.claimsQuery(n)})
		add(GoldenStatement{Name: "claims-read-" + strconv.Itoa(n) + "-mysql8",
			About:  `TryBegin on MySQL 8: the locking read of the rows claims-n-mysql8 wrote, in the same transaction: the claims' answers.`,
			Params: `n keys. Returns per row: msg_key, state, lease, lease_until, payload_hash, last_seen, attempts, reason, now.`,
			SQL:    q8.myClaimsRead(n)})
	}
	add(GoldenStatement{Name: "complete",
		About:  `Complete alone in its batch: an UPDATE fenced by the lease id, which keeps of the lease only its fingerprint (the first 8 bytes of its SHA-256) and no owner, and leaves expires_at as the claim set it when that is within a 64th of the retention past now + retention (then the index on it is not written). Affects the key's row when the lease holds it (with clientFoundRows, a repeated Complete of the same lease too, by the fingerprint); else complete-holder follows.`,
		Params: `1 retention (µs), 2 retention + a 64th (µs), 3 retention (µs), 4 key, 5 lease id, 6 its fingerprint.`,
		SQL:    q.complete})
	add(GoldenStatement{Name: "complete-holder",
		About:  `After a Complete alone in its batch that affected no row: whether this lease completed the key already (a repeated Complete, without clientFoundRows); otherwise it is ErrLeaseLost.`,
		Params: `1 key. Returns state, lease, expires_at, now.`,
		SQL:    q.holder})
	add(GoldenStatement{Name: "release",
		About:  `Release alone in its batch: an UPDATE fenced by the lease id of an open row; no row is ErrLeaseLost.`,
		Params: `1 retention (µs), 2 key, 3 lease id.`,
		SQL:    q.release})
	add(GoldenStatement{Name: "fail",
		About:  `Fail alone in its batch: an UPDATE fenced by the lease id of an open row, which empties the lease and sets the backoff (a lease nobody holds) or the dead state; no row is ErrLeaseLost.`,
		Params: `1 backoff (µs; 0 for none and for Dead), 2 reason, 3 new state (0, or 2 for Dead), 4 backoff + retention (µs), 5 key, 6 lease id.`,
		SQL:    q.failOne})
	for _, n := range goldenSizes {
		about := `MarkProcessed: the upsert of a wave's n marks (rows in key order).`
		if n == 1 {
			about = `MarkProcessed: the upsert of n marks; with one row it is also a MarkProcessed alone in its batch.`
		}
		add(GoldenStatement{Name: "marks-" + strconv.Itoa(n), About: about,
			Params: `per row: key, retention (µs).`,
			SQL:    q.marksQuery(n)})
	}
	for _, n := range goldenSizes {
		ns := strconv.Itoa(n)
		add(GoldenStatement{Name: "settle-read-" + ns,
			About:  `Complete, Release and Fail in a batch of several calls: the locking read of the rows of a wave's n completes, releases and fails (in that order, each kind's keys in byte order), in the batch's transaction; the store decides which leases hold their keys, with the conditions of complete, release and fail.`,
			Params: `n keys. Returns per row: msg_key, state, lease, expires_at, now.`,
			SQL:    q.mySettleRead(n)})
		add(GoldenStatement{Name: "completes-" + ns,
			About:  `Complete in a batch of several calls: after settle-read, the UPDATE of the n rows whose lease held them (expires_at as in complete).`,
			Params: `retention, retention + a 64th, retention (µs), then n keys.`,
			SQL:    q.mySettleUpdate(driver.Complete, n)})
		add(GoldenStatement{Name: "releases-" + ns,
			About:  `Release in a batch of several calls: after settle-read, the UPDATE of the n rows whose lease held them.`,
			Params: `retention (µs), then n keys.`,
			SQL:    q.mySettleUpdate(driver.Release, n)})
		add(GoldenStatement{Name: "fails-" + ns,
			About:  `Fail in a batch of several calls: after settle-read, the UPDATE of the n rows whose lease held them, joined with a derived table of their values (a multiple-table UPDATE: no assignment reads a column).`,
			Params: `per row: key, reason, new state (0, or 2 for Dead), backoff (µs), backoff + retention (µs).`,
			SQL:    q.myFailsQuery(n)})
	}
	add(GoldenStatement{Name: "extend",
		About:  `Extend: an UPDATE fenced by the lease id of an open, unexpired row, in a transaction with extend-read; no row is ErrLeaseLost.`,
		Params: `1 lease (µs), 2 lease + retention (µs), 3 key, 4 lease id.`,
		SQL:    q.extend})
	add(GoldenStatement{Name: "extend-read",
		About:  `Extend: after extend affected the row, in the same transaction: the new end of the lease.`,
		Params: `1 key. Returns lease_until.`,
		SQL:    q.selectLeaseUntil})
	addCommon(&f, d)
	addTx(&f, d)
	return f
}

func goldenSQLite() GoldenFile {
	d := goldenDriver(SQLite, true)
	q := d.q
	f := GoldenFile{Name: "sqlite.sql", Dialect: SQLite,
		About: fmt.Sprintf(aboutFile, "SQLite") + "\n\n" +
			`Times are integer microseconds since the Unix epoch; the clock is julianday('now'), fixed for one step. ` +
			`A batch of several calls is one (immediate) transaction (unless it is one statement), in waves (each key once per wave); a wave sends, ` +
			`for the kinds it holds, in this order: claims-n, completes-n, releases-n, marks-n, and fail once per Fail.` +
			"\n\n" + aboutSizes}
	add := func(s GoldenStatement) { f.Statements = append(f.Statements, s) }
	addSchema(&f, d)
	for _, n := range goldenSizes {
		about := `TryBegin: the upsert of a wave's n claims (rows in key order).`
		if n == 1 {
			about = `TryBegin: the upsert of n claims; with one row it is also a TryBegin alone in its batch. Its CASE arms decide on the row: expired (start afresh), free (acquire, attempts + 1), held by the caller's lease id (renew), else unchanged.`
		}
		add(GoldenStatement{Name: "claims-" + strconv.Itoa(n), About: about,
			Params: `per row: key, lease id, owner, lease (µs), payload hash, lease + retention (µs). Returns per row: msg_key, state, lease, lease_until, payload_hash, last_seen, attempts, reason, now.`,
			SQL:    q.claimsQuery(n)})
	}
	add(GoldenStatement{Name: "complete",
		About:  `Complete alone in its batch, and each Complete of a batch of several calls: an UPDATE fenced by the lease id, which keeps of the lease only its fingerprint (the first 8 bytes of its SHA-256, given: SQLite has no SHA-256) and no owner. Affects the key's row when the lease holds it (a repeated Complete of the same lease too, by the fingerprint); no row is ErrLeaseLost.`,
		Params: `?1 retention (µs), ?2 key, ?3 lease id, ?4 its fingerprint.`,
		SQL:    q.complete})
	add(GoldenStatement{Name: "release",
		About:  `Release alone in its batch: an UPDATE fenced by the lease id of an open row; no row is ErrLeaseLost.`,
		Params: `1 retention (µs), 2 key, 3 lease id.`,
		SQL:    q.release})
	add(GoldenStatement{Name: "fail",
		About:  `Fail, alone in its batch and once per Fail of a batch of several calls: an UPDATE fenced by the lease id of an open row, which empties the lease and sets the backoff (a lease nobody holds) or the dead state; no row is ErrLeaseLost.`,
		Params: `?1 retention (µs), ?2 key, ?3 lease id, ?4 reason, ?5 new state (0, or 2 for Dead), ?6 backoff (µs; 0 for none and for Dead).`,
		SQL:    q.failOne})
	for _, n := range goldenSizes {
		about := `MarkProcessed: the upsert of a wave's n marks (rows in key order).`
		if n == 1 {
			about = `MarkProcessed: the upsert of n marks; with one row it is also a MarkProcessed alone in its batch.`
		}
		add(GoldenStatement{Name: "marks-" + strconv.Itoa(n), About: about,
			Params: `per row: key, retention (µs).`,
			SQL:    q.marksQuery(n)})
	}
	for _, n := range goldenSizes {
		add(GoldenStatement{Name: "releases-" + strconv.Itoa(n),
			About:  `Release in a batch of several calls: the fenced UPDATE of a wave's n releases.`,
			Params: `retention (µs), the n keys, then each key and its lease id. Returns msg_key per row whose lease held it (the others are ErrLeaseLost).`,
			SQL:    q.liteReleasesQuery(n)})
	}
	add(GoldenStatement{Name: "extend",
		About:  `Extend: an UPDATE fenced by the lease id of an open, unexpired row; no row is ErrLeaseLost.`,
		Params: `?1 key, ?2 lease id, ?3 lease (µs), ?4 lease + retention (µs). Returns lease_until.`,
		SQL:    q.extend})
	addCommon(&f, d)
	addTx(&f, d)
	return f
}

// addSchema adds the statements of Migrate: the DDL (those of DDL, which
// returns them ending with ";", add-column-reason as a comment) and the
// probes of the table's layout.
func addSchema(f *GoldenFile, d *sqlDriver) {
	dl, t := d.opts.Dialect, d.q.t
	stmts := ddl(dl, d.opts.Table)
	names := []string{"create-table", "create-index", "create-order-table"}
	for i, s := range stmts {
		about := `Migrate (AutoMigrate, migrate=true, inboxctl migrate) and DDL: creates the table when it does not exist.`
		if dl == MySQL {
			about = `Migrate (AutoMigrate, migrate=true, inboxctl migrate) and DDL: creates the table and its index on expires_at when they do not exist.`
		}
		if i == 1 {
			about = `Migrate and DDL, after create-table: the index of Cleanup.`
		}
		if i == 2 {
			about = `Migrate and DDL, after create-index: the table of the gates of order keys (BeginOptions.OrderKey), inbox_order, a row per order key that has one: its head, the keys waiting behind it in their order, and when the gate expires.`
		}
		f.Statements = append(f.Statements, GoldenStatement{Name: names[i], About: about, Params: `None.`, SQL: s})
	}
	f.Statements = append(f.Statements,
		GoldenStatement{Name: "migrate-probe-reason",
			About:  `Migrate, after the DDL, and the check of stores.Open when reading the table fails for a missing column: reads no row, and fails when the column reason does not exist.`,
			Params: `None.`,
			SQL:    probeQuery(t, addedColumns[0].name)},
		GoldenStatement{Name: "migrate-probe-layout",
			About:  `Migrate and the check of stores.Open, when migrate-probe-reason or migrate-probe-lease failed: reads no row, and fails unless the table has the columns of an earlier layout (then add-column-reason and the upgrade-... statements upgrade it).`,
			Params: `None.`,
			SQL:    probeQuery(t, cols)},
		GoldenStatement{Name: "add-column-reason",
			About:  `Migrate, on a table of the earliest layout (made before Fail and dead keys), before the upgrade to the compact layout.`,
			Params: `None.`,
			SQL:    addColumn(dl, d.opts.Table, 0)},
		GoldenStatement{Name: "migrate-probe-lease",
			About:  `Migrate, after add-column-reason's step, and the check of stores.Open when reading the table fails for a missing column: reads no row, and fails when the column lease does not exist (a table of an earlier layout, which the upgrade-... statements copy to the compact layout).`,
			Params: `None.`,
			SQL:    probeQuery(t, compactProbe)},
	)
	about := map[Dialect]string{
		Postgres: `in the transaction of migrate-lock and upgrade-check, in this order`,
		MySQL:    `each a statement of its own, in this order`,
		SQLite:   `in one transaction, in this order (upgrade-fingerprint-read and -write after the third)`,
	}[dl]
	for i, s := range upgradeStmts(dl, d.opts.Table) {
		f.Statements = append(f.Statements, GoldenStatement{Name: "upgrade-" + strconv.Itoa(i+1),
			About:  `Migrate, on a table of an earlier layout: the upgrade to the compact one (create the table inbox_upgrade, copy the rows in their compact form, put it in the old one's place), ` + about + `.`,
			Params: `None.`,
			SQL:    s})
	}
	switch dl {
	case Postgres:
		f.Statements = append(f.Statements, GoldenStatement{Name: "upgrade-check",
			About:  `Migrate, after migrate-lock in the transaction of the upgrade: whether the table still has the earlier layout (a concurrent Migrate may have upgraded it).`,
			Params: `$1 the quoted table name.`,
			SQL:    pgHasLeaseID})
	case SQLite:
		f.Statements = append(f.Statements,
			GoldenStatement{Name: "upgrade-fingerprint-read",
				About:  `Migrate, in the upgrade's transaction after upgrade-3: the lease ids of the processed rows copied (SQLite has no SHA-256).`,
				Params: `None. Returns msg_key, lease.`,
				SQL:    liteFPRead(d.opts.Table)},
			GoldenStatement{Name: "upgrade-fingerprint-write",
				About:  `Migrate, after upgrade-fingerprint-read: a processed row keeps the fingerprint of its lease id.`,
				Params: `?1 the fingerprint, ?2 key.`,
				SQL:    liteFPWrite(d.opts.Table)})
	}
}

// addCommon adds the statements whose role is the same on every dialect:
// Get, List, Forget, ForceRelease and Cleanup.
func addCommon(f *GoldenFile, d *sqlDriver) {
	dl, q := d.opts.Dialect, d.q
	p := func(i int) string {
		switch dl {
		case Postgres:
			return "$" + strconv.Itoa(i)
		case SQLite:
			return "?" + strconv.Itoa(i)
		}
		return strconv.Itoa(i)
	}
	add := func(s GoldenStatement) { f.Statements = append(f.Statements, s) }
	add(GoldenStatement{Name: "get",
		About:  `Get, IsProcessed, and the check of stores.Open (which reads one key): the key's row; an expired row reads as none.`,
		Params: p(1) + ` key. Returns state, attempts, first_seen, last_seen, lease_until, owner, payload_hash, expires_at, reason, lease, now.`,
		SQL:    q.get})
	const (
		prefix = "bus:group:"
		limit  = inbox.DefaultListLimit
	)
	returns := ` Returns per row: msg_key, state, attempts, first_seen, last_seen, lease_until, owner, payload_hash, expires_at, reason, lease, now.`
	lists := []struct {
		name, about, params string
		opts                inbox.ListOptions
	}{
		{"list", `List (inboxctl ls) without a filter: a page of unexpired rows in key order, one row more than the page to tell whether another follows.`,
			p(1) + ` page size + 1.`, inbox.ListOptions{}},
		{"list-prefix", `List with a prefix, first page: the prefix is a range of the primary key (keys may hold % and _), from the prefix to the prefix with its last code point incremented.`,
			p(1) + ` prefix, ` + p(2) + ` end of its range, ` + p(3) + ` page size + 1.`, inbox.ListOptions{Prefix: prefix}},
		{"list-cursor", `List with a prefix, a later page: from the key after the cursor (the previous page's last key; without a prefix the same, without the end).`,
			p(1) + ` cursor, ` + p(2) + ` end of the prefix's range, ` + p(3) + ` page size + 1.`, inbox.ListOptions{Prefix: prefix, Cursor: prefix + "a:1"}},
		{"list-processed", `List of processed keys.`, p(1) + ` page size + 1.`, inbox.ListOptions{State: inbox.StateProcessed}},
		{"list-dead", `List of dead keys.`, p(1) + ` page size + 1.`, inbox.ListOptions{State: inbox.StateDead}},
		{"list-in-progress", `List of keys held by a live lease.`, p(1) + ` page size + 1.`, inbox.ListOptions{State: inbox.StateInProgress}},
		{"list-available", `List of open keys no live lease holds (free, released, or in a failed attempt's backoff: a lease nobody holds).`,
			p(1) + ` page size + 1.`, inbox.ListOptions{State: inbox.StateAvailable}},
		{"list-older-than", `List of keys last seen longer ago than OlderThan.`, p(1) + ` OlderThan (µs), ` + p(2) + ` page size + 1.`, inbox.ListOptions{OlderThan: time.Hour}},
	}
	for _, l := range lists {
		l.opts.Limit = limit
		query, _ := d.listQuery(l.opts)
		if dl != Postgres { // plain placeholders
			l.params = strings.NewReplacer(p(1), "1", p(2), "2", p(3), "3").Replace(l.params)
		}
		add(GoldenStatement{Name: l.name, About: l.about, Params: l.params + returns, SQL: query})
	}
	add(GoldenStatement{Name: "forget",
		About:  `Forget (inboxctl forget): deletes the key's row.`,
		Params: p(1) + ` key.`,
		SQL:    q.forget})
	add(GoldenStatement{Name: "force-release",
		About:  `ForceRelease (inboxctl release): ends the live lease or running backoff of an open row, fenced by no lease id; attempts kept.`,
		Params: p(1) + ` retention (µs), ` + p(2) + ` key.`,
		SQL:    q.forceRelease})
	about := `Cleanup (and the janitor of CleanupInterval): deletes at most CleanupBatch expired rows; sent again until fewer are deleted.`
	if dl == Postgres {
		about += ` Skips rows a claim has locked; the delete checks expiry again.`
	}
	add(GoldenStatement{Name: "cleanup", About: about, Params: p(1) + ` CleanupBatch.`, SQL: q.cleanup})
	add(GoldenStatement{Name: "cleanup-backlog",
		About:  `Backlog (inboxctl cleanup), and the janitor after each pass: counts the expired rows not deleted yet, reading at most MaxBacklog entries of the index on expires_at.`,
		Params: p(1) + ` MaxBacklog. Returns the count.`,
		SQL:    q.backlog})
}

// addTx adds the statements of the transactional mode (BeginTxClaim, which
// package txinbox calls), sent in the claim's transaction.
func addTx(f *GoldenFile, d *sqlDriver) {
	dl, q := d.opts.Dialect, d.txq
	p := func(i int) string {
		switch dl {
		case Postgres:
			return "$" + strconv.Itoa(i)
		case SQLite:
			return "?" + strconv.Itoa(i)
		}
		return strconv.Itoa(i)
	}
	add := func(s GoldenStatement) { f.Statements = append(f.Statements, s) }
	switch dl {
	case Postgres:
		add(GoldenStatement{Name: "tx-lock-timeout",
			About:  `Transactional mode (txinbox; BeginTxClaim): the first statement of the claim's transaction, which bounds its lock waits by LockTimeout.`,
			Params: `$1 LockTimeout in whole milliseconds, as text ("10000ms").`,
			SQL:    pgLockTimeout})
	case MySQL:
		add(GoldenStatement{Name: "tx-lock-wait-timeout",
			About:  `Transactional mode (txinbox; BeginTxClaim): on the claim's connection, before its transaction; LockTimeout in whole seconds rounded up, in the text (here txinbox's default, 10s).`,
			Params: `None.`,
			SQL:    myLockWaitTimeout(10)})
		add(GoldenStatement{Name: "tx-lock-wait-timeout-reset",
			About:  `Transactional mode: on the claim's connection after its transaction ended, before the connection goes back to the pool (which drops it if this fails).`,
			Params: `None.`,
			SQL:    myLockWaitTimeoutReset})
	}
	add(GoldenStatement{Name: "tx-claim",
		About:  `Transactional mode: the claim, in the claim's transaction: inserts the key's row already processed, uncommitted, or nothing when the key has a row (a concurrent claim's uncommitted row is waited for). No row inserted: tx-inspect follows.`,
		Params: p(1) + ` key, ` + p(2) + ` owner, ` + p(3) + ` retention (µs).`,
		SQL:    q.claim})
	lock := `, locking it`
	if dl == SQLite {
		lock = ` (the transaction holds the one writer)`
	}
	add(GoldenStatement{Name: "tx-inspect",
		About:  `Transactional mode: after tx-claim inserted nothing, the key's committed row` + lock + `: processed, expired, or a lease store's live lease, backoff or dead key.`,
		Params: p(1) + ` key. Returns state, lease_until, expires_at, now.`,
		SQL:    q.inspect})
	add(GoldenStatement{Name: "tx-remove",
		About:  `Transactional mode: after tx-inspect found the row expired, or a lease store's lease or backoff ended: deletes it, and tx-claim runs again.`,
		Params: p(1) + ` key.`,
		SQL:    q.remove})
}

// goldenKinds are the kinds of operations in the order of the bits of a
// PostgreSQL wave's mask, and of their parameters in its statement.
var goldenKinds = []struct {
	kind   driver.Kind
	name   string
	params string
	rows   string
}{
	{driver.Claim, "claim", "claims' keys, lease ids, owners, leases (µs) and payload hashes", "per claim: 1, msg_key, state, lease, lease_until, payload_hash, last_seen, attempts, reason, now"},
	{driver.Complete, "complete", "completes' keys and lease ids, and their number", "per complete whose lease held its key: 2, msg_key, then NULLs"},
	{driver.Release, "release", "releases' keys and lease ids, and their number", "per release whose lease held its key: 3, msg_key, then NULLs"},
	{driver.Mark, "mark", "marks' keys", "per mark: 4, msg_key, then NULLs"},
	{driver.Fail, "fail", "fails' keys, lease ids, reasons, backoffs (µs), new states, and their number", "per fail whose lease held its key: 5, msg_key, then NULLs"},
}

// maskName names the kinds of a wave's mask, joined by sep.
func maskName(mask int, sep string) string {
	var names []string
	for _, k := range goldenKinds {
		if mask&bit(k.kind) != 0 {
			names = append(names, k.name)
		}
	}
	return strings.Join(names, sep)
}

// pgWaveDoc describes the PostgreSQL wave statement of mask.
func pgWaveDoc(mask int) (about, params string) {
	var ps, rows []string
	for _, k := range goldenKinds {
		if mask&bit(k.kind) != 0 {
			ps = append(ps, k.params)
			rows = append(rows, k.rows)
		}
	}
	about = `A wave of a batch of several calls holding ` + maskName(mask, ", ") + ` (and no other kind): one statement, a data-modifying CTE per kind over the arrays of its rows (keys in byte order).`
	params = `$1 retention (µs), then as array literals (text), the ` + strings.Join(ps, "; the ") + `. Returns ` + strings.Join(rows, "; ") + `.`
	return about, params
}
