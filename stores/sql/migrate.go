package sqlstore

import (
	"context"
	"database/sql"
	"hash/fnv"
	"strings"

	"github.com/watermill-inbox/inbox/stores/sql/internal/dialect"
)

// The upgrade of a table of an earlier layout (the columns cols, with
// lease_id and processed_at) to the compact one: Migrate, after adding the
// column reason to a table of the earliest layout, creates a table of the
// compact layout beside it (the table's name and "_upgrade"), copies every
// row into it in its compact form, and puts it in the old one's place. A
// processed row keeps of its lease id only the fingerprint, of its payload
// hash the compact form (see layout.go), and no owner; empty strings become
// NULL. On PostgreSQL and SQLite it is one transaction (PostgreSQL's holds
// the advisory lock of Migrate, and an exclusive lock on the table); on
// MySQL and MariaDB the copy and the rename of the tables are statements of
// their own, so consumers of the earlier release must be stopped while it
// runs (rows they write after the copy would be lost).

// compactProbe is the column a table of the compact layout has and one of
// an earlier layout has not.
const compactProbe = "lease"

// upgradeName is the name of the compact table an upgrade fills.
func upgradeName(table string) string { return table + "_upgrade" }

// earlierTable reports whether the table has an earlier layout: it lacks
// the compact layout's columns and has those of the earlier one.
func (d *sqlDriver) earlierTable(ctx context.Context) (bool, error) {
	err := d.probe(ctx, compactProbe)
	if err == nil {
		return false, nil
	}
	if classify(err) != dialect.NoColumn {
		return false, err
	}
	if d.probe(ctx, cols) != nil {
		return false, nil
	}
	return true, nil
}

// upgradeSelect is the SELECT of an earlier table's rows in the compact
// layout's form: insertCols, then reason.
func upgradeSelect(d Dialect, t string) string {
	var lease, hash string
	switch d {
	case Postgres:
		lease = `CASE WHEN lease_id = '' OR state = 2 THEN NULL WHEN state = 1 THEN substr(sha256(convert_to(lease_id, 'UTF8')), 1, 8) ELSE convert_to(lease_id, 'UTF8') END`
		hash = `CASE WHEN payload_hash = '' THEN NULL WHEN payload_hash ~ '^[0-9a-f]{64}$' THEN decode(substr(payload_hash, 1, 32), 'hex')
	WHEN octet_length(payload_hash) = 16 THEN convert_to(payload_hash, 'UTF8') || '\x00'::bytea ELSE convert_to(payload_hash, 'UTF8') END`
	case MySQL:
		lease = `CASE WHEN lease_id = '' OR state = 2 THEN NULL WHEN state = 1 THEN UNHEX(LEFT(SHA2(lease_id, 256), 16)) ELSE lease_id END`
		hash = `CASE WHEN payload_hash = '' THEN NULL WHEN LENGTH(payload_hash) = 64 AND CONVERT(payload_hash USING latin1) COLLATE latin1_bin REGEXP '^[0-9a-f]{64}$' THEN UNHEX(LEFT(payload_hash, 32))
	WHEN LENGTH(payload_hash) = 16 THEN CONCAT(payload_hash, X'00') ELSE payload_hash END`
	default:
		// No SHA-256: a processed row's lease id is copied, and replaced
		// by its fingerprint afterwards (upgradeFingerprints).
		lease = `CASE WHEN lease_id = '' OR state = 2 THEN NULL ELSE CAST(lease_id AS BLOB) END`
		hash = `CASE WHEN payload_hash = '' THEN NULL WHEN length(CAST(payload_hash AS BLOB)) = 64 AND payload_hash NOT GLOB '*[^0-9a-f]*' THEN unhex(substr(payload_hash, 1, 32))
	WHEN length(CAST(payload_hash AS BLOB)) = 16 THEN unhex(hex(payload_hash) || '00') ELSE CAST(payload_hash AS BLOB) END`
	}
	return `SELECT msg_key, state,
	` + lease + `,
	CASE WHEN state <> 1 THEN NULLIF(owner, '') END, lease_until, attempts, first_seen, last_seen,
	` + hash + `,
	expires_at, NULLIF(reason, '')
FROM ` + t
}

// upgradeStmts are the statements of an upgrade, in order, but SQLite's
// fingerprints (liteFPRead, liteFPWrite), which follow the copy.
func upgradeStmts(d Dialect, table string) []string {
	n, u := quoteIdent(d, table), quoteIdent(d, upgradeName(table))
	base := n.bare
	create := strings.Replace(ddl(d, table)[0], n.table, u.table, 1)
	copyRows := `INSERT INTO ` + u.table + ` (` + insertCols + `, reason)
` + upgradeSelect(d, n.table)
	switch d {
	case Postgres:
		return []string{
			`LOCK TABLE ` + n.table + ` IN ACCESS EXCLUSIVE MODE`,
			create,
			copyRows,
			`DROP TABLE ` + n.table,
			`ALTER TABLE ` + u.table + ` RENAME TO ` + base,
			`ALTER TABLE ` + n.table + ` RENAME CONSTRAINT ` + strings.TrimSuffix(u.bare, `"`) + `_pkey" TO ` + strings.TrimSuffix(base, `"`) + `_pkey"`,
			ddl(d, table)[1],
		}
	case MySQL:
		old := quoteIdent(d, table+"_earlier").table
		return []string{
			`DROP TABLE IF EXISTS ` + u.table,
			create,
			copyRows,
			`RENAME TABLE ` + n.table + ` TO ` + old + `, ` + u.table + ` TO ` + n.table,
			`DROP TABLE ` + old,
		}
	}
	return []string{
		`DROP TABLE IF EXISTS ` + u.table,
		create,
		copyRows,
		`DROP TABLE ` + n.table,
		`ALTER TABLE ` + u.table + ` RENAME TO ` + base,
		ddl(d, table)[1],
	}
}

// pgHasLeaseID is PostgreSQL's check, under Migrate's advisory lock, that
// the table ($1, quoted) still has the earlier layout: a concurrent
// migration may have upgraded it since earlierTable looked.
const pgHasLeaseID = `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'lease_id' AND NOT attisdropped)`

// SQLite's fingerprints of the processed rows of an upgrade: the read of
// their lease ids, and the write of each one's fingerprint.
func liteFPRead(table string) string {
	return `SELECT msg_key, lease FROM ` + quoteIdent(SQLite, upgradeName(table)).table + ` WHERE state = 1 AND lease IS NOT NULL`
}

func liteFPWrite(table string) string {
	return `UPDATE ` + quoteIdent(SQLite, upgradeName(table)).table + ` SET lease = ?1 WHERE msg_key = ?2`
}

// upgradeLayout upgrades a table of an earlier layout to the compact one
// (see above); on a table of the compact layout it does nothing.
func (d *sqlDriver) upgradeLayout(ctx context.Context) error {
	earlier, err := d.earlierTable(ctx)
	if err != nil || !earlier {
		return err
	}
	dl, table := d.opts.Dialect, d.opts.Table
	stmts := upgradeStmts(dl, table)
	switch dl {
	case Postgres:
		h := fnv.New64a()
		_, _ = h.Write([]byte("watermill-inbox:" + table))
		return d.inTx(ctx, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, pgAdvisoryLock, int64(h.Sum64())); err != nil {
				return err
			}
			var still bool
			if err := tx.QueryRowContext(ctx, pgHasLeaseID, quoteIdent(dl, table).table).Scan(&still); err != nil || !still {
				return err
			}
			return execAll(ctx, tx, stmts)
		})
	case MySQL:
		return execAll(ctx, d.db, stmts)
	}
	return d.inTx(ctx, func(tx *sql.Tx) error {
		if err := execAll(ctx, tx, stmts[:3]); err != nil {
			return err
		}
		if err := liteFingerprints(ctx, tx, table); err != nil {
			return err
		}
		return execAll(ctx, tx, stmts[3:])
	})
}

// liteFingerprints replaces the lease ids of the processed rows of an
// upgrade's table by their fingerprints.
func liteFingerprints(ctx context.Context, tx *sql.Tx, table string) error {
	rows, err := tx.QueryContext(ctx, liteFPRead(table))
	if err != nil {
		return err
	}
	type row struct {
		key   string
		lease []byte
	}
	var rs []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.key, &r.lease); err != nil {
			_ = rows.Close()
			return err
		}
		rs = append(rs, r)
	}
	if err := rows.Close(); err != nil {
		return err
	}
	for _, r := range rs {
		if _, err := tx.ExecContext(ctx, liteFPWrite(table), leaseFP(string(r.lease)), r.key); err != nil {
			return err
		}
	}
	return nil
}

func execAll(ctx context.Context, q querier, stmts []string) error {
	for _, s := range stmts {
		if _, err := q.ExecContext(ctx, s); err != nil {
			return err
		}
	}
	return nil
}
