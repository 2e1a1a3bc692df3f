package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
	"github.com/watermill-inbox/inbox/stores/sql/internal/dialect"
)

// The order of order keys ([inbox.BeginOptions.OrderKey]), on PostgreSQL
// only. A second table, the store's table name and "_order" (orderTable),
// holds a row per order key that has a gate: its head (the key the others
// wait behind) and the keys waiting behind it, in their order, until
// expires_at (the retention plus the default lease after its last change;
// reads ignore an expired gate, and the next write replaces it; cleanup
// deletes it after the expired records, see cleanupGates).
//
// A batch's Claims with an order key first read which of their order keys
// have a live gate (ungated): the others, most of them, run as Claims
// without an order key. The other ops that carry an order key (a Claim
// whose order key has a gate, a Fail with Op.Failure.OrderKey) leave the
// batch's waves: each is a short
// transaction of its own that takes a transaction-scoped advisory lock of
// its order key (so that the ops of one order key take turns, with or
// without a gate row to lock), reads the gate and the records of its keys,
// moves the gate past the heads that are processed, and either answers
// Behind or runs the statement of the same op without an order key in the
// same transaction. The ops without one keep the waves and their
// statements; a batch that mixes both runs its ops in slice order, the
// runs of ops without an order key as batches of their own.

// orderTable is the name of the gate table of table.
func orderTable(table string) string { return table + "_order" }

// pgOrderDDL is the statement that creates the gate table t (quoted).
func pgOrderDDL(t string) string {
	return `CREATE TABLE IF NOT EXISTS ` + t + ` (
	expires_at TIMESTAMPTZ NOT NULL,
	order_key  TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	head       TEXT COLLATE "C" NOT NULL,
	waiting    TEXT[] NOT NULL
)`
}

// orderQueries are the statements of the order of order keys.
type orderQueries struct {
	// table is the quoted gate table.
	table string
	// get(orderKey) returns the live gate's head and its waiting keys
	// (as a JSON array).
	get string
	// live(orderKeys) returns those of the order keys (a text array
	// literal) that have a live gate.
	live string
	// records(keys) returns, per live record of the keys (a text array
	// literal): msg_key, state, attempts, payload_hash, and the
	// microseconds left of a failed attempt's backoff (0 when none runs).
	records string
	// put(orderKey, head, waiting, lifeUS) writes the gate, alive for
	// lifeUS from now; del(orderKey) removes it.
	put, del string
	// cleanup(limit) deletes at most limit expired gates (the janitor's
	// and Store.Cleanup's, after the records).
	cleanup string
}

func pgOrderQueries(t, g string) orderQueries {
	return orderQueries{
		table: g,
		get: `SELECT head, to_json(waiting)::text FROM ` + g + `
WHERE order_key = $1 AND expires_at > clock_timestamp()`,
		live: `SELECT order_key FROM ` + g + `
WHERE order_key = ANY($1::text::text[]) AND expires_at > clock_timestamp()`,
		records: `WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now)
SELECT t.msg_key, t.state::int, t.attempts, t.payload_hash,
	CASE WHEN t.state = 0 AND t.lease IS NULL AND t.lease_until > n.now
		THEN ceil(extract(epoch FROM t.lease_until - n.now) * 1000000)::bigint ELSE 0 END
FROM n, ` + t + ` AS t WHERE t.msg_key = ANY($1::text::text[]) AND t.expires_at > n.now`,
		put: `INSERT INTO ` + g + ` AS g (order_key, head, waiting, expires_at)
SELECT $1, $2, $3::text::text[], clock_timestamp() + $4::bigint` + pgUS + `
ON CONFLICT (order_key) DO UPDATE SET head = EXCLUDED.head, waiting = EXCLUDED.waiting, expires_at = EXCLUDED.expires_at`,
		del: `DELETE FROM ` + g + ` WHERE order_key = $1`,
		cleanup: `WITH n AS MATERIALIZED (SELECT clock_timestamp() AS now)
DELETE FROM ` + g + ` AS g USING n
WHERE g.expires_at <= n.now AND g.order_key = ANY(ARRAY(
	SELECT d.order_key FROM ` + g + ` AS d WHERE d.expires_at <= (SELECT now FROM n)
	LIMIT $1 FOR UPDATE SKIP LOCKED))`,
	}
}

// ordered reports whether op carries an order key.
func ordered(op driver.Op) bool {
	return op.Kind == driver.Claim && op.OrderKey != "" || op.Kind == driver.Fail && op.Failure.OrderKey != ""
}

// applyPGOrdered applies ops, some of which carry an order key, in slice
// order: each run of ops without one as a batch (applyPGPlain), each op
// with one alone (applyOrdered). A Claim whose order key has no live gate
// (most of them: a gate lives from a failure to the processing of the
// keys behind it) joins the batches as a Claim without one (ungated).
func (d *sqlDriver) applyPGOrdered(ctx context.Context, ops []driver.Op, res []inbox.Claim, errs []error) error {
	ops, err := d.ungated(ctx, ops)
	if err != nil {
		return err
	}
	start := 0
	for i, op := range ops {
		if !ordered(op) {
			continue
		}
		if start < i {
			if err := d.applyPGPlain(ctx, ops[start:i], res[start:i], errs[start:i]); err != nil {
				return err
			}
		}
		if err := d.applyOrdered(ctx, op, &res[i], &errs[i]); err != nil {
			return err
		}
		start = i + 1
	}
	if start < len(ops) {
		return d.applyPGPlain(ctx, ops[start:], res[start:], errs[start:])
	}
	return nil
}

// ungated returns ops with the order key of each Claim taken away when its
// order key has no live gate, read in one statement, and no Fail of the
// batch before it carries that order key (the Fail may open the gate).
// A gate that another consumer opens between this read and the claim is
// a Fail that came after the claim: the claim would have been Acquired in
// the order key's own transaction too. Without a gate table the ops are
// returned as they are: each fails alone in applyOrdered, saying so.
func (d *sqlDriver) ungated(ctx context.Context, ops []driver.Op) ([]driver.Op, error) {
	var keys []string
	for _, op := range ops {
		if op.Kind == driver.Claim && op.OrderKey != "" {
			keys = append(keys, op.OrderKey)
		}
	}
	if len(keys) == 0 {
		return ops, nil
	}
	gated := map[string]bool{}
	rows, err := d.db.QueryContext(ctx, d.q.order.live, pgTextArray(keys))
	if err != nil {
		if classify(err) == dialect.NoTable {
			return ops, nil
		}
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		gated[k] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	ops = slices.Clone(ops)
	for i, op := range ops {
		switch {
		case op.Kind == driver.Fail && op.Failure.OrderKey != "":
			gated[op.Failure.OrderKey] = true
		case op.Kind == driver.Claim && op.OrderKey != "" && !gated[op.OrderKey]:
			ops[i].OrderKey = ""
		}
	}
	return ops, nil
}

// applyOrdered applies op, a Claim or Fail with an order key, in a
// transaction of its own. A missing gate table fails op alone, with an
// error that says how to create it; other errors of the database fail the
// batch.
func (d *sqlDriver) applyOrdered(ctx context.Context, op driver.Op, res *inbox.Claim, errp *error) error {
	orderKey := op.OrderKey
	if op.Kind == driver.Fail {
		orderKey = op.Failure.OrderKey
	}
	err := d.inOrder(ctx, orderKey, func(tx *sql.Tx) error {
		if op.Kind == driver.Claim {
			return d.orderClaim(ctx, tx, op, res, errp)
		}
		return d.orderFail(ctx, tx, op, res, errp)
	})
	if err != nil {
		if oerr := d.orderFault(err); oerr != err {
			*res, *errp = inbox.Claim{}, oerr
			return nil
		}
		return err
	}
	return nil
}

// orderFault says how to create a missing gate table; other errors are
// returned as they are.
func (d *sqlDriver) orderFault(err error) error {
	if classify(err) == dialect.NoTable {
		return fmt.Errorf("%w: order keys need the table %s, which does not exist: run Store.Migrate, set Options.AutoMigrate (migrate=true in a URL) or apply sqlstore.DDL: %w",
			inbox.ErrStoreUnavailable, orderTable(d.opts.Table), err)
	}
	return err
}

// orderError is the error of Order and ReleaseOrder for err, an error of
// the database.
func (d *sqlDriver) orderError(err error) error {
	if oerr := d.orderFault(err); oerr != err {
		return oerr
	}
	return d.fault(err)
}

// inOrder runs f in a transaction that holds the advisory lock of
// orderKey, run again whole when it deadlocks.
func (d *sqlDriver) inOrder(ctx context.Context, orderKey string, f func(tx *sql.Tx) error) error {
	h := fnv.New64a()
	_, _ = h.Write([]byte("watermill-inbox-order:" + d.opts.Table + "\x00" + orderKey))
	lock := int64(h.Sum64())
	return retryDeadlocks(ctx, func() error {
		return d.inTx(ctx, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, pgAdvisoryLock, lock); err != nil {
				return err
			}
			return f(tx)
		})
	})
}

// orderRecord is what the gate's decisions read of a key's live record.
type orderRecord struct {
	state, attempts int
	hash            []byte
	backoff         time.Duration // left of a failed attempt's backoff
}

// gate is an order key's gate as read: keys[0] is the head, the others
// wait behind it; no keys, no gate.
type gate struct {
	orderKey string
	keys     []string
	recs     map[string]orderRecord // the live records of keys and of the op's key
}

// readGate reads orderKey's live gate and the live records of its keys
// and of key (when not empty), in tx.
func (d *sqlDriver) readGate(ctx context.Context, tx *sql.Tx, orderKey, key string) (*gate, error) {
	g := &gate{orderKey: orderKey, recs: map[string]orderRecord{}}
	var (
		head, waiting string
	)
	err := tx.QueryRowContext(ctx, d.q.order.get, orderKey).Scan(&head, &waiting)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return nil, err
	default:
		var w []string
		if err := json.Unmarshal([]byte(waiting), &w); err != nil {
			return nil, fmt.Errorf("reading the waiting keys of order key %q: %w", orderKey, err)
		}
		g.keys = append([]string{head}, w...)
	}
	keys := g.keys
	if key != "" {
		keys = append(slices.Clip(keys), key)
	}
	if len(keys) == 0 {
		return g, nil
	}
	rows, err := tx.QueryContext(ctx, d.q.order.records, pgTextArray(keys))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			k       string
			r       orderRecord
			backoff int64
		)
		if err := rows.Scan(&k, &r.state, &r.attempts, &r.hash, &backoff); err != nil {
			return nil, err
		}
		r.backoff = time.Duration(backoff) * time.Microsecond
		g.recs[k] = r
	}
	return g, rows.Err()
}

// advance moves g past the heads whose records are processed, and reports
// whether it moved.
func (g *gate) advance() bool {
	n := 0
	for n < len(g.keys) && g.recs[g.keys[n]].state == stateProcessed { // a key without a live record is not processed
		n++
	}
	g.keys = g.keys[n:]
	return n > 0
}

// writeGate stores g: removed when no key is left, else alive for the
// retention plus the default lease from now.
func (d *sqlDriver) writeGate(ctx context.Context, tx *sql.Tx, g *gate) error {
	var err error
	if len(g.keys) == 0 {
		_, err = tx.ExecContext(ctx, d.q.order.del, g.orderKey)
	} else {
		_, err = tx.ExecContext(ctx, d.q.order.put, g.orderKey, g.keys[0], pgTextArray(g.keys[1:]), us(d.opts.Retention+d.opts.Lease))
	}
	return err
}

// orderClaim is a Claim with an order key, in tx: Behind, the key queued
// once, while another key heads the order key; else the claim without an
// order key.
func (d *sqlDriver) orderClaim(ctx context.Context, tx *sql.Tx, op driver.Op, res *inbox.Claim, errp *error) error {
	g, err := d.readGate(ctx, tx, op.OrderKey, op.Key)
	if err != nil {
		return err
	}
	own, has := g.recs[op.Key]
	if has && (own.state == stateProcessed || own.state == stateDead) {
		return d.claimIn(ctx, tx, op, res, errp)
	}
	changed := g.advance()
	if len(g.keys) == 0 || g.keys[0] == op.Key {
		if changed {
			if err := d.writeGate(ctx, tx, g); err != nil {
				return err
			}
		}
		return d.claimIn(ctx, tx, op, res, errp)
	}
	if !slices.Contains(g.keys, op.Key) {
		g.keys = append(g.keys, op.Key)
		changed = true
	}
	if changed {
		if err := d.writeGate(ctx, tx, g); err != nil {
			return err
		}
	}
	c := inbox.Claim{Status: inbox.Behind}
	if has {
		c.Attempts, c.PayloadMismatch = own.attempts, hashMismatch(op.PayloadHash, own.hash)
	}
	if h, ok := g.recs[g.keys[0]]; ok {
		c.RetryAfter = h.backoff
	}
	*res, *errp = c, nil
	return nil
}

// claimIn runs op's claim statement (claimOne) in tx.
func (d *sqlDriver) claimIn(ctx context.Context, tx *sql.Tx, op driver.Op, res *inbox.Claim, errp *error) error {
	ops := []driver.Op{op}
	rs, es := make([]inbox.Claim, 1), make([]error, 1)
	w := &wave{ops: ops, at: map[string]int{op.Key: 0}}
	w.kinds[driver.Claim] = []int{0}
	args := []any{op.Key, leaseBytes(op.LeaseID), op.Owner, us(op.Lease), encodeHash(op.PayloadHash), us(op.Lease) + us(d.opts.Retention)}
	if err := d.claimRows(ctx, tx, nil, d.q.claimOne, args, w, rs, es); err != nil {
		return err
	}
	*res, *errp = rs[0], es[0]
	return nil
}

// orderFail is a Fail with an order key, in tx: the Fail, then, when it
// held the key, the key heads the order key if nothing does.
func (d *sqlDriver) orderFail(ctx context.Context, tx *sql.Tx, op driver.Op, res *inbox.Claim, errp *error) error {
	if err := d.settleOne(ctx, tx.ExecContext, op, res, errp); err != nil || *errp != nil {
		return err
	}
	g, err := d.readGate(ctx, tx, op.Failure.OrderKey, "")
	if err != nil {
		return err
	}
	changed := g.advance()
	switch {
	case len(g.keys) == 0:
		g.keys, changed = []string{op.Key}, true
	case g.keys[0] == op.Key:
		changed = true // touched: it lives on from now
	}
	if changed {
		return d.writeGate(ctx, tx, g)
	}
	return nil
}

// Order implements [driver.Orderer].
func (d *sqlDriver) Order(ctx context.Context, orderKey string) (inbox.OrderGate, error) {
	var og inbox.OrderGate
	err := d.inOrder(ctx, orderKey, func(tx *sql.Tx) error {
		og = inbox.OrderGate{}
		g, err := d.readGate(ctx, tx, orderKey, "")
		if err != nil {
			return err
		}
		if g.advance() {
			if err := d.writeGate(ctx, tx, g); err != nil {
				return err
			}
		}
		if len(g.keys) > 0 {
			og.Head = g.keys[0]
			if len(g.keys) > 1 {
				og.Waiting = slices.Clone(g.keys[1:])
			}
		}
		return nil
	})
	if err != nil {
		return inbox.OrderGate{}, d.orderError(err)
	}
	return og, nil
}

// errNotHead is ReleaseOrder's answer when head does not head the order
// key.
var errNotHead = errors.New("not the head")

// ReleaseOrder implements [driver.Orderer].
func (d *sqlDriver) ReleaseOrder(ctx context.Context, orderKey, head string) error {
	var current string
	err := d.inOrder(ctx, orderKey, func(tx *sql.Tx) error {
		g, err := d.readGate(ctx, tx, orderKey, "")
		if err != nil {
			return err
		}
		g.advance() // written below, or rolled back with errNotHead: either way the reads agree
		current = ""
		if len(g.keys) > 0 {
			current = g.keys[0]
		}
		if current != head {
			return errNotHead
		}
		g.keys = g.keys[1:]
		return d.writeGate(ctx, tx, g)
	})
	switch {
	case errors.Is(err, errNotHead) && current == "":
		return fmt.Errorf("%w: no key of the order key waits on %q", inbox.ErrLeaseLost, head)
	case errors.Is(err, errNotHead):
		return fmt.Errorf("%w: the head of the order key is %q, not %q", inbox.ErrLeaseLost, current, head)
	case err != nil:
		return d.orderError(err)
	}
	return nil
}

// pgTextArray is a PostgreSQL text array literal of keys.
func pgTextArray(keys []string) string {
	idx := make([]int, len(keys))
	for i := range idx {
		idx[i] = i
	}
	return pgArray(idx, func(i int) string { return pgQuote(keys[i]) })
}
