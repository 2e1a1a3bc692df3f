package sqlstore

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
)

// recordRow is a row of recordCols and the clock, as Get and List read it.
type recordRow struct {
	state, attempts                            int
	owner, reason                              sql.NullString
	hash, lease                                []byte
	first, last, until, expires, now           time.Time
	firstOK, lastOK, untilOK, expiresOK, nowOK bool
}

// recordDests returns the scan destinations of r's columns.
func (d *sqlDriver) recordDests(r *recordRow) []any {
	return []any{&r.state, &r.attempts, d.timeDest(&r.first, &r.firstOK), d.timeDest(&r.last, &r.lastOK),
		d.timeDest(&r.until, &r.untilOK), &r.owner, &r.hash, d.timeDest(&r.expires, &r.expiresOK), &r.reason,
		&r.lease, d.timeDest(&r.now, &r.nowOK)}
}

// record returns what Get says of the row, or false when it has expired
// (logically gone, awaiting cleanup).
func (r *recordRow) record() (inbox.Record, bool) {
	if !r.expires.After(r.now) {
		return inbox.Record{}, false
	}
	rec := inbox.Record{Attempts: r.attempts, FirstSeen: r.first, LastSeen: r.last, Owner: r.owner.String, PayloadHash: decodeHash(r.hash), Reason: r.reason.String}
	switch {
	case r.state == stateProcessed:
		rec.State = inbox.StateProcessed
	case r.state == stateDead:
		rec.State = inbox.StateDead
	case r.untilOK && r.until.After(r.now) && r.lease != nil:
		rec.State = inbox.StateInProgress
		rec.LeaseUntil = r.until
	default:
		rec.State = inbox.StateAvailable
		if r.untilOK && r.until.After(r.now) {
			// A failed attempt's backoff: a lease nobody holds.
			rec.RetryAt = r.until
		}
	}
	return rec, true
}

// List implements [driver.Driver]: one SELECT in key order from the key
// after the cursor (the last key of the previous page), the prefix as a
// range of the primary key, the state and age as conditions on the
// database clock; it reads one row more than the page to know whether
// another page follows.
func (d *sqlDriver) List(ctx context.Context, opts inbox.ListOptions) (inbox.ListPage, error) {
	if err := d.prepare(ctx); err != nil {
		return inbox.ListPage{}, err
	}
	query, args := d.listQuery(opts)
	rows, err := d.db.QueryContext(ctx, query, args...)
	if err != nil {
		return inbox.ListPage{}, d.fault(err)
	}
	defer rows.Close()
	var p inbox.ListPage
	for rows.Next() {
		var (
			key string
			r   recordRow
		)
		if err := rows.Scan(append([]any{&key}, d.recordDests(&r)...)...); err != nil {
			return inbox.ListPage{}, d.fault(err)
		}
		if rec, ok := r.record(); ok {
			p.Items = append(p.Items, inbox.ListItem{Key: key, Record: rec})
		}
	}
	if err := rows.Err(); err != nil {
		return inbox.ListPage{}, d.fault(err)
	}
	if len(p.Items) > opts.Limit {
		p.Items = p.Items[:opts.Limit]
		p.Next = p.Items[opts.Limit-1].Key
	}
	return p, nil
}

// listQuery is the statement of List and its parameters.
func (d *sqlDriver) listQuery(opts inbox.ListOptions) (string, []any) {
	var (
		args  []any
		conds []string
	)
	param := func(v any) string {
		args = append(args, v)
		if d.opts.Dialect == Postgres {
			return "$" + strconv.Itoa(len(args))
		}
		return "?"
	}
	col := func(c string) string {
		if d.opts.Dialect == Postgres {
			return "t." + c
		}
		return c
	}
	var now, from, cols string
	switch d.opts.Dialect {
	case Postgres:
		now, from, cols = "n.now", d.q.t+" AS t, n", "t.msg_key, "+pgCols("t", recordCols)
	case MySQL:
		now, from, cols = "UTC_TIMESTAMP(6)", d.q.t, "msg_key, "+recordCols
	default:
		now, from, cols = liteNow, d.q.t, "msg_key, "+recordCols
	}
	conds = append(conds, col("expires_at")+" > "+now)
	// The prefix is a range of the primary key (keys hold % and _, which
	// LIKE would read as patterns); the cursor raises its start.
	switch {
	case opts.Cursor != "" && opts.Cursor >= opts.Prefix:
		conds = append(conds, col("msg_key")+" > "+param(opts.Cursor))
	case opts.Prefix != "":
		conds = append(conds, col("msg_key")+" >= "+param(opts.Prefix))
	}
	if end, ok := driver.PrefixEnd(opts.Prefix); ok {
		conds = append(conds, col("msg_key")+" < "+param(end))
	}
	switch opts.State {
	case inbox.StateProcessed:
		conds = append(conds, col("state")+" = 1")
	case inbox.StateDead:
		conds = append(conds, col("state")+" = 2")
	case inbox.StateInProgress:
		conds = append(conds, col("state")+" = 0 AND "+col("lease_until")+" > "+now+" AND "+col("lease")+" IS NOT NULL")
	case inbox.StateAvailable: // a backoff is a lease nobody holds
		conds = append(conds, col("state")+" = 0 AND ("+col("lease_until")+" IS NULL OR "+col("lease_until")+" <= "+now+" OR "+col("lease")+" IS NULL)")
	}
	if opts.OlderThan > 0 {
		var age string
		switch d.opts.Dialect {
		case Postgres:
			age = now + " - " + param(us(opts.OlderThan)) + "::bigint" + pgUS
		case MySQL:
			age = now + " - INTERVAL " + param(us(opts.OlderThan)) + " MICROSECOND"
		default:
			age = now + " - " + param(us(opts.OlderThan))
		}
		conds = append(conds, col("last_seen")+" <= "+age)
	}
	query := "SELECT " + cols + ", " + now + " FROM " + from + "\nWHERE " + strings.Join(conds, " AND ") +
		"\nORDER BY " + col("msg_key") + " LIMIT " + param(opts.Limit+1)
	if d.opts.Dialect == Postgres {
		query = "WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now)\n" + query
	}
	return query, args
}

// Forget implements [driver.Driver]: a DELETE of the key's row.
func (d *sqlDriver) Forget(ctx context.Context, key string) error {
	if err := d.prepare(ctx); err != nil {
		return err
	}
	if _, err := d.exec(ctx, d.q.forget, key); err != nil {
		return d.fault(err)
	}
	return nil
}

// ForceRelease implements [driver.Driver]: an UPDATE, fenced by no lease
// id, of an open row whose lease is live or whose backoff runs (a lease
// nobody holds): it ends now (lease id cleared, attempts kept), and the
// row lives for the retention from now.
func (d *sqlDriver) ForceRelease(ctx context.Context, key string) error {
	if err := d.prepare(ctx); err != nil {
		return err
	}
	if _, err := d.exec(ctx, d.q.forceRelease, us(d.opts.Retention), key); err != nil {
		return d.fault(err)
	}
	return nil
}
