package sqlstore

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
	"github.com/watermill-inbox/inbox/stores/sql/internal/dialect"
)

// Dialect names the SQL database a [Store] talks to. Each is linked into a
// program by a package of its own, which imports the database/sql driver,
// registers the driver's name with database/sql and the dialect's URL
// schemes with package stores, and tells the store what the driver's
// errors mean:
//
//	import _ "github.com/watermill-inbox/inbox/stores/sql/postgres" // Postgres: driver "pgx", postgres://, postgresql://
//	import _ "github.com/watermill-inbox/inbox/stores/sql/mysql"    // MySQL: driver "mysql", mysql://
//	import _ "github.com/watermill-inbox/inbox/stores/sql/sqlite"   // SQLite: driver "sqlite", sqlite://
type Dialect string

// The dialects this package speaks.
const (
	// Postgres is PostgreSQL 12 or later, through github.com/jackc/pgx/v5/stdlib.
	Postgres Dialect = "postgres"

	// MySQL is MySQL 8 and MariaDB 10.5 or later, through
	// github.com/go-sql-driver/mysql. The store asks the server which one it
	// is: on MariaDB TryBegin is one statement (INSERT ... ON DUPLICATE KEY
	// UPDATE ... RETURNING), on MySQL, which has no RETURNING, a short
	// transaction.
	MySQL Dialect = "mysql"

	// SQLite is SQLite 3.35 or later, through modernc.org/sqlite (pure Go, no
	// cgo): the embedded store that needs no server.
	SQLite Dialect = "sqlite"
)

// packages are the import paths of the dialects' packages.
var packages = map[Dialect]string{
	Postgres: "github.com/watermill-inbox/inbox/stores/sql/postgres",
	MySQL:    "github.com/watermill-inbox/inbox/stores/sql/mysql",
	SQLite:   "github.com/watermill-inbox/inbox/stores/sql/sqlite",
}

// Validate reports whether d is one of the dialects above and its package
// is linked into the program; errors wrap [inbox.ErrInvalidArgument] and
// name the package to import.
func (d Dialect) Validate() error {
	if err := d.known(); err != nil {
		return err
	}
	if dialect.Lookup(string(d)) == nil {
		return fmt.Errorf("%w: sql store: dialect %s is not linked into this program: import _ %q, which links its database/sql driver", inbox.ErrInvalidArgument, d, packages[d])
	}
	return nil
}

// known reports whether d is one of the dialects above (which [DDL] needs,
// without the driver).
func (d Dialect) known() error {
	switch d {
	case Postgres, MySQL, SQLite:
		return nil
	case "":
		return fmt.Errorf("%w: sql store: Dialect is required (sqlstore.Postgres, sqlstore.MySQL or sqlstore.SQLite)", inbox.ErrInvalidArgument)
	}
	return fmt.Errorf("%w: sql store: unknown dialect %q (want %q, %q or %q)", inbox.ErrInvalidArgument, string(d), Postgres, MySQL, SQLite)
}

// DefaultTable is the table name used when [Options.Table] is empty.
const DefaultTable = "inbox"

// maxIdentLen leaves room under the 63 (PostgreSQL) and 64 (MySQL) byte
// limits for the index name derived from the table name.
const maxIdentLen = 48

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidateTable reports whether table is a usable table name: an identifier
// of ASCII letters, digits and underscores that does not start with a digit,
// at most 48 bytes, optionally qualified by a schema (PostgreSQL) or
// database (MySQL) as "schema.table". Names are quoted in every statement,
// so they keep their case. Anything else is refused: the name is spliced
// into SQL, so this check is what stops injection through configuration.
func ValidateTable(table string) error {
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return fmt.Errorf("%w: sql store: table %q has more than one dot (want table or schema.table)", inbox.ErrInvalidArgument, table)
	}
	for _, p := range parts {
		if !identRE.MatchString(p) || len(p) > maxIdentLen {
			return fmt.Errorf("%w: sql store: table %q is not an identifier of at most %d ASCII letters, digits and underscores, not starting with a digit",
				inbox.ErrInvalidArgument, table, maxIdentLen)
		}
	}
	return nil
}

// names are the quoted identifiers of one table.
type names struct {
	table string // quoted, possibly schema-qualified
	bare  string // quoted, unqualified
	index string // quoted index name (qualified by the schema on SQLite only)
}

func quoteIdent(d Dialect, table string) names {
	q := func(s string) string {
		if d == MySQL {
			return "`" + s + "`"
		}
		return `"` + s + `"`
	}
	parts := strings.Split(table, ".")
	quoted := make([]string, len(parts))
	for i, p := range parts {
		quoted[i] = q(p)
	}
	base := parts[len(parts)-1]
	idx := q(base + "_expires_at")
	if d == SQLite && len(parts) == 2 {
		// SQLite qualifies the index, not the table, in CREATE INDEX.
		idx = q(parts[0]) + "." + idx
	}
	return names{table: strings.Join(quoted, "."), bare: quoted[len(quoted)-1], index: idx}
}

// ddl returns the statements that create the table and its index, each
// idempotent (IF NOT EXISTS). The columns are those of the compact layout
// (see [DDL]); on PostgreSQL they are ordered by alignment, the widest
// first, so that a row has no padding between them.
func ddl(d Dialect, table string) []string {
	n := quoteIdent(d, table)
	switch d {
	case Postgres:
		return []string{
			`CREATE TABLE IF NOT EXISTS ` + n.table + ` (
	expires_at   TIMESTAMPTZ NOT NULL,
	first_seen   TIMESTAMPTZ NOT NULL,
	last_seen    TIMESTAMPTZ NOT NULL,
	lease_until  TIMESTAMPTZ NULL,
	attempts     INTEGER NOT NULL,
	state        SMALLINT NOT NULL,
	msg_key      TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	payload_hash BYTEA NULL,
	lease        BYTEA NULL,
	owner        TEXT NULL,
	reason       TEXT NULL
)`,
			`CREATE INDEX IF NOT EXISTS ` + n.index + ` ON ` + n.table + ` (expires_at)`,
			pgOrderDDL(quoteIdent(d, orderTable(table)).table),
		}
	case MySQL:
		// Binary strings: MySQL's and MariaDB's default collations fold case
		// and trailing spaces, and keys and lease ids compare byte for byte.
		return []string{
			`CREATE TABLE IF NOT EXISTS ` + n.table + ` (
	msg_key      VARBINARY(1024) NOT NULL,
	state        TINYINT NOT NULL,
	attempts     INT NOT NULL,
	first_seen   DATETIME(6) NOT NULL,
	last_seen    DATETIME(6) NOT NULL,
	lease_until  DATETIME(6) NULL,
	expires_at   DATETIME(6) NOT NULL,
	payload_hash VARBINARY(128) NULL,
	lease        VARBINARY(128) NULL,
	owner        VARBINARY(255) NULL,
	reason       VARBINARY(1024) NULL,
	PRIMARY KEY (msg_key),
	INDEX ` + n.index + ` (expires_at)
) ENGINE=InnoDB`,
		}
	case SQLite:
		// Times are integer microseconds since the Unix epoch; SQLite's clock
		// has millisecond resolution. WITHOUT ROWID: the rows are kept in
		// the primary key's b-tree, not in a second copy of the keys.
		return []string{
			`CREATE TABLE IF NOT EXISTS ` + n.table + ` (
	msg_key      TEXT NOT NULL PRIMARY KEY,
	state        INTEGER NOT NULL,
	attempts     INTEGER NOT NULL,
	first_seen   INTEGER NOT NULL,
	last_seen    INTEGER NOT NULL,
	lease_until  INTEGER NULL,
	expires_at   INTEGER NOT NULL,
	payload_hash BLOB NULL,
	lease        BLOB NULL,
	owner        TEXT NULL,
	reason       TEXT NULL
) WITHOUT ROWID`,
			`CREATE INDEX IF NOT EXISTS ` + n.index + ` ON ` + n.bare + ` (expires_at)`,
		}
	}
	return nil
}

// addedColumns are the columns a table of the earliest layout (made before
// Fail and dead keys) lacks, with their definitions in that layout per
// dialect; their defaults describe every row of such a table (no failed
// attempt). Migrate adds them before it upgrades the table to the compact
// layout (see upgradeLayout).
var addedColumns = []struct {
	name string
	def  map[Dialect]string
}{
	{"reason", map[Dialect]string{Postgres: `TEXT NOT NULL DEFAULT ''`, MySQL: `VARBINARY(1024) NOT NULL DEFAULT ''`, SQLite: `TEXT NOT NULL DEFAULT ''`}},
}

// addColumn is the statement that adds column c (one of addedColumns) to a
// table of the earliest layout. On PostgreSQL it is idempotent (IF NOT
// EXISTS); MySQL 8 and SQLite have no such clause, so Migrate adds only the
// columns it found missing, and takes a duplicate column for success.
func addColumn(d Dialect, table string, i int) string {
	c := addedColumns[i]
	ifNot := ""
	if d == Postgres {
		ifNot = "IF NOT EXISTS "
	}
	return `ALTER TABLE ` + quoteIdent(d, table).table + ` ADD COLUMN ` + ifNot + c.name + ` ` + c.def[d]
}

// DDL returns the SQL that creates the store's table and index for dialect d,
// as statements ending with a semicolon, for users who run their own
// migrations. It is what [Store.Migrate] runs on a new table (on PostgreSQL
// inside a transaction holding an advisory lock). Every statement is
// idempotent (IF NOT EXISTS). The table name is checked with
// [ValidateTable]; an empty name means [DefaultTable].
//
// The table has one row per key, in a compact layout: a processed or dead
// key keeps only what is read later. Its columns: msg_key (primary key,
// compared byte for byte), state (0 open, 1 processed, 2 dead), attempts,
// first_seen, last_seen (once processed, when it was processed),
// lease_until (the end of the lease; without a lease, the end of a failed
// attempt's backoff), expires_at (when the row may be deleted: the end of
// the lease, the processing or the failure, or of a failed attempt's
// backoff, plus the retention), payload_hash (bytes: the first 16 of a hex
// SHA-256, or an opaque hash as given), lease (the lease id while the lease
// is in flight; once processed, the first 8 bytes of the SHA-256 of the id
// of the lease that completed it, so that its repeated Complete still
// succeeds and any other's fails), owner (but once processed) and reason
// (of the latest failed attempt, [inbox.FailOptions.Reason]), NULL when
// empty, with an index on expires_at for [Store.Cleanup]. On PostgreSQL a
// second table, the table's name and "_order", holds the gates of order
// keys ([inbox.BeginOptions.OrderKey]): order_key (primary key), head,
// waiting (the keys behind the head, in their order) and expires_at.
//
// A table of an earlier layout (with the column lease_id) is upgraded by
// [Store.Migrate], which copies its rows to a table of this layout that
// takes its place; the DDL says so in a comment at its end.
func DDL(d Dialect, table string) (string, error) {
	if err := d.known(); err != nil {
		return "", err
	}
	if table == "" {
		table = DefaultTable
	}
	if err := ValidateTable(table); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(strings.Join(ddl(d, table), ";\n\n") + ";\n\n")
	b.WriteString("-- A table made by an earlier version of the store (with the column lease_id)\n" +
		"-- is upgraded by Store.Migrate (migrate=true in the URL, inboxctl migrate),\n" +
		"-- which copies its rows to a table of this layout that takes its place.\n")
	return b.String(), nil
}

// queries are the statements of one store, built once for its table.
//
// Durations are integer microseconds. Every statement reads the database
// clock once: PostgreSQL through a materialized clock_timestamp() (not
// now(), which is frozen at the start of a transaction); MySQL and MariaDB
// through UTC_TIMESTAMP(6), which is fixed for the duration of one
// statement; SQLite through 'now', fixed for one sqlite3_step (a statement
// with RETURNING makes all its changes in its first step).
//
// Claims, completes, releases, fails and marks are applied in batches (see
// batch.go): their statements are built per batch, for its number of rows,
// from the fragments below, except on PostgreSQL, where a batch passes its
// rows as arrays and the statements are built once.
type queries struct {
	t string // the quoted table name

	// pg[mask] is PostgreSQL's statement for one wave of a batch holding
	// the kinds of operations in mask (see pgWaveQuery).
	pg [1 << 5]string

	// extend(key, leaseID, leaseUS, leaseUS+retentionUS) returns lease_until
	// (PostgreSQL, SQLite); affects one row on MySQL, which then reads
	// lease_until with selectLeaseUntil in the same transaction.
	extend           string
	selectLeaseUntil string
	// get(key) returns recordCols, then now.
	get string
	// cleanup(batch): deletes at most batch expired rows.
	cleanup string
	// backlog(limit) counts the expired rows, at most limit of them, with
	// the clock of cleanup.
	backlog string
	// forget(key) deletes the key's row; forceRelease(retentionUS, key)
	// ends its live lease or running backoff.
	forget, forceRelease string

	// The statements of a batch of one op (applyOne): claimOne(key,
	// leaseID, owner, leaseUS, hash, leaseUS+retentionUS) returns what a
	// claim statement returns (below; not on MySQL 8); complete(retentionUS,
	// key, leaseID; on SQLite and its fingerprint, on MySQL myCompleteArgs
	// in place of retentionUS and the fingerprint) and release(retentionUS,
	// key, leaseID) affect one row on success; failOne likewise, with the
	// parameters of failArgs; lease ids and payload hashes are passed as
	// bytes (leaseBytes, encodeHash);
	// markOne(key, retentionUS). MySQL: holder(key) returns state,
	// lease, expires_at and now, to tell a repeated Complete without
	// clientFoundRows.
	claimOne, complete, release, failOne, markOne, holder string

	// claimRow, claimTail: a claim's VALUES row and what follows the rows
	// (the conflict clause, and RETURNING where the dialect has it).
	// Parameters of a row: key, leaseID, owner, leaseUS, hash,
	// leaseUS+retentionUS. The statement, built by claimsQuery, returns
	// claimCols and now per row; on MySQL 8 it returns nothing, and a
	// locking read of the rows follows it in its transaction.
	claimRow, claimTail string
	// markRow(key, retentionUS), markTail: likewise for marks, which
	// return nothing.
	markRow, markTail string
	// completeSet and releaseSet are the SET clauses of complete and
	// release, whose parameter is retentionUS (on SQLite, complete's are
	// ?1 and ?4; on MySQL, complete's are myCompleteArgs).
	completeSet, releaseSet string

	// order are the statements of the order of order keys (PostgreSQL
	// only; see order.go).
	order orderQueries
}

func buildQueries(d Dialect, table string, returning bool) queries {
	t := quoteIdent(d, table).table
	var q queries
	switch d {
	case Postgres:
		q = pgQueries(t)
	case MySQL:
		q = myQueries(t, returning)
	default:
		q = liteQueries(t)
	}
	q.t = t
	if d == Postgres {
		q.order = pgOrderQueries(t, quoteIdent(d, orderTable(table)).table)
	}
	if d != Postgres {
		q.claimOne, q.markOne = q.claimsQuery(1), q.marksQuery(1)
	}
	return q
}

const (
	// cols are the columns of the earlier layouts that the compact one
	// replaced (the earliest lacked reason): Migrate tells such a table by
	// them, and copies its rows to the compact layout.
	cols = `msg_key, state, lease_id, owner, lease_until, attempts, first_seen, last_seen, processed_at, payload_hash, expires_at`

	// insertCols are the columns the store's INSERTs name (reason is NULL).
	insertCols = `msg_key, state, lease, owner, lease_until, attempts, first_seen, last_seen, payload_hash, expires_at`

	// claimCols are the columns a claim statement answers per row, before
	// the clock reading (see claimRow in batch.go).
	claimCols = `msg_key, state, lease, lease_until, payload_hash, last_seen, attempts, reason`

	// recordCols are the columns Get and List read (see recordRow in
	// admin.go).
	recordCols = `state, attempts, first_seen, last_seen, lease_until, owner, payload_hash, expires_at, reason, lease`
)

// The states of a row.
const (
	stateOpen      = 0 // available, leased, or in a failed attempt's backoff
	stateProcessed = 1
	stateDead      = 2
)

// The column col of the would-be row x of a conflict, per dialect.
func pgNew(col string) string   { return "EXCLUDED." + col }
func myNew(col string) string   { return "VALUES(" + col + ")" }
func liteNew(col string) string { return "excluded." + col }

// claimSet is the SET clause of a claim's conflict on PostgreSQL and SQLite,
// which evaluate every assignment on the old row: t qualifies the columns of
// the existing row ("t." or ""), x(col) is the column col of the would-be
// row. It makes the TryBegin decision, on the existing row t and the
// would-be row x (whose last_seen is the statement's clock reading):
//
//	gone: t expired (retention or lease+retention passed): start a fresh record;
//	free: t is open, and its lease or its failed attempt's backoff ended
//	      or was released: acquire, Attempts+1;
//	mine: t is open and held by the caller's own lease id: renew from now
//	      (a failed, released or forcibly released lease has lease NULL,
//	      which no caller's lease id is);
//	else: processed, dead, held by another live lease, or in a backoff:
//	      unchanged.
//
// A failed attempt's backoff is a lease that nobody holds: Fail sets
// lease_until to its end and empties lease (NULL, which no caller's lease
// id is), so a claim answers Busy until then as it does for a live lease,
// and the conditions are those of leases alone. Get tells the two apart by
// the lease.
func claimSet(t string, x func(col string) string) string {
	gone := t + `expires_at <= ` + x("last_seen")
	free := t + `state = 0 AND (` + t + `lease_until IS NULL OR ` + t + `lease_until <= ` + x("last_seen") + `)`
	mine := t + `state = 0 AND ` + t + `lease = ` + x("lease")
	return `
	state        = CASE WHEN ` + gone + ` THEN 0 ELSE ` + t + `state END,
	lease        = CASE WHEN ` + gone + ` OR (` + free + `) THEN ` + x("lease") + ` ELSE ` + t + `lease END,
	owner        = CASE WHEN ` + gone + ` OR (` + free + `) THEN ` + x("owner") + ` ELSE ` + t + `owner END,
	lease_until  = CASE WHEN ` + gone + ` OR (` + free + `) OR (` + mine + `) THEN ` + x("lease_until") + ` ELSE ` + t + `lease_until END,
	attempts     = CASE WHEN ` + gone + ` THEN 1 WHEN ` + free + ` THEN ` + t + `attempts + 1 ELSE ` + t + `attempts END,
	first_seen   = CASE WHEN ` + gone + ` THEN ` + x("first_seen") + ` ELSE ` + t + `first_seen END,
	last_seen    = CASE WHEN ` + gone + ` OR (` + free + `) OR (` + mine + `) THEN ` + x("last_seen") + ` ELSE ` + t + `last_seen END,
	payload_hash = CASE WHEN ` + gone + ` OR ((` + free + `) AND ` + t + `payload_hash IS NULL) THEN ` + x("payload_hash") + ` ELSE ` + t + `payload_hash END,
	reason       = CASE WHEN ` + gone + ` THEN NULL ELSE ` + t + `reason END,
	expires_at   = CASE WHEN ` + gone + ` OR (` + free + `) OR (` + mine + `) THEN ` + x("expires_at") + ` ELSE ` + t + `expires_at END`
}

// markSet is the SET clause of a mark's conflict, t and x as in claimSet.
// expires_at is assigned last: on MySQL, which runs the assignments left
// to right, the conditions before it read the old one. A processed row
// keeps no owner and no lease.
func markSet(t string, x func(col string) string) string {
	gone := t + `expires_at <= ` + x("last_seen")
	return `
	attempts     = CASE WHEN ` + gone + ` THEN 0 ELSE ` + t + `attempts END,
	first_seen   = CASE WHEN ` + gone + ` THEN ` + x("first_seen") + ` ELSE ` + t + `first_seen END,
	payload_hash = CASE WHEN ` + gone + ` THEN NULL ELSE ` + t + `payload_hash END,
	reason       = CASE WHEN ` + gone + ` THEN NULL ELSE ` + t + `reason END,
	last_seen    = ` + x("last_seen") + `,
	lease        = NULL,
	owner        = NULL,
	lease_until  = NULL,
	state        = 1,
	expires_at   = ` + x("expires_at")
}

// The SET clauses of a claim's and a mark's conflict on PostgreSQL.
var pgClaimSet, pgMarkSet = claimSet("t.", pgNew), markSet("t.", pgNew)

const (
	pgUS = ` * interval '1 microsecond'`

	// pgFP is the fingerprint (leaseFP) of the lease column of the row.
	pgFP = `substr(sha256(t.lease), 1, 8)`

	// The SET clauses of Complete and Release; $1 is the retention.
	// Complete keeps of the lease only its fingerprint, and no owner. It
	// leaves expires_at as the claim set it (the end of the lease plus the
	// retention) when that keeps the key for the retention and at most a
	// 64th of it more: then it changes no indexed column, and PostgreSQL
	// updates the row in place (a HOT update: no new index entries, and the
	// old version's space is reused on its page).
	pgCompleteSet = `
	last_seen    = CASE WHEN t.state = 0 THEN n.now ELSE t.last_seen END,
	expires_at   = CASE WHEN t.state = 0 AND NOT (t.expires_at BETWEEN n.now + $1::bigint` + pgUS + ` AND n.now + ($1::bigint + $1::bigint / 64)` + pgUS + `)
		THEN n.now + $1::bigint` + pgUS + ` ELSE t.expires_at END,
	lease        = CASE WHEN t.state = 0 THEN ` + pgFP + ` ELSE t.lease END,
	owner        = NULL,
	lease_until  = NULL,
	state        = 1`
	pgReleaseSet = ` lease = NULL, lease_until = NULL, last_seen = n.now, expires_at = n.now + $1::bigint` + pgUS
)

// pgHolds is the fence of a Complete on PostgreSQL whose lease id (bytea)
// is l: the row is open under that lease, or processed by it (its
// fingerprint).
func pgHolds(l string) string {
	return `(t.state = 0 AND t.lease = ` + l + ` OR t.state = 1 AND t.lease = substr(sha256(` + l + `), 1, 8))`
}

// bit is the bit of kind k in the mask of the kinds of operations a
// PostgreSQL wave statement carries (see pgWaveQuery).
func bit(k driver.Kind) int { return 1 << (k - driver.Claim) }

func pgQueries(t string) queries {
	q := queries{
		extend: `WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now)
UPDATE ` + t + ` AS t SET lease_until = n.now + $3::bigint` + pgUS + `, expires_at = n.now + $4::bigint` + pgUS + `
FROM n WHERE t.msg_key = $1 AND t.lease = $2::bytea AND t.state = 0 AND t.expires_at > n.now
RETURNING t.lease_until`,

		get: `SELECT ` + recordCols + `, clock_timestamp()
FROM ` + t + ` WHERE msg_key = $1`,

		cleanup: `WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now)
DELETE FROM ` + t + ` AS t USING n
WHERE t.expires_at <= n.now AND t.ctid = ANY(ARRAY(
	SELECT d.ctid FROM ` + t + ` AS d WHERE d.expires_at <= (SELECT now FROM n)
	ORDER BY d.expires_at LIMIT $1 FOR UPDATE SKIP LOCKED))`,

		backlog: `WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now)
SELECT count(*) FROM (
	SELECT 1 FROM ` + t + ` AS d WHERE d.expires_at <= (SELECT now FROM n) LIMIT $1) AS b`,

		forget: `DELETE FROM ` + t + ` WHERE msg_key = $1`,

		forceRelease: `WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now)
UPDATE ` + t + ` AS t SET lease = NULL, lease_until = NULL, last_seen = n.now, expires_at = n.now + $1::bigint` + pgUS + `
FROM n WHERE t.msg_key = $2 AND t.state = 0 AND t.expires_at > n.now AND t.lease_until > n.now`,
	}
	for mask := 1; mask < len(q.pg); mask++ {
		q.pg[mask] = pgWaveQuery(t, mask)
	}
	// A batch of one op: the statements with scalar parameters are cheaper
	// than those over arrays.
	q.claimOne = `WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now), r AS (
INSERT INTO ` + t + ` AS t (` + insertCols + `)
SELECT $1, 0, $2::bytea, NULLIF($3::text, ''), n.now + $4::bigint` + pgUS + `, 1, n.now, n.now, $5::bytea, n.now + $6::bigint` + pgUS + ` FROM n
ON CONFLICT (msg_key) DO UPDATE SET` + pgClaimSet + `
RETURNING ` + pgCols("t", claimCols) + `)
SELECT ` + pgCols("r", claimCols) + `, n.now FROM r, n`
	q.complete = `WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now)
UPDATE ` + t + ` AS t SET` + pgCompleteSet + `
FROM n WHERE t.msg_key = $2 AND ` + pgHolds("$3::bytea") + ` AND t.expires_at > n.now`
	q.release = `WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now)
UPDATE ` + t + ` AS t SET` + pgReleaseSet + `
FROM n WHERE t.msg_key = $2 AND t.lease = $3::bytea AND t.state = 0 AND t.expires_at > n.now`
	q.failOne = `WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now)
UPDATE ` + t + ` AS t SET` + pgFailSet("$4::text", "$5::smallint", "$6::bigint") + `
FROM n WHERE t.msg_key = $2 AND t.lease = $3::bytea AND t.state = 0 AND t.expires_at > n.now`
	q.markOne = `WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now)
INSERT INTO ` + t + ` AS t (` + insertCols + `)
SELECT $1, 1, NULL, NULL, NULL, 0, n.now, n.now, NULL, n.now + $2::bigint` + pgUS + ` FROM n
ON CONFLICT (msg_key) DO UPDATE SET` + pgMarkSet
	return q
}

// pgCols qualifies each column of list (comma-separated) with alias.
func pgCols(alias, list string) string {
	cs := strings.Split(list, ", ")
	for i, c := range cs {
		cs[i] = alias + "." + c
	}
	return strings.Join(cs, ", ")
}

// pgFailSet is the SET clause of a Fail whose reason, new state (0, or 2
// for dead) and backoff (microseconds, 0 for none) are the expressions
// given; $1 is the retention. The backoff is a lease nobody holds: lease
// NULL, lease_until its end (NULL without one). The row lives for the
// backoff plus the retention. A dead row keeps its owner (who failed it).
func pgFailSet(reason, state, retryUS string) string {
	return ` lease = NULL, lease_until = NULLIF(n.now + ` + retryUS + pgUS + `, n.now), last_seen = n.now,
	reason = NULLIF(` + reason + `, ''), state = ` + state + `, expires_at = n.now + (` + retryUS + ` + $1::bigint)` + pgUS
}

// pgWaveQuery is the one statement of a PostgreSQL wave whose operations
// are of the kinds in mask: a data-modifying CTE per kind, each over the
// arrays of its rows (unnest), all reading one clock. Its parameters are the
// retention (microseconds), then per kind present, in the order claims,
// completes, releases, marks, fails, its arrays as array literals (text,
// cast in the statement, so any driver passes them): claims keys, lease
// ids, owners, lease lengths (microseconds) and payload hashes; completes
// and releases keys, lease ids and their number; marks keys; fails keys,
// lease ids, reasons, backoffs (microseconds), new states and their
// number.
//
// The number of completes (releases, fails) is the LIMIT of their unnest,
// which changes nothing but the planner's estimate: a LIMIT it cannot read
// makes it expect one row, so the UPDATE looks each key up in the primary
// key index whatever the table's statistics. Without it, the plan that
// PostgreSQL caches for the prepared statement, made while the table was
// small, may hash-join the arrays with a scan of the whole table, and keep
// doing so as the table grows. It returns one row per claim (kind 1:
// msg_key, then claimCols but msg_key, then now), per complete, release
// and fail that held its key (kinds 2, 3 and 5: msg_key), and per mark
// (kind 4: msg_key). The keys of a wave are distinct, so no two CTEs touch
// one row.
func pgWaveQuery(t string, mask int) string {
	n := 0
	param := func(cast string) string { n++; return "$" + strconv.Itoa(n) + cast }
	arr := func(typ string) string { return param("::text::" + typ + "[]") }
	ret := param("::bigint") // $1, as pgCompleteSet, pgReleaseSet and pgFailSet expect
	ctes := []string{`n AS MATERIALIZED (SELECT clock_timestamp() AS now)`}
	var sels []string
	other := func(kind int, cte string) string {
		return `SELECT ` + strconv.Itoa(kind) + `, ` + cte + `.msg_key, NULL::int, NULL::bytea, NULL::timestamptz, NULL::bytea, NULL::timestamptz, NULL::int, NULL::text, NULL::timestamptz FROM ` + cte
	}
	if mask&bit(driver.Claim) != 0 {
		k, l, o, lu, h := arr("text"), arr("text"), arr("text"), arr("bigint"), arr("text")
		ctes = append(ctes, `c AS (
INSERT INTO `+t+` AS t (`+insertCols+`)
SELECT u.k, 0, convert_to(u.l, 'UTF8'), NULLIF(u.o, ''), n.now + u.lu`+pgUS+`, 1, n.now, n.now, decode(u.h, 'hex'), n.now + (u.lu + `+ret+`)`+pgUS+`
FROM n, unnest(`+k+`, `+l+`, `+o+`, `+lu+`, `+h+`) AS u(k, l, o, lu, h)
ON CONFLICT (msg_key) DO UPDATE SET`+pgClaimSet+`
RETURNING `+pgCols("t", claimCols)+`)`)
		sels = append(sels, `SELECT 1, c.msg_key, c.state::int, c.lease, c.lease_until, c.payload_hash, c.last_seen, c.attempts, c.reason, n.now FROM c, n`)
	}
	if mask&bit(driver.Complete) != 0 {
		k, l, lim := arr("text"), arr("text"), param("::int")
		ctes = append(ctes, `d AS (
UPDATE `+t+` AS t SET`+pgCompleteSet+`
FROM n, (SELECT * FROM unnest(`+k+`, `+l+`) LIMIT `+lim+`) AS u(k, l)
WHERE t.msg_key = u.k AND `+pgHolds("convert_to(u.l, 'UTF8')")+` AND t.expires_at > n.now
RETURNING t.msg_key)`)
		sels = append(sels, other(2, "d"))
	}
	if mask&bit(driver.Release) != 0 {
		k, l, lim := arr("text"), arr("text"), param("::int")
		ctes = append(ctes, `r AS (
UPDATE `+t+` AS t SET`+pgReleaseSet+`
FROM n, (SELECT * FROM unnest(`+k+`, `+l+`) LIMIT `+lim+`) AS u(k, l)
WHERE t.msg_key = u.k AND t.lease = convert_to(u.l, 'UTF8') AND t.state = 0 AND t.expires_at > n.now
RETURNING t.msg_key)`)
		sels = append(sels, other(3, "r"))
	}
	if mask&bit(driver.Mark) != 0 {
		k := arr("text")
		ctes = append(ctes, `m AS (
INSERT INTO `+t+` AS t (`+insertCols+`)
SELECT u.k, 1, NULL, NULL, NULL, 0, n.now, n.now, NULL, n.now + `+ret+pgUS+`
FROM n, unnest(`+k+`) AS u(k)
ON CONFLICT (msg_key) DO UPDATE SET`+pgMarkSet+`
RETURNING t.msg_key)`)
		sels = append(sels, other(4, "m"))
	}
	if mask&bit(driver.Fail) != 0 {
		k, l, r, ra, s, lim := arr("text"), arr("text"), arr("text"), arr("bigint"), arr("smallint"), param("::int")
		ctes = append(ctes, `f AS (
UPDATE `+t+` AS t SET`+pgFailSet("u.r", "u.s", "u.ra")+`
FROM n, (SELECT * FROM unnest(`+k+`, `+l+`, `+r+`, `+ra+`, `+s+`) LIMIT `+lim+`) AS u(k, l, r, ra, s)
WHERE t.msg_key = u.k AND t.lease = convert_to(u.l, 'UTF8') AND t.state = 0 AND t.expires_at > n.now
RETURNING t.msg_key)`)
		sels = append(sels, other(5, "f"))
	}
	return "WITH " + strings.Join(ctes, ",\n") + "\n" + strings.Join(sels, "\nUNION ALL ")
}

// MySQL and MariaDB run the assignments of ON DUPLICATE KEY UPDATE (and of
// a single-table UPDATE) left to right, each seeing the columns assigned
// before it. The conditions read expires_at, state, lease_until and
// lease, so those are assigned last, in an order where every
// condition still decides as it would on the old row (see the comment in
// myQueries).
func myQueries(t string, returning bool) queries {
	const (
		now  = `UTC_TIMESTAMP(6)`
		xnow = `VALUES(last_seen)`
		gone = `expires_at <= ` + xnow
		free = `state = 0 AND (lease_until IS NULL OR lease_until <= ` + xnow + `)`
		mine = `state = 0 AND lease = VALUES(lease)`
	)
	// The columns assigned before lease (attempts, ..., last_seen) are
	// read by no condition. Order of the last four assignments:
	//   lease       := new when gone or free. Rows that were neither keep the
	//                  old id, so "mine" still reads the old value for them;
	//                  rows that were gone or free are still seen as such by
	//                  the later conditions, which test gone/free first.
	//   lease_until := new when gone, free or mine (state, expires_at intact).
	//   state       := 0 when gone (expires_at intact).
	//   expires_at  := new when gone (old expires_at), free (lease_until was
	//                  just renewed, but lease = new and state = 0 make
	//                  "mine" true for those rows) or mine.
	q := queries{
		claimRow: `(?, 0, ?, NULLIF(?, ''), ` + now + ` + INTERVAL ? MICROSECOND, 1, ` + now + `, ` + now + `, ?, ` + now + ` + INTERVAL ? MICROSECOND)`,
		claimTail: `
ON DUPLICATE KEY UPDATE
	attempts     = CASE WHEN ` + gone + ` THEN 1 WHEN ` + free + ` THEN attempts + 1 ELSE attempts END,
	first_seen   = CASE WHEN ` + gone + ` THEN VALUES(first_seen) ELSE first_seen END,
	owner        = CASE WHEN ` + gone + ` OR (` + free + `) THEN VALUES(owner) ELSE owner END,
	payload_hash = CASE WHEN ` + gone + ` OR ((` + free + `) AND payload_hash IS NULL) THEN VALUES(payload_hash) ELSE payload_hash END,
	reason       = CASE WHEN ` + gone + ` THEN NULL ELSE reason END,
	last_seen    = CASE WHEN ` + gone + ` OR (` + free + `) OR (` + mine + `) THEN ` + xnow + ` ELSE last_seen END,
	lease        = CASE WHEN ` + gone + ` OR (` + free + `) THEN VALUES(lease) ELSE lease END,
	lease_until  = CASE WHEN ` + gone + ` OR (` + free + `) OR (` + mine + `) THEN VALUES(lease_until) ELSE lease_until END,
	state        = CASE WHEN ` + gone + ` THEN 0 ELSE state END,
	expires_at   = CASE WHEN ` + gone + ` OR (` + free + `) OR (` + mine + `) THEN VALUES(expires_at) ELSE expires_at END`,

		// state is assigned last: the conditions before it read the old
		// one. The lease keeps only its fingerprint (leaseFP). expires_at
		// stays as the claim set it when within a 64th of the retention
		// past now + retention (see pgCompleteSet): then the index on it
		// is not written. Parameters: the retention, the retention and a
		// 64th, the retention (myCompleteArgs).
		completeSet: `
	last_seen    = CASE WHEN state = 0 THEN ` + now + ` ELSE last_seen END,
	expires_at   = CASE WHEN state = 0 AND NOT (expires_at BETWEEN ` + now + ` + INTERVAL ? MICROSECOND AND ` + now + ` + INTERVAL ? MICROSECOND)
		THEN ` + now + ` + INTERVAL ? MICROSECOND ELSE expires_at END,
	lease        = CASE WHEN state = 0 THEN UNHEX(LEFT(SHA2(lease, 256), 16)) ELSE lease END,
	owner        = NULL,
	lease_until  = NULL,
	state        = 1`,

		releaseSet: ` lease = NULL, lease_until = NULL, last_seen = ` + now + `, expires_at = ` + now + ` + INTERVAL ? MICROSECOND`,

		markRow:  `(?, 1, NULL, NULL, NULL, 0, ` + now + `, ` + now + `, NULL, ` + now + ` + INTERVAL ? MICROSECOND)`,
		markTail: "\nON DUPLICATE KEY UPDATE" + markSet("", myNew),

		extend: `UPDATE ` + t + ` SET lease_until = ` + now + ` + INTERVAL ? MICROSECOND, expires_at = ` + now + ` + INTERVAL ? MICROSECOND
WHERE msg_key = ? AND lease = ? AND state = 0 AND expires_at > ` + now,
		selectLeaseUntil: `SELECT lease_until FROM ` + t + ` WHERE msg_key = ?`,

		get: `SELECT ` + recordCols + `, ` + now + `
FROM ` + t + ` WHERE msg_key = ?`,

		holder: `SELECT state, lease, expires_at, ` + now + ` FROM ` + t + ` WHERE msg_key = ?`,

		cleanup: `DELETE FROM ` + t + ` WHERE expires_at <= ` + now + ` ORDER BY expires_at LIMIT ?`,

		backlog: `SELECT COUNT(*) FROM (SELECT 1 FROM ` + t + ` WHERE expires_at <= ` + now + ` LIMIT ?) AS b`,

		forget: `DELETE FROM ` + t + ` WHERE msg_key = ?`,

		// The WHERE clause reads the old row; no assignment reads a column.
		forceRelease: `UPDATE ` + t + ` SET lease = NULL, lease_until = NULL, last_seen = ` + now + `, expires_at = ` + now + ` + INTERVAL ? MICROSECOND
WHERE msg_key = ? AND state = 0 AND expires_at > ` + now + ` AND lease_until > ` + now,
	}
	if returning {
		q.claimTail += "\nRETURNING " + claimCols + ", " + now
	}
	q.complete, q.release = settleQueries(t, q.completeSet, q.releaseSet, now,
		`(state = 0 AND lease = ? OR state = 1 AND lease = ?)`)
	// No assignment reads a column. Parameters: see failArgs.
	q.failOne = `UPDATE ` + t + ` SET` + myFailSet("?", "?", "?", "?") + `
WHERE msg_key = ? AND lease = ? AND state = 0 AND expires_at > ` + now
	return q
}

// settleQueries are the complete and release statements of one op on MySQL
// and SQLite (see queries), of the SET clauses given, now being the
// dialect's clock and holds the fence of a Complete (whose parameters are
// the lease id and its fingerprint).
func settleQueries(t, completeSet, releaseSet, now, holds string) (complete, release string) {
	complete = `UPDATE ` + t + ` SET` + completeSet + `
WHERE msg_key = ? AND ` + holds + ` AND expires_at > ` + now
	release = `UPDATE ` + t + ` SET` + releaseSet + `
WHERE msg_key = ? AND lease = ? AND state = 0 AND expires_at > ` + now
	return complete, release
}

// myFailSet is the SET clause of a Fail on MySQL whose reason, new state,
// backoff and backoff plus retention (microseconds) are the expressions
// given (see pgFailSet).
func myFailSet(reason, state, retryUS, expiresUS string) string {
	const now = `UTC_TIMESTAMP(6)`
	return ` lease = NULL, lease_until = NULLIF(` + now + ` + INTERVAL ` + retryUS + ` MICROSECOND, ` + now + `), last_seen = ` + now + `,
	reason = NULLIF(` + reason + `, ''), state = ` + state + `, expires_at = ` + now + ` + INTERVAL ` + expiresUS + ` MICROSECOND`
}

// liteNow is SQLite's clock in integer microseconds since the Unix epoch.
// julianday('now') has millisecond resolution; rounding to whole
// milliseconds removes the floating-point noise of the conversion.
const liteNow = `(CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)`

// liteQueries are SQLite's statements. SQLite has no SHA-256: a Complete is
// given its lease's fingerprint (leaseFP) as a parameter.
func liteQueries(t string) queries {
	const now = liteNow
	// SQLite, like PostgreSQL, evaluates every assignment on the old row.
	q := queries{
		claimRow:  `(?, 0, ?, NULLIF(?, ''), ` + now + ` + ?, 1, ` + now + `, ` + now + `, ?, ` + now + ` + ?)`,
		claimTail: "\nON CONFLICT (msg_key) DO UPDATE SET" + claimSet("", liteNew) + "\nRETURNING " + claimCols + ", " + now,

		completeSet: `
	last_seen    = CASE WHEN state = 0 THEN ` + now + ` ELSE last_seen END,
	expires_at   = CASE WHEN state = 0 THEN ` + now + ` + ?1 ELSE expires_at END,
	lease        = CASE WHEN state = 0 THEN ?4 ELSE lease END,
	owner        = NULL,
	lease_until  = NULL,
	state        = 1`,

		releaseSet: ` lease = NULL, lease_until = NULL, last_seen = ` + now + `, expires_at = ` + now + ` + ?`,

		markRow:  `(?, 1, NULL, NULL, NULL, 0, ` + now + `, ` + now + `, NULL, ` + now + ` + ?)`,
		markTail: "\nON CONFLICT (msg_key) DO UPDATE SET" + markSet("", liteNew),

		extend: `UPDATE ` + t + ` SET lease_until = ` + now + ` + ?3, expires_at = ` + now + ` + ?4
WHERE msg_key = ?1 AND lease = ?2 AND state = 0 AND expires_at > ` + now + `
RETURNING lease_until`,

		get: `SELECT ` + recordCols + `, ` + now + `
FROM ` + t + ` WHERE msg_key = ?1`,

		cleanup: `DELETE FROM ` + t + ` WHERE expires_at <= ` + now + ` AND msg_key IN (
	SELECT msg_key FROM ` + t + ` WHERE expires_at <= ` + now + ` ORDER BY expires_at LIMIT ?1)`,

		backlog: `SELECT count(*) FROM (SELECT 1 FROM ` + t + ` WHERE expires_at <= ` + now + ` LIMIT ?1)`,

		forget: `DELETE FROM ` + t + ` WHERE msg_key = ?1`,

		forceRelease: `UPDATE ` + t + ` SET lease = NULL, lease_until = NULL, last_seen = ` + now + `, expires_at = ` + now + ` + ?1
WHERE msg_key = ?2 AND state = 0 AND expires_at > ` + now + ` AND lease_until > ` + now,

		failOne: `UPDATE ` + t + ` SET lease = NULL, lease_until = NULLIF(` + now + ` + ?6, ` + now + `), last_seen = ` + now + `,
	reason = NULLIF(?4, ''), state = ?5, expires_at = ` + now + ` + ?6 + ?1
WHERE msg_key = ?2 AND lease = ?3 AND state = 0 AND expires_at > ` + now,
	}
	q.complete = `UPDATE ` + t + ` SET` + q.completeSet + `
WHERE msg_key = ?2 AND (state = 0 AND lease = ?3 OR state = 1 AND lease = ?4) AND expires_at > ` + now
	q.release = `UPDATE ` + t + ` SET` + q.releaseSet + `
WHERE msg_key = ? AND lease = ? AND state = 0 AND expires_at > ` + now
	return q
}
