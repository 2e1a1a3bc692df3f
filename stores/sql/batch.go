package sqlstore

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
)

// batchBounds are the batching bounds of a dialect (see "Batching" in the
// package documentation), chosen by measurement (BenchmarkBatchBounds):
// on the servers, more batches in flight make them smaller, and the
// statements more numerous, without more throughput; SQLite has one
// writer, so a second batch in flight would only wait for the pool's
// connection.
func batchBounds(d Dialect) driver.Batch {
	if d == SQLite {
		return driver.Batch{MaxBatch: 64, MaxInFlight: 1}
	}
	return driver.Batch{MaxBatch: 64, MaxInFlight: 2}
}

// Apply implements [driver.Driver]. The batch is split into waves in which
// each key appears once ([driver.Waves]), applied in turn; a wave is one
// statement per kind of operation (one statement in all on PostgreSQL;
// on SQLite one per Fail).
// Errors of the database fail the batch.
func (d *sqlDriver) Apply(ctx context.Context, ops []driver.Op, res []inbox.Claim, errs []error) error {
	if err := d.prepare(ctx); err != nil {
		return err
	}
	var err error
	switch d.opts.Dialect {
	case Postgres:
		err = d.applyPG(ctx, ops, res, errs)
	case MySQL:
		err = d.applyMy(ctx, ops, res, errs)
	default:
		err = d.applyLite(ctx, ops, res, errs)
	}
	if err != nil {
		return d.fault(err)
	}
	return nil
}

// wave is one wave of a batch: ops whose keys are distinct, grouped by kind.
type wave struct {
	ops   []driver.Op            // the batch's
	kinds [driver.Fail + 1][]int // indexes in ops per kind, keys in byte order
	at    map[string]int         // key -> index in ops
}

func waves(ops []driver.Op) []*wave {
	idx := driver.Waves(ops)
	ws := make([]*wave, len(idx))
	for j, wi := range idx {
		w := &wave{ops: ops, at: make(map[string]int, len(wi))}
		for _, i := range wi {
			w.kinds[ops[i].Kind] = append(w.kinds[ops[i].Kind], i)
			w.at[ops[i].Key] = i
		}
		// One order of keys for every batch, so that concurrent batches
		// lock the rows they share in the same order.
		for _, g := range w.kinds {
			slices.SortFunc(g, func(a, b int) int { return strings.Compare(ops[a].Key, ops[b].Key) })
		}
		ws[j] = w
	}
	return ws
}

// op returns the index in ops of key's op of kind k, or an error if the
// database answered a row for a key the wave did not send.
func (w *wave) op(key string, k driver.Kind) (int, error) {
	i, ok := w.at[key]
	if !ok || w.ops[i].Kind != k {
		return 0, fmt.Errorf("the %s statement answered a row for key %q, which it was not given", k, key)
	}
	return i, nil
}

// claimRow is the row a claim statement answers for its key: claimCols
// (the key aside) and the clock.
type claimRow struct {
	state, attempts        int
	lease, hash            []byte
	reason                 sql.NullString
	until, last, now       time.Time
	untilOK, lastOK, nowOK bool
}

// claimDests returns the scan destinations of a claim statement's row:
// key, then r's columns.
func (d *sqlDriver) claimDests(key *string, r *claimRow) []any {
	return []any{key, &r.state, &r.lease, d.timeDest(&r.until, &r.untilOK), &r.hash, d.timeDest(&r.last, &r.lastOK),
		&r.attempts, &r.reason, d.timeDest(&r.now, &r.nowOK)}
}

// claim is op's outcome, given its row.
func (r *claimRow) claim(op driver.Op) inbox.Claim {
	c := inbox.Claim{Attempts: r.attempts, PayloadMismatch: hashMismatch(op.PayloadHash, r.hash)}
	switch {
	case r.state == stateProcessed:
		c.Status = inbox.Processed
	case r.state == stateDead:
		c.Status, c.Reason = inbox.Dead, r.reason.String
	case r.lease != nil && string(r.lease) == op.LeaseID:
		// The statement acquired or renewed: a row held by the caller's
		// lease id is always written from now.
		c.Status, c.LeaseID, c.ExpiresAt, c.Lease = inbox.Acquired, op.LeaseID, r.until, op.Lease
	default:
		// Another live lease, or a failed attempt's backoff (a lease that
		// nobody holds, told apart by its empty lease id: BackingOff):
		// until lease_until either way.
		//
		// The clock was read when the statement began, and the statement may
		// have waited for the holder's row lock since: the holder's write
		// (its last_seen) happened before this reading, whatever the clock
		// says. An Extend leaves last_seen as it was (a heartbeat is no
		// sighting): after waiting on one, RetryAfter may overstate the time
		// left by the wait, never understate it.
		now := r.now
		if r.lastOK && r.last.After(now) {
			now = r.last
		}
		c.Status, c.ExpiresAt, c.RetryAfter = inbox.Busy, r.until, max(r.until.Sub(now), time.Microsecond)
		c.BackingOff = r.lease == nil
	}
	return c
}

// lost is the error of a Complete, Release or Fail whose lease does not
// hold its key.
func lost(op driver.Op) error {
	if op.Kind == driver.Complete {
		return fmt.Errorf("%w: not held by lease %q (expired and taken over, released, failed, completed by another lease, or unknown)", inbox.ErrLeaseLost, op.LeaseID)
	}
	return fmt.Errorf("%w: not held by lease %q (taken over, released, failed, processed, or unknown)", inbox.ErrLeaseLost, op.LeaseID)
}

// fenced reports whether ops of kind k are fenced by their lease id.
func fenced(k driver.Kind) bool {
	return k == driver.Complete || k == driver.Release || k == driver.Fail
}

// backoffUS is the backoff of a Fail in microseconds: none for a dead key.
func backoffUS(op driver.Op) int64 {
	if op.Failure.Dead {
		return 0
	}
	return us(op.Failure.RetryAfter)
}

// failState is the state a Fail leaves its row in.
func failState(op driver.Op) int {
	if op.Failure.Dead {
		return stateDead
	}
	return stateOpen
}

// failArgs are the parameters of the failOne statement for op.
func (d *sqlDriver) failArgs(op driver.Op) []any {
	ret, retry := us(d.opts.Retention), backoffUS(op)
	if d.opts.Dialect == MySQL {
		return []any{retry, op.Failure.Reason, failState(op), retry + ret, op.Key, leaseBytes(op.LeaseID)}
	}
	return []any{ret, op.Key, leaseBytes(op.LeaseID), op.Failure.Reason, failState(op), retry}
}

// unanswered settles the ops of kind k of w that the database answered no
// row for (answered[i] false): a Complete, Release or Fail whose lease did
// not hold its key, or a claim or mark that went wrong.
func (w *wave) unanswered(k driver.Kind, answered []bool, res []inbox.Claim, errs []error) {
	for _, i := range w.kinds[k] {
		if answered[i] {
			continue
		}
		res[i] = inbox.Claim{}
		if fenced(k) {
			errs[i] = lost(w.ops[i])
		} else {
			errs[i] = fmt.Errorf("%w: the %s statement answered no row for the key", inbox.ErrStoreUnavailable, k)
		}
	}
}

// querier is a *sql.DB or a *sql.Tx.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// ---- PostgreSQL: one statement per wave ----

func (d *sqlDriver) applyPG(ctx context.Context, ops []driver.Op, res []inbox.Claim, errs []error) error {
	if slices.ContainsFunc(ops, ordered) {
		return d.applyPGOrdered(ctx, ops, res, errs)
	}
	return d.applyPGPlain(ctx, ops, res, errs)
}

// applyPGPlain applies ops, none of which carries an order key: alone
// (applyOne), or in waves of one statement each.
func (d *sqlDriver) applyPGPlain(ctx context.Context, ops []driver.Op, res []inbox.Claim, errs []error) error {
	if len(ops) == 1 {
		return d.applyOne(ctx, ops, res, errs)
	}
	for _, w := range waves(ops) {
		if err := retryDeadlocks(ctx, func() error { return d.pgWave(ctx, w, res, errs) }); err != nil {
			return err
		}
	}
	return nil
}

// pgWave runs w as one statement (pgWaveQuery).
func (d *sqlDriver) pgWave(ctx context.Context, w *wave, res []inbox.Claim, errs []error) error {
	ops := w.ops
	args := []any{us(d.opts.Retention)}
	mask := 0
	if g := w.kinds[driver.Claim]; len(g) > 0 {
		mask |= bit(driver.Claim)
		args = append(args,
			pgArray(g, func(i int) string { return pgQuote(ops[i].Key) }),
			pgArray(g, func(i int) string { return pgQuote(ops[i].LeaseID) }),
			pgArray(g, func(i int) string { return pgQuote(ops[i].Owner) }),
			pgArray(g, func(i int) string { return strconv.FormatInt(us(ops[i].Lease), 10) }),
			pgArray(g, func(i int) string { return pgHex(encodeHash(ops[i].PayloadHash)) }))
	}
	// Completes, then releases: the order of their parameters.
	for _, k := range []driver.Kind{driver.Complete, driver.Release} {
		if g := w.kinds[k]; len(g) > 0 {
			mask |= bit(k)
			args = append(args,
				pgArray(g, func(i int) string { return pgQuote(ops[i].Key) }),
				pgArray(g, func(i int) string { return pgQuote(ops[i].LeaseID) }),
				len(g))
		}
	}
	if g := w.kinds[driver.Mark]; len(g) > 0 {
		mask |= bit(driver.Mark)
		args = append(args, pgArray(g, func(i int) string { return pgQuote(ops[i].Key) }))
	}
	if g := w.kinds[driver.Fail]; len(g) > 0 {
		mask |= bit(driver.Fail)
		args = append(args,
			pgArray(g, func(i int) string { return pgQuote(ops[i].Key) }),
			pgArray(g, func(i int) string { return pgQuote(ops[i].LeaseID) }),
			pgArray(g, func(i int) string { return pgQuote(ops[i].Failure.Reason) }),
			pgArray(g, func(i int) string { return strconv.FormatInt(backoffUS(ops[i]), 10) }),
			pgArray(g, func(i int) string { return strconv.Itoa(failState(ops[i])) }),
			len(g))
	}
	rows, err := d.db.QueryContext(ctx, d.q.pg[mask], args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	answered := make([]bool, len(ops))
	for rows.Next() {
		var (
			kind            int
			key             string
			state, attempts sql.NullInt64
			r               claimRow
		)
		if err := rows.Scan(&kind, &key, &state, &r.lease, d.timeDest(&r.until, &r.untilOK), &r.hash,
			d.timeDest(&r.last, &r.lastOK), &attempts, &r.reason, d.timeDest(&r.now, &r.nowOK)); err != nil {
			return err
		}
		i, err := w.op(key, driver.Kind(kind))
		if err != nil {
			return err
		}
		answered[i] = true
		res[i], errs[i] = inbox.Claim{}, nil
		if kind == int(driver.Claim) {
			r.state, r.attempts = int(state.Int64), int(attempts.Int64)
			res[i] = r.claim(ops[i])
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for k := driver.Claim; k <= driver.Fail; k++ {
		w.unanswered(k, answered, res, errs)
	}
	return nil
}

// pgArray is a PostgreSQL array literal of the elements elem(i) of the ops
// of g.
func pgArray(g []int, elem func(i int) string) string {
	var b strings.Builder
	b.WriteByte('{')
	for j, i := range g {
		if j > 0 {
			b.WriteByte(',')
		}
		b.WriteString(elem(i))
	}
	b.WriteByte('}')
	return b.String()
}

// pgHex is the element of an array literal that decode(e, 'hex') reads as
// b: its hex digits, or NULL for nil.
func pgHex(b []byte) string {
	if b == nil {
		return "NULL"
	}
	return hex.EncodeToString(b)
}

// pgQuote quotes s as an element of an array literal: in double quotes, with
// backslashes before double quotes and backslashes. Keys hold no NUL.
func pgQuote(s string) string {
	if !strings.ContainsAny(s, `"\`) {
		return `"` + s + `"`
	}
	var b strings.Builder
	b.Grow(len(s) + 4)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
	return b.String()
}

// ---- MySQL and MariaDB: a batch of several ops is one transaction ----

func (d *sqlDriver) applyMy(ctx context.Context, ops []driver.Op, res []inbox.Claim, errs []error) error {
	if len(ops) == 1 && (ops[0].Kind != driver.Claim || d.returning) {
		return d.applyOne(ctx, ops, res, errs)
	}
	ws := waves(ops)
	// InnoDB rolls a deadlocked transaction back whole: run it again whole.
	return retryDeadlocks(ctx, func() error {
		return d.inTx(ctx, func(tx *sql.Tx) error {
			for _, w := range ws {
				if err := d.myWave(ctx, tx, w, res, errs); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

// myWave runs w in the transaction q.
func (d *sqlDriver) myWave(ctx context.Context, q querier, w *wave, res []inbox.Claim, errs []error) error {
	ops := w.ops
	ret := us(d.opts.Retention)
	if g := w.kinds[driver.Claim]; len(g) > 0 {
		args := make([]any, 0, 6*len(g))
		for _, i := range g {
			args = append(args, ops[i].Key, leaseBytes(ops[i].LeaseID), ops[i].Owner, us(ops[i].Lease), encodeHash(ops[i].PayloadHash), us(ops[i].Lease)+ret)
		}
		query := d.q.claimsQuery(len(g))
		if !d.returning {
			// MySQL 8: no RETURNING; read the rows the upsert locked.
			if _, err := q.ExecContext(ctx, query, args...); err != nil {
				return err
			}
			keys := make([]any, len(g))
			for j, i := range g {
				keys[j] = ops[i].Key
			}
			query = d.q.myClaimsRead(len(g))
			args = keys
		}
		if err := d.claimRows(ctx, q, nil, query, args, w, res, errs); err != nil {
			return err
		}
	}
	if err := d.mySettle(ctx, q, w, res, errs); err != nil {
		return err
	}
	if g := w.kinds[driver.Mark]; len(g) > 0 {
		args := make([]any, 0, 2*len(g))
		for _, i := range g {
			args = append(args, ops[i].Key, ret)
		}
		if _, err := q.ExecContext(ctx, d.q.marksQuery(len(g)), args...); err != nil {
			return err
		}
		for _, i := range g {
			res[i], errs[i] = inbox.Claim{}, nil
		}
	}
	return nil
}

// applyOne runs a batch of one op (on MySQL 8, not a claim) as one
// statement with scalar parameters, cheaper than those of larger batches:
// measured, the array statements of PostgreSQL and the UPDATE ... RETURNING
// of SQLite cost a single caller a sixth and a third of its throughput.
func (d *sqlDriver) applyOne(ctx context.Context, ops []driver.Op, res []inbox.Claim, errs []error) error {
	op, ret := ops[0], us(d.opts.Retention)
	if op.Kind == driver.Claim {
		// The batch's one wave, built directly: its one op, a claim.
		w := &wave{ops: ops, at: map[string]int{op.Key: 0}}
		w.kinds[driver.Claim] = []int{0}
		args := []any{op.Key, leaseBytes(op.LeaseID), op.Owner, us(op.Lease), encodeHash(op.PayloadHash), us(op.Lease) + ret}
		return retryDeadlocks(ctx, func() error {
			return d.claimRows(ctx, d.db, d.stmt(ctx, d.q.claimOne), d.q.claimOne, args, w, res, errs)
		})
	}
	return retryDeadlocks(ctx, func() error {
		switch op.Kind {
		case driver.Mark:
			if _, err := d.execStmt(ctx, d.q.markOne, op.Key, ret); err != nil {
				return err
			}
			res[0], errs[0] = inbox.Claim{}, nil
			return nil
		default:
			return d.settleOne(ctx, d.execStmt, op, &res[0], &errs[0])
		}
	})
}

// settleOne runs a Complete, Release or Fail alone, through exec (the
// database's, or a transaction's): a fenced UPDATE that affects the key's
// row when op's lease holds it.
func (d *sqlDriver) settleOne(ctx context.Context, exec func(ctx context.Context, query string, args ...any) (sql.Result, error),
	op driver.Op, res *inbox.Claim, errp *error) error {
	query, args := d.q.release, []any{us(d.opts.Retention), op.Key, leaseBytes(op.LeaseID)}
	switch op.Kind {
	case driver.Complete:
		query = d.q.complete
		switch d.opts.Dialect {
		case MySQL:
			args = append(myCompleteArgs(d.opts.Retention), op.Key, leaseBytes(op.LeaseID), leaseFP(op.LeaseID))
		case SQLite:
			args = append(args, leaseFP(op.LeaseID))
		}
	case driver.Fail:
		query, args = d.q.failOne, d.failArgs(op)
	}
	r, err := exec(ctx, query, args...)
	if err != nil {
		return err
	}
	n, err := r.RowsAffected()
	if err != nil {
		return err
	}
	*res, *errp = inbox.Claim{}, nil
	if n == 1 {
		return nil
	}
	if op.Kind == driver.Complete && d.opts.Dialect == MySQL {
		// Without clientFoundRows a repeated Complete changes nothing and
		// reports no row: ask whether this lease completed the key.
		var (
			state        int
			got          []byte
			expires, now time.Time
			expOK, nowOK bool
		)
		err := d.db.QueryRowContext(ctx, d.q.holder, op.Key).Scan(&state, &got, d.timeDest(&expires, &expOK), d.timeDest(&now, &nowOK))
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return err
		case state == stateProcessed && bytes.Equal(got, leaseFP(op.LeaseID)) && expires.After(now):
			return nil
		}
	}
	*errp = lost(op)
	return nil
}

// mySettle runs the completes, releases and fails of w in the transaction
// q: it reads and locks their rows, decides which leases hold their keys
// (the conditions of the fenced UPDATEs of settleOne), and updates those
// rows, with one statement per kind.
func (d *sqlDriver) mySettle(ctx context.Context, q querier, w *wave, res []inbox.Claim, errs []error) error {
	ops := w.ops
	keys := make([]any, 0, len(w.kinds[driver.Complete])+len(w.kinds[driver.Release])+len(w.kinds[driver.Fail]))
	for _, k := range []driver.Kind{driver.Complete, driver.Release, driver.Fail} {
		for _, i := range w.kinds[k] {
			keys = append(keys, ops[i].Key)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	rows, err := q.QueryContext(ctx, d.q.mySettleRead(len(keys)), keys...)
	if err != nil {
		return err
	}
	defer rows.Close()
	held := make([]bool, len(ops))
	for rows.Next() {
		var (
			key          string
			got          []byte
			state        int
			expires, now time.Time
			expOK, nowOK bool
		)
		if err := rows.Scan(&key, &state, &got, d.timeDest(&expires, &expOK), d.timeDest(&now, &nowOK)); err != nil {
			return err
		}
		i, ok := w.at[key]
		if !ok {
			return fmt.Errorf("the read of the rows to complete, release or fail answered a row for key %q, which it was not given", key)
		}
		held[i] = expires.After(now) && (state == stateOpen && got != nil && string(got) == ops[i].LeaseID ||
			ops[i].Kind == driver.Complete && state == stateProcessed && bytes.Equal(got, leaseFP(ops[i].LeaseID)))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, k := range []driver.Kind{driver.Complete, driver.Release} {
		args := []any{us(d.opts.Retention)}
		if k == driver.Complete {
			args = myCompleteArgs(d.opts.Retention)
		}
		n := len(args)
		for _, i := range w.kinds[k] {
			res[i], errs[i] = inbox.Claim{}, nil
			if held[i] {
				args = append(args, ops[i].Key)
			} else {
				errs[i] = lost(ops[i])
			}
		}
		if len(args) == n {
			continue
		}
		if _, err := q.ExecContext(ctx, d.q.mySettleUpdate(k, len(args)-n), args...); err != nil {
			return err
		}
	}
	return d.myFail(ctx, q, w, held, res, errs)
}

// myFail updates the rows of the fails of w whose leases hold their keys
// (held), in one UPDATE joined with the rows of their values. A
// multiple-table UPDATE does not promise its assignments' order; none of
// them reads a column.
func (d *sqlDriver) myFail(ctx context.Context, q querier, w *wave, held []bool, res []inbox.Claim, errs []error) error {
	ops, ret := w.ops, us(d.opts.Retention)
	var args []any
	for _, i := range w.kinds[driver.Fail] {
		res[i], errs[i] = inbox.Claim{}, nil
		if !held[i] {
			errs[i] = lost(ops[i])
			continue
		}
		retry := backoffUS(ops[i])
		args = append(args, ops[i].Key, ops[i].Failure.Reason, failState(ops[i]), retry, retry+ret)
	}
	if len(args) == 0 {
		return nil
	}
	_, err := q.ExecContext(ctx, d.q.myFailsQuery(len(args)/5), args...)
	return err
}

// ---- SQLite: a batch of several ops is one immediate transaction ----

// liteStep is one statement of a SQLite batch.
type liteStep struct {
	w     *wave
	kind  driver.Kind
	op    int // a Complete's or Fail's index in w.ops: a statement each
	query string
	args  []any
	st    *sql.Stmt // prepared, or nil
}

func (d *sqlDriver) applyLite(ctx context.Context, ops []driver.Op, res []inbox.Claim, errs []error) error {
	if len(ops) == 1 {
		return d.applyOne(ctx, ops, res, errs)
	}
	ret := us(d.opts.Retention)
	var steps []liteStep
	for _, w := range waves(ops) {
		if g := w.kinds[driver.Claim]; len(g) > 0 {
			args := make([]any, 0, 6*len(g))
			for _, i := range g {
				args = append(args, ops[i].Key, leaseBytes(ops[i].LeaseID), ops[i].Owner, us(ops[i].Lease), encodeHash(ops[i].PayloadHash), us(ops[i].Lease)+ret)
			}
			steps = append(steps, liteStep{w: w, kind: driver.Claim, args: args, query: d.q.claimsQuery(len(g))})
		}
		if g := w.kinds[driver.Release]; len(g) > 0 {
			args := make([]any, 0, 1+3*len(g))
			args = append(args, ret)
			for _, i := range g {
				args = append(args, ops[i].Key)
			}
			for _, i := range g {
				args = append(args, ops[i].Key, leaseBytes(ops[i].LeaseID))
			}
			steps = append(steps, liteStep{w: w, kind: driver.Release, args: args, query: d.q.liteReleasesQuery(len(g))})
		}
		// The complete statement per Complete, as for Fails: each sets a
		// fingerprint of its own.
		for _, i := range w.kinds[driver.Complete] {
			steps = append(steps, liteStep{w: w, kind: driver.Complete, op: i, query: d.q.complete})
		}
		if g := w.kinds[driver.Mark]; len(g) > 0 {
			args := make([]any, 0, 2*len(g))
			for _, i := range g {
				args = append(args, ops[i].Key, ret)
			}
			steps = append(steps, liteStep{w: w, kind: driver.Mark, args: args, query: d.q.marksQuery(len(g))})
		}
		// The failOne statement per Fail, prepared once: each carries
		// values of its own, and SQLite runs in process.
		for _, i := range w.kinds[driver.Fail] {
			steps = append(steps, liteStep{w: w, kind: driver.Fail, op: i, query: d.q.failOne})
		}
	}
	// Prepare before taking the connection: the pool has one.
	for j := range steps {
		steps[j].st = d.stmt(ctx, steps[j].query)
	}
	run := func(tx *sql.Tx) error {
		for _, s := range steps {
			if err := d.liteStep(ctx, tx, s, res, errs); err != nil {
				return err
			}
		}
		return nil
	}
	if len(steps) == 1 {
		return run(nil)
	}
	return d.inTx(ctx, run)
}

// liteStep runs s in tx (nil: on the database).
func (d *sqlDriver) liteStep(ctx context.Context, tx *sql.Tx, s liteStep, res []inbox.Claim, errs []error) error {
	st := s.st
	if st != nil && tx != nil {
		st = tx.StmtContext(ctx, st)
	}
	var q querier = d.db
	if tx != nil {
		q = tx
	}
	if s.kind == driver.Claim {
		return d.claimRows(ctx, q, st, s.query, s.args, s.w, res, errs)
	}
	if s.kind == driver.Fail || s.kind == driver.Complete {
		exec := q.ExecContext
		if st != nil {
			exec = func(ctx context.Context, _ string, args ...any) (sql.Result, error) {
				return st.ExecContext(ctx, args...)
			}
		}
		return d.settleOne(ctx, exec, s.w.ops[s.op], &res[s.op], &errs[s.op])
	}
	if s.kind == driver.Mark {
		var err error
		if st != nil {
			_, err = st.ExecContext(ctx, s.args...)
		} else {
			_, err = q.ExecContext(ctx, s.query, s.args...)
		}
		if err != nil {
			return err
		}
		for _, i := range s.w.kinds[driver.Mark] {
			res[i], errs[i] = inbox.Claim{}, nil
		}
		return nil
	}
	var (
		rows *sql.Rows
		err  error
	)
	if st != nil {
		rows, err = st.QueryContext(ctx, s.args...)
	} else {
		rows, err = q.QueryContext(ctx, s.query, s.args...)
	}
	if err != nil {
		return err
	}
	defer rows.Close()
	answered := make([]bool, len(s.w.ops))
	for rows.Next() {
		var key string
		if err := rows.Scan(&key); err != nil {
			return err
		}
		i, err := s.w.op(key, s.kind)
		if err != nil {
			return err
		}
		answered[i] = true
		res[i], errs[i] = inbox.Claim{}, nil
	}
	if err := rows.Err(); err != nil {
		return err
	}
	s.w.unanswered(s.kind, answered, res, errs)
	return nil
}

// ---- shared by MySQL and SQLite ----

// claimRows runs a claim statement (st when prepared, else query on q) that
// answers claimCols and now per row, and sets the outcome of the claims of
// w.
func (d *sqlDriver) claimRows(ctx context.Context, q querier, st *sql.Stmt, query string, args []any, w *wave, res []inbox.Claim, errs []error) error {
	var (
		rows *sql.Rows
		err  error
	)
	if st != nil {
		rows, err = st.QueryContext(ctx, args...)
	} else {
		rows, err = q.QueryContext(ctx, query, args...)
	}
	if err != nil {
		return err
	}
	defer rows.Close()
	answered := make([]bool, len(w.ops))
	for rows.Next() {
		var (
			key string
			r   claimRow
		)
		if err := rows.Scan(d.claimDests(&key, &r)...); err != nil {
			return err
		}
		i, err := w.op(key, driver.Claim)
		if err != nil {
			return err
		}
		answered[i] = true
		res[i], errs[i] = r.claim(w.ops[i]), nil
	}
	if err := rows.Err(); err != nil {
		return err
	}
	w.unanswered(driver.Claim, answered, res, errs)
	return nil
}

// claimsQuery is the claim statement of n rows (MySQL and SQLite), whose
// parameters are those of claimRow per row.
func (q *queries) claimsQuery(n int) string {
	return rowsQuery("INSERT INTO "+q.t+" ("+insertCols+") VALUES ", q.claimRow, n, q.claimTail)
}

// marksQuery is the mark statement of n rows (MySQL and SQLite), whose
// parameters are those of markRow per row.
func (q *queries) marksQuery(n int) string {
	return rowsQuery("INSERT INTO "+q.t+" ("+insertCols+") VALUES ", q.markRow, n, q.markTail)
}

// liteReleasesQuery is SQLite's statement for n releases: a fenced UPDATE
// that returns the key of each row whose lease held it. Its parameters are
// the retention, the n keys, then each key and its lease id.
func (q *queries) liteReleasesQuery(n int) string {
	return "UPDATE " + q.t + " SET" + q.releaseSet + "\nWHERE msg_key IN (" + placeholders(n) + ")" +
		" AND (msg_key, lease) IN (VALUES " + rowsQuery("", "(?, ?)", n, "") + ")" +
		" AND state = 0 AND expires_at > " + liteNow + "\nRETURNING msg_key"
}

// myClaimsRead is MySQL 8's locking read of the rows of n claims, after
// their upsert (which returns nothing there): claimCols and now per row.
// Its parameters are the n keys.
func (q *queries) myClaimsRead(n int) string {
	return "SELECT " + claimCols + ", UTC_TIMESTAMP(6) FROM " + q.t + " WHERE msg_key IN (" + placeholders(n) + ") FOR UPDATE"
}

// mySettleRead is the locking read of the rows of n completes, releases
// and fails on MySQL (mySettle): msg_key, state, lease, expires_at and
// now per row. Its parameters are the n keys.
func (q *queries) mySettleRead(n int) string {
	return "SELECT msg_key, state, lease, expires_at, UTC_TIMESTAMP(6) FROM " + q.t + " WHERE msg_key IN (" + placeholders(n) + ") ORDER BY msg_key FOR UPDATE"
}

// myCompleteArgs are the parameters of MySQL's completeSet for the
// retention ret: ret, ret and a 64th of it, ret (microseconds).
func myCompleteArgs(ret time.Duration) []any {
	return []any{us(ret), us(ret + ret/64), us(ret)}
}

// mySettleUpdate is the UPDATE of the rows of n completes or releases (k)
// whose leases held them, on MySQL (mySettle). Its parameters are those of
// the SET clause (the retention; for completes myCompleteArgs), then the n
// keys.
func (q *queries) mySettleUpdate(k driver.Kind, n int) string {
	set := q.releaseSet
	if k == driver.Complete {
		set = q.completeSet
	}
	return "UPDATE " + q.t + " SET" + set + "\nWHERE msg_key IN (" + placeholders(n) + ")"
}

// myFailsQuery is the UPDATE of the rows of n fails whose leases held
// them, on MySQL (myFail), joined with a derived table of their values.
// Its parameters are, per row: key, reason, new state, backoff, and
// backoff plus retention (microseconds).
func (q *queries) myFailsQuery(n int) string {
	return "UPDATE " + q.t + " AS t JOIN (SELECT ? AS k, ? AS r, ? AS s, ? AS ra, ? AS ex" +
		strings.Repeat(" UNION ALL SELECT ?, ?, ?, ?, ?", n-1) +
		") AS u ON t.msg_key = u.k SET" + myFailSet("u.r", "u.s", "u.ra", "u.ex")
}

// rowsQuery is head, n copies of row separated by commas, then tail.
func rowsQuery(head, row string, n int, tail string) string {
	var b strings.Builder
	b.Grow(len(head) + n*(len(row)+2) + len(tail))
	b.WriteString(head)
	for j := range n {
		if j > 0 {
			b.WriteString(", ")
		}
		b.WriteString(row)
	}
	b.WriteString(tail)
	return b.String()
}

// placeholders is n question marks separated by commas.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}
