package sqlstore

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/watermill-inbox/inbox"
)

// Dialect names the SQL database a [Store] talks to.
type Dialect string

// The dialects this package speaks.
const (
	// Postgres is PostgreSQL 12 or later, through github.com/jackc/pgx/v5/stdlib
	// (any database/sql driver for PostgreSQL works).
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

// Validate reports whether d is one of the dialects above.
func (d Dialect) Validate() error {
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
// idempotent (IF NOT EXISTS).
func ddl(d Dialect, table string) []string {
	n := quoteIdent(d, table)
	switch d {
	case Postgres:
		return []string{
			`CREATE TABLE IF NOT EXISTS ` + n.table + ` (
	msg_key      TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	state        SMALLINT NOT NULL,
	lease_id     TEXT NOT NULL,
	owner        TEXT NOT NULL,
	lease_until  TIMESTAMPTZ NULL,
	attempts     INTEGER NOT NULL,
	first_seen   TIMESTAMPTZ NOT NULL,
	last_seen    TIMESTAMPTZ NOT NULL,
	processed_at TIMESTAMPTZ NULL,
	payload_hash TEXT NOT NULL,
	expires_at   TIMESTAMPTZ NOT NULL
)`,
			`CREATE INDEX IF NOT EXISTS ` + n.index + ` ON ` + n.table + ` (expires_at)`,
		}
	case MySQL:
		// Binary strings: MySQL's and MariaDB's default collations fold case
		// and trailing spaces, and keys and lease ids compare byte for byte.
		return []string{
			`CREATE TABLE IF NOT EXISTS ` + n.table + ` (
	msg_key      VARBINARY(1024) NOT NULL,
	state        TINYINT NOT NULL,
	lease_id     VARBINARY(128) NOT NULL,
	owner        VARBINARY(255) NOT NULL,
	lease_until  DATETIME(6) NULL,
	attempts     INT NOT NULL,
	first_seen   DATETIME(6) NOT NULL,
	last_seen    DATETIME(6) NOT NULL,
	processed_at DATETIME(6) NULL,
	payload_hash VARBINARY(128) NOT NULL,
	expires_at   DATETIME(6) NOT NULL,
	PRIMARY KEY (msg_key),
	INDEX ` + n.index + ` (expires_at)
) ENGINE=InnoDB`,
		}
	case SQLite:
		// Times are integer microseconds since the Unix epoch; SQLite's clock
		// has millisecond resolution.
		return []string{
			`CREATE TABLE IF NOT EXISTS ` + n.table + ` (
	msg_key      TEXT NOT NULL PRIMARY KEY,
	state        INTEGER NOT NULL,
	lease_id     TEXT NOT NULL,
	owner        TEXT NOT NULL,
	lease_until  INTEGER NULL,
	attempts     INTEGER NOT NULL,
	first_seen   INTEGER NOT NULL,
	last_seen    INTEGER NOT NULL,
	processed_at INTEGER NULL,
	payload_hash TEXT NOT NULL,
	expires_at   INTEGER NOT NULL
)`,
			`CREATE INDEX IF NOT EXISTS ` + n.index + ` ON ` + n.bare + ` (expires_at)`,
		}
	}
	return nil
}

// DDL returns the SQL that creates the store's table and index for dialect d,
// as statements ending with a semicolon, for users who run their own
// migrations. It is what [Store.Migrate] runs (on PostgreSQL inside a
// transaction holding an advisory lock). Every statement is idempotent (IF
// NOT EXISTS). The table name is checked with [ValidateTable]; an empty name
// means [DefaultTable].
//
// The table has one row per key: msg_key (primary key, compared byte for
// byte), state (0 open, 1 processed), lease_id, owner, lease_until,
// attempts, first_seen, last_seen, processed_at, payload_hash and
// expires_at (when the row may be deleted: lease end or processing time plus
// the retention), with an index on expires_at for [Store.Cleanup].
func DDL(d Dialect, table string) (string, error) {
	if err := d.Validate(); err != nil {
		return "", err
	}
	if table == "" {
		table = DefaultTable
	}
	if err := ValidateTable(table); err != nil {
		return "", err
	}
	return strings.Join(ddl(d, table), ";\n\n") + ";\n", nil
}

// queries are the statements of one store, built once for its table.
//
// Parameters, in order, are documented per query. Durations are integer
// microseconds. Every statement reads the database clock once: PostgreSQL
// through a materialized clock_timestamp() (not now(), which is frozen at the
// start of a transaction); MySQL and MariaDB through UTC_TIMESTAMP(6), which
// is fixed for the duration of one statement; SQLite through 'now', fixed
// for one sqlite3_step.
type queries struct {
	// tryBegin(key, leaseID, owner, leaseUS, hash, leaseUS+retentionUS) returns
	// state, lease_id, lease_until, attempts, payload_hash, last_seen, now. MySQL
	// (without RETURNING): an upsert only; read the row with selectLocked.
	tryBegin string
	// selectLocked(key) returns state, lease_id, lease_until, attempts,
	// payload_hash, last_seen, now, locking the row (MySQL only).
	selectLocked string
	// complete(key, leaseID, retentionUS): affects one row on success.
	complete string
	// release(key, leaseID, retentionUS): affects one row on success.
	release string
	// extend(key, leaseID, leaseUS, leaseUS+retentionUS) returns lease_until
	// (PostgreSQL, SQLite); affects one row on MySQL, which then reads
	// lease_until with selectLeaseUntil in the same transaction.
	extend           string
	selectLeaseUntil string
	// get(key) returns state, attempts, first_seen, last_seen, lease_until,
	// owner, payload_hash, expires_at, now.
	get string
	// markProcessed(key, retentionUS).
	markProcessed string
	// holder(key) returns state, lease_id, expires_at, now (MySQL's repeated
	// Complete without clientFoundRows).
	holder string
	// cleanup(batch): deletes at most batch expired rows.
	cleanup string
}

func buildQueries(d Dialect, table string) queries {
	t := quoteIdent(d, table).table
	switch d {
	case Postgres:
		return pgQueries(t)
	case MySQL:
		return myQueries(t)
	default:
		return liteQueries(t)
	}
}

const cols = `msg_key, state, lease_id, owner, lease_until, attempts, first_seen, last_seen, processed_at, payload_hash, expires_at`

// The TryBegin decision, on the existing row t and the would-be row x (whose
// last_seen is the statement's clock reading):
//
//	gone: t expired (retention or lease+retention passed): start a fresh record;
//	free: t is open and its lease ended or was released: acquire, Attempts+1;
//	mine: t is open and held by the caller's own lease id: renew from now;
//	else: processed, or held by another live lease: unchanged.
func pgQueries(t string) queries {
	const (
		gone = `t.expires_at <= x.last_seen`
		free = `t.state = 0 AND (t.lease_until IS NULL OR t.lease_until <= x.last_seen)`
		mine = `t.state = 0 AND t.lease_id = x.lease_id`
		us   = `::bigint * interval '1 microsecond'`
	)
	upd := func(s string) string { return strings.ReplaceAll(s, "x.", "EXCLUDED.") }
	return queries{
		tryBegin: `WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now), r AS (
INSERT INTO ` + t + ` AS t (` + cols + `)
SELECT $1, 0, $2, $3, n.now + $4` + us + `, 1, n.now, n.now, NULL, $5, n.now + $6` + us + ` FROM n
ON CONFLICT (msg_key) DO UPDATE SET
	state        = CASE WHEN ` + upd(gone) + ` THEN 0 ELSE t.state END,
	lease_id     = CASE WHEN ` + upd(gone) + ` OR (` + upd(free) + `) THEN EXCLUDED.lease_id ELSE t.lease_id END,
	owner        = CASE WHEN ` + upd(gone) + ` OR (` + upd(free) + `) THEN EXCLUDED.owner ELSE t.owner END,
	lease_until  = CASE WHEN ` + upd(gone) + ` OR (` + upd(free) + `) OR (` + upd(mine) + `) THEN EXCLUDED.lease_until ELSE t.lease_until END,
	attempts     = CASE WHEN ` + upd(gone) + ` THEN 1 WHEN ` + upd(free) + ` THEN t.attempts + 1 ELSE t.attempts END,
	first_seen   = CASE WHEN ` + upd(gone) + ` THEN EXCLUDED.first_seen ELSE t.first_seen END,
	last_seen    = CASE WHEN ` + upd(gone) + ` OR (` + upd(free) + `) OR (` + upd(mine) + `) THEN EXCLUDED.last_seen ELSE t.last_seen END,
	processed_at = CASE WHEN ` + upd(gone) + ` THEN NULL ELSE t.processed_at END,
	payload_hash = CASE WHEN ` + upd(gone) + ` OR ((` + upd(free) + `) AND t.payload_hash = '') THEN EXCLUDED.payload_hash ELSE t.payload_hash END,
	expires_at   = CASE WHEN ` + upd(gone) + ` OR (` + upd(free) + `) OR (` + upd(mine) + `) THEN EXCLUDED.expires_at ELSE t.expires_at END
RETURNING t.state, t.lease_id, t.lease_until, t.attempts, t.payload_hash, t.last_seen)
SELECT r.state, r.lease_id, r.lease_until, r.attempts, r.payload_hash, r.last_seen, n.now FROM r, n`,

		complete: `WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now)
UPDATE ` + t + ` AS t SET
	processed_at = CASE WHEN t.state = 0 THEN n.now ELSE t.processed_at END,
	last_seen    = CASE WHEN t.state = 0 THEN n.now ELSE t.last_seen END,
	expires_at   = CASE WHEN t.state = 0 THEN n.now + $3` + us + ` ELSE t.expires_at END,
	lease_until  = NULL,
	state        = 1
FROM n WHERE t.msg_key = $1 AND t.lease_id = $2 AND t.expires_at > n.now`,

		release: `WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now)
UPDATE ` + t + ` AS t SET lease_id = '', lease_until = NULL, last_seen = n.now, expires_at = n.now + $3` + us + `
FROM n WHERE t.msg_key = $1 AND t.lease_id = $2 AND t.state = 0 AND t.expires_at > n.now`,

		extend: `WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now)
UPDATE ` + t + ` AS t SET lease_until = n.now + $3` + us + `, last_seen = n.now, expires_at = n.now + $4` + us + `
FROM n WHERE t.msg_key = $1 AND t.lease_id = $2 AND t.state = 0 AND t.expires_at > n.now
RETURNING t.lease_until`,

		get: `SELECT state, attempts, first_seen, last_seen, lease_until, owner, payload_hash, expires_at, clock_timestamp()
FROM ` + t + ` WHERE msg_key = $1`,

		markProcessed: `WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now)
INSERT INTO ` + t + ` AS t (` + cols + `)
SELECT $1, 1, '', '', NULL, 0, n.now, n.now, n.now, '', n.now + $2` + us + ` FROM n
ON CONFLICT (msg_key) DO UPDATE SET
	attempts     = CASE WHEN t.expires_at <= EXCLUDED.last_seen THEN 0 ELSE t.attempts END,
	first_seen   = CASE WHEN t.expires_at <= EXCLUDED.last_seen THEN EXCLUDED.first_seen ELSE t.first_seen END,
	owner        = CASE WHEN t.expires_at <= EXCLUDED.last_seen THEN '' ELSE t.owner END,
	payload_hash = CASE WHEN t.expires_at <= EXCLUDED.last_seen THEN '' ELSE t.payload_hash END,
	processed_at = CASE WHEN t.expires_at > EXCLUDED.last_seen AND t.state = 1 THEN t.processed_at ELSE EXCLUDED.processed_at END,
	last_seen    = EXCLUDED.last_seen,
	lease_id     = '',
	lease_until  = NULL,
	state        = 1,
	expires_at   = EXCLUDED.expires_at`,

		cleanup: `WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now)
DELETE FROM ` + t + ` AS t USING n
WHERE t.expires_at <= n.now AND t.msg_key IN (
	SELECT d.msg_key FROM ` + t + ` AS d WHERE d.expires_at <= (SELECT now FROM n)
	ORDER BY d.expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)`,
	}
}

// MySQL and MariaDB run the assignments of ON DUPLICATE KEY UPDATE (and of
// UPDATE) left to right, each seeing the columns assigned before it. The
// conditions read expires_at, state, lease_until and lease_id, so those are
// assigned last, in an order where every condition still decides as it would
// on the old row (see the comment in myQueries).
func myQueries(t string) queries {
	const (
		now  = `UTC_TIMESTAMP(6)`
		xnow = `VALUES(last_seen)`
		gone = `expires_at <= ` + xnow
		free = `state = 0 AND (lease_until IS NULL OR lease_until <= ` + xnow + `)`
		mine = `state = 0 AND lease_id = VALUES(lease_id)`
	)
	// Order of the last four assignments:
	//   lease_id    := new when gone or free. Rows that were neither keep the
	//                  old id, so "mine" still reads the old value for them;
	//                  rows that were gone or free are still seen as such by
	//                  the later conditions, which test gone/free first.
	//   lease_until := new when gone, free or mine (state, expires_at intact).
	//   state       := 0 when gone (expires_at intact).
	//   expires_at  := new when gone (old expires_at), free (lease_until was
	//                  just renewed, but lease_id = new and state = 0 make
	//                  "mine" true for those rows) or mine.
	upsert := `INSERT INTO ` + t + ` (` + cols + `)
VALUES (?, 0, ?, ?, ` + now + ` + INTERVAL ? MICROSECOND, 1, ` + now + `, ` + now + `, NULL, ?, ` + now + ` + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE
	attempts     = CASE WHEN ` + gone + ` THEN 1 WHEN ` + free + ` THEN attempts + 1 ELSE attempts END,
	first_seen   = CASE WHEN ` + gone + ` THEN VALUES(first_seen) ELSE first_seen END,
	owner        = CASE WHEN ` + gone + ` OR (` + free + `) THEN VALUES(owner) ELSE owner END,
	payload_hash = CASE WHEN ` + gone + ` OR ((` + free + `) AND payload_hash = '') THEN VALUES(payload_hash) ELSE payload_hash END,
	processed_at = CASE WHEN ` + gone + ` THEN NULL ELSE processed_at END,
	last_seen    = CASE WHEN ` + gone + ` OR (` + free + `) OR (` + mine + `) THEN ` + xnow + ` ELSE last_seen END,
	lease_id     = CASE WHEN ` + gone + ` OR (` + free + `) THEN VALUES(lease_id) ELSE lease_id END,
	lease_until  = CASE WHEN ` + gone + ` OR (` + free + `) OR (` + mine + `) THEN VALUES(lease_until) ELSE lease_until END,
	state        = CASE WHEN ` + gone + ` THEN 0 ELSE state END,
	expires_at   = CASE WHEN ` + gone + ` OR (` + free + `) OR (` + mine + `) THEN VALUES(expires_at) ELSE expires_at END`
	return queries{
		tryBegin:     upsert, // MariaDB appends returning, see Store.init
		selectLocked: `SELECT state, lease_id, lease_until, attempts, payload_hash, last_seen, ` + now + ` FROM ` + t + ` WHERE msg_key = ? FOR UPDATE`,

		// state is assigned last: the conditions before it read the old one.
		complete: `UPDATE ` + t + ` SET
	processed_at = CASE WHEN state = 0 THEN ` + now + ` ELSE processed_at END,
	last_seen    = CASE WHEN state = 0 THEN ` + now + ` ELSE last_seen END,
	expires_at   = CASE WHEN state = 0 THEN ` + now + ` + INTERVAL ? MICROSECOND ELSE expires_at END,
	lease_until  = NULL,
	state        = 1
WHERE msg_key = ? AND lease_id = ? AND expires_at > ` + now,

		release: `UPDATE ` + t + ` SET lease_id = '', lease_until = NULL, last_seen = ` + now + `, expires_at = ` + now + ` + INTERVAL ? MICROSECOND
WHERE msg_key = ? AND lease_id = ? AND state = 0 AND expires_at > ` + now,

		extend: `UPDATE ` + t + ` SET lease_until = ` + now + ` + INTERVAL ? MICROSECOND, last_seen = ` + now + `, expires_at = ` + now + ` + INTERVAL ? MICROSECOND
WHERE msg_key = ? AND lease_id = ? AND state = 0 AND expires_at > ` + now,
		selectLeaseUntil: `SELECT lease_until FROM ` + t + ` WHERE msg_key = ?`,

		get: `SELECT state, attempts, first_seen, last_seen, lease_until, owner, payload_hash, expires_at, ` + now + `
FROM ` + t + ` WHERE msg_key = ?`,

		holder: `SELECT state, lease_id, expires_at, ` + now + ` FROM ` + t + ` WHERE msg_key = ?`,

		// expires_at last: the conditions before it read the old one.
		markProcessed: `INSERT INTO ` + t + ` (` + cols + `)
VALUES (?, 1, '', '', NULL, 0, ` + now + `, ` + now + `, ` + now + `, '', ` + now + ` + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE
	attempts     = CASE WHEN expires_at <= VALUES(last_seen) THEN 0 ELSE attempts END,
	first_seen   = CASE WHEN expires_at <= VALUES(last_seen) THEN VALUES(first_seen) ELSE first_seen END,
	owner        = CASE WHEN expires_at <= VALUES(last_seen) THEN '' ELSE owner END,
	payload_hash = CASE WHEN expires_at <= VALUES(last_seen) THEN '' ELSE payload_hash END,
	processed_at = CASE WHEN expires_at > VALUES(last_seen) AND state = 1 THEN processed_at ELSE VALUES(processed_at) END,
	last_seen    = VALUES(last_seen),
	lease_id     = '',
	lease_until  = NULL,
	state        = 1,
	expires_at   = VALUES(expires_at)`,

		cleanup: `DELETE FROM ` + t + ` WHERE expires_at <= ` + now + ` ORDER BY expires_at LIMIT ?`,
	}
}

// liteNow is SQLite's clock in integer microseconds since the Unix epoch.
// julianday('now') has millisecond resolution; rounding to whole
// milliseconds removes the floating-point noise of the conversion.
const liteNow = `(CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)`

func liteQueries(t string) queries {
	const (
		gone = `expires_at <= excluded.last_seen`
		free = `state = 0 AND (lease_until IS NULL OR lease_until <= excluded.last_seen)`
		mine = `state = 0 AND lease_id = excluded.lease_id`
		now  = liteNow
	)
	// SQLite, like PostgreSQL, evaluates every assignment on the old row.
	return queries{
		tryBegin: `INSERT INTO ` + t + ` (` + cols + `)
VALUES (?1, 0, ?2, ?3, ` + now + ` + ?4, 1, ` + now + `, ` + now + `, NULL, ?5, ` + now + ` + ?6)
ON CONFLICT (msg_key) DO UPDATE SET
	state        = CASE WHEN ` + gone + ` THEN 0 ELSE state END,
	lease_id     = CASE WHEN ` + gone + ` OR (` + free + `) THEN excluded.lease_id ELSE lease_id END,
	owner        = CASE WHEN ` + gone + ` OR (` + free + `) THEN excluded.owner ELSE owner END,
	lease_until  = CASE WHEN ` + gone + ` OR (` + free + `) OR (` + mine + `) THEN excluded.lease_until ELSE lease_until END,
	attempts     = CASE WHEN ` + gone + ` THEN 1 WHEN ` + free + ` THEN attempts + 1 ELSE attempts END,
	first_seen   = CASE WHEN ` + gone + ` THEN excluded.first_seen ELSE first_seen END,
	last_seen    = CASE WHEN ` + gone + ` OR (` + free + `) OR (` + mine + `) THEN excluded.last_seen ELSE last_seen END,
	processed_at = CASE WHEN ` + gone + ` THEN NULL ELSE processed_at END,
	payload_hash = CASE WHEN ` + gone + ` OR ((` + free + `) AND payload_hash = '') THEN excluded.payload_hash ELSE payload_hash END,
	expires_at   = CASE WHEN ` + gone + ` OR (` + free + `) OR (` + mine + `) THEN excluded.expires_at ELSE expires_at END
RETURNING state, lease_id, lease_until, attempts, payload_hash, last_seen, ` + now,

		complete: `UPDATE ` + t + ` SET
	processed_at = CASE WHEN state = 0 THEN ` + now + ` ELSE processed_at END,
	last_seen    = CASE WHEN state = 0 THEN ` + now + ` ELSE last_seen END,
	expires_at   = CASE WHEN state = 0 THEN ` + now + ` + ?3 ELSE expires_at END,
	lease_until  = NULL,
	state        = 1
WHERE msg_key = ?1 AND lease_id = ?2 AND expires_at > ` + now,

		release: `UPDATE ` + t + ` SET lease_id = '', lease_until = NULL, last_seen = ` + now + `, expires_at = ` + now + ` + ?3
WHERE msg_key = ?1 AND lease_id = ?2 AND state = 0 AND expires_at > ` + now,

		extend: `UPDATE ` + t + ` SET lease_until = ` + now + ` + ?3, last_seen = ` + now + `, expires_at = ` + now + ` + ?4
WHERE msg_key = ?1 AND lease_id = ?2 AND state = 0 AND expires_at > ` + now + `
RETURNING lease_until`,

		get: `SELECT state, attempts, first_seen, last_seen, lease_until, owner, payload_hash, expires_at, ` + now + `
FROM ` + t + ` WHERE msg_key = ?1`,

		markProcessed: `INSERT INTO ` + t + ` (` + cols + `)
VALUES (?1, 1, '', '', NULL, 0, ` + now + `, ` + now + `, ` + now + `, '', ` + now + ` + ?2)
ON CONFLICT (msg_key) DO UPDATE SET
	attempts     = CASE WHEN expires_at <= excluded.last_seen THEN 0 ELSE attempts END,
	first_seen   = CASE WHEN expires_at <= excluded.last_seen THEN excluded.first_seen ELSE first_seen END,
	owner        = CASE WHEN expires_at <= excluded.last_seen THEN '' ELSE owner END,
	payload_hash = CASE WHEN expires_at <= excluded.last_seen THEN '' ELSE payload_hash END,
	processed_at = CASE WHEN expires_at > excluded.last_seen AND state = 1 THEN processed_at ELSE excluded.processed_at END,
	last_seen    = excluded.last_seen,
	lease_id     = '',
	lease_until  = NULL,
	state        = 1,
	expires_at   = excluded.expires_at`,

		cleanup: `DELETE FROM ` + t + ` WHERE expires_at <= ` + now + ` AND msg_key IN (
	SELECT msg_key FROM ` + t + ` WHERE expires_at <= ` + now + ` ORDER BY expires_at LIMIT ?1)`,
	}
}
