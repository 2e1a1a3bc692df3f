package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/batch"
	inboxmw "github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/driver"
)

// The stores' batching bounds, which the floors copy so that they group
// their calls as the stores do: the Redis store's (stores/redis: maxBatch,
// maxQueue, maxInFlight) and the SQL store's on PostgreSQL (stores/sql:
// batchBounds; its queue is stores/driver's default).
var (
	redisFloorBounds    = batch.Options{MaxBatch: 128, MaxQueue: 4096, MaxInFlight: 2}
	postgresFloorBounds = batch.Options{MaxBatch: 64, MaxQueue: batch.DefaultMaxQueue, MaxInFlight: 2}
)

// floorOp is one call of a floor: the claim of a message id before the
// handler, or its mark after the ack; lease is the claim's lease id, for a
// fenced floor.
type floorOp struct {
	id    string
	lease string
	mark  bool
}

// floorApply sends ops in one round trip, as [batch.Func]: res[i] tells
// whether claim ops[i] wrote, that is claimed its id (marks leave it).
type floorApply = batch.Func[floorOp, bool]

// A floor is the least a store's middleware can write per message, sent
// through the group commit the stores use (internal/batch, with the store's
// bounds): concurrent calls travel together, one round trip per batch.
//
// floor-redis (marks false) claims each message with a bare write and
// writes nothing after the handler: the least any claim can cost, but half
// of what a correct inbox must do. floor2-redis and floor2-postgres (marks
// true) also mark each message after the router acked it, with a second
// bare write: the least any inbox can cost, since a key must be claimed
// before the handler and marked after it, or a crash between the two
// cannot be told from success.
//
// floor2f-redis (fenced) claims with a lease id of its own, as the inbox
// does, and marks only under it: the least that fencing costs, so that the
// tables show it apart from what the inbox adds.
//
// A message whose key is claimed already is a duplicate and is acked
// without running the handler; a failed claim nacks the message. A failed
// handler leaves its claim (the benchmark's handler never fails).
type floor struct {
	name   string
	marks  bool
	fenced bool
	b      *batch.Batcher[floorOp, bool]
	// counter counts the round trips as a driver.Store counts its own.
	counter driver.BatchCounter

	tally markTally
}

func newFloor(name string, marks, fenced bool, bounds batch.Options, apply floorApply) *floor {
	f := &floor{name: name, marks: marks, fenced: fenced}
	f.b = batch.New(func(ctx context.Context, ops []floorOp, res []bool, errs []error) error {
		f.counter.Add(len(ops))
		return apply(ctx, ops, res, errs)
	}, bounds)
	return f
}

// BatchStats counts the floor's round trips as [driver.Store.BatchStats]
// counts a store's.
func (f *floor) BatchStats() driver.BatchStats { return f.counter.Stats() }

// middleware claims each message by its UUID before the handler and, for a
// floor with marks, marks it once the router acked it.
func (f *floor) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		op := floorOp{id: msg.UUID}
		if f.fenced {
			op.lease = inbox.NewLeaseID()
		}
		claimed, err := f.b.Do(msg.Context(), op)
		if err != nil {
			return nil, fmt.Errorf("%s claim of %s: %w", f.name, msg.UUID, err)
		}
		if !claimed {
			return nil, nil // claimed before: a duplicate, acked
		}
		out, err := h(msg)
		if err != nil || !f.marks {
			return out, err
		}
		f.tally.pending.Add(1)
		go f.markAfterAck(msg, op.lease)
		return out, nil
	}
}

// markAfterAck marks msg's id once the router acked msg (nothing if it
// nacked it), as the inbox does, bounded by the inbox's store timeout.
func (f *floor) markAfterAck(msg *message.Message, lease string) {
	defer f.tally.pending.Done()
	select {
	case <-msg.Acked():
	case <-msg.Nacked():
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), inboxmw.DefaultStoreTimeout)
	defer cancel()
	if _, err := f.b.Do(ctx, floorOp{id: msg.UUID, lease: lease, mark: true}); err != nil {
		f.tally.failed(fmt.Errorf("mark of %s: %w", msg.UUID, err))
	}
}

// drain waits until every mark of the messages handled so far is written
// (the variant's close, after the router stopped), and fails if some
// could not be: a trial whose marks failed measured less than the work.
func (f *floor) drain(ctx context.Context) error { return f.tally.drain(ctx, f.name) }

// markTally counts the marks of a floor (or of store-redis) still in
// flight and those that failed, for its drain.
type markTally struct {
	pending   sync.WaitGroup // marks not yet written
	fails     atomic.Int64
	firstFail atomic.Pointer[error]
}

// failed records a mark that failed with err.
func (t *markTally) failed(err error) {
	if t.fails.Add(1) == 1 {
		t.firstFail.Store(&err)
	}
}

// drain waits for the marks in flight, for at most 30 s, and fails if some
// could not be written; name is the variant's.
func (t *markTally) drain(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { t.pending.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("%s: marks still pending: %w", name, ctx.Err())
	}
	if n := t.fails.Swap(0); n > 0 {
		return fmt.Errorf("%s: %d marks failed, the first: %w", name, n, *t.firstFail.Swap(nil))
	}
	return nil
}

// redisFloor is a floor on Redis: a claim is SET <prefix><id> 1 NX PX
// <lease>, a mark SET <prefix><id> 2 PX <retention> (the expiry keeps a
// shared Redis clean if the run dies; it costs the command nothing); a
// batch is one pipeline. A fenced floor's claim sets the lease id instead
// of 1, and its mark is fencedMark, the smallest script that marks a key
// only under the claim's lease id.
func redisFloor(name string, marks, fenced bool, c *redis.Client, prefix string, lease, retention time.Duration) *floor {
	px, keep := strconv.FormatInt(lease.Milliseconds(), 10), strconv.FormatInt(retention.Milliseconds(), 10)
	return newFloor(name, marks, fenced, redisFloorBounds, func(ctx context.Context, ops []floorOp, res []bool, errs []error) error {
		p := c.Pipeline()
		cmds := make([]*redis.Cmd, len(ops))
		for i, op := range ops {
			// Do, not SetNX: SetNX sends EX for whole seconds.
			switch {
			case op.mark && fenced:
				cmds[i] = fencedMark.EvalSha(ctx, p, []string{prefix + op.id}, op.lease, keep)
			case op.mark:
				cmds[i] = p.Do(ctx, "set", prefix+op.id, "2", "px", keep)
			case fenced:
				cmds[i] = p.Do(ctx, "set", prefix+op.id, op.lease, "nx", "px", px)
			default:
				cmds[i] = p.Do(ctx, "set", prefix+op.id, "1", "nx", "px", px)
			}
		}
		_, _ = p.Exec(ctx) // errors are the commands'
		for i, cmd := range cmds {
			switch err := cmd.Err(); {
			case err == nil && ops[i].mark && fenced && cmd.Val() != int64(1):
				errs[i] = fmt.Errorf("the key was not held by lease %q", ops[i].lease)
			case err == nil:
				res[i] = true
			case errors.Is(err, redis.Nil) && !ops[i].mark: // the key was set: claimed before
			default:
				errs[i] = err
			}
		}
		return nil
	})
}

// fencedMark is floor2f-redis's mark: SET the key to 2 for the retention
// (ARGV[2], ms) if it holds the lease id ARGV[1]; 1 when it did, 0 when not.
// The floor loads it before its trials (loadFencedMark).
var fencedMark = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], '2', 'PX', ARGV[2]) return 1 end return 0`)

// postgresFloor is a floor on PostgreSQL, on table (the store's columns,
// a table of its own): a claim is an INSERT of a leased row ... ON CONFLICT
// DO NOTHING, a mark an UPDATE of the row's state and times (the rows of
// stores/sql's round-trip floor, BenchmarkClaimCompleteInterleaved, without
// the lease id). A lone call is one statement, as the store's; a batch is
// one statement too, both writes over unnest arrays in data-modifying
// CTEs, as the store sends one statement per batch of distinct keys.
// Errors of the database fail the batch, as the store's do.
func postgresFloor(name string, db *sql.DB, table string, lease, retention time.Duration) *floor {
	leaseIv := "interval '" + strconv.FormatInt(lease.Milliseconds(), 10) + " milliseconds'"
	keepIv := "interval '" + strconv.FormatInt(retention.Milliseconds(), 10) + " milliseconds'"
	cols := "(msg_key, state, lease_until, attempts, first_seen, last_seen, expires_at)"
	row := func(key string) string {
		return key + ", 0, clock_timestamp() + " + leaseIv + ", 1, clock_timestamp(), clock_timestamp(), clock_timestamp() + " + keepIv
	}
	set := "state = 1, last_seen = clock_timestamp(), lease_until = NULL, expires_at = clock_timestamp() + " + keepIv
	claimOne := "INSERT INTO " + table + " " + cols + " VALUES (" + row("$1") + ") ON CONFLICT DO NOTHING"
	markOne := "UPDATE " + table + " SET " + set + " WHERE msg_key = $1"
	// The marks join a LIMITed unnest, as the store's statements do: a plan
	// that PostgreSQL caches for the prepared statement while the table is
	// small would otherwise scan the whole table for "msg_key = ANY($2)"
	// as it grows (seen: 26 ms a statement at 50,000 rows, 0.7 ms so).
	many := "WITH c AS (INSERT INTO " + table + " " + cols + " SELECT " + row("k") + " FROM unnest($1::text[]) AS k ON CONFLICT DO NOTHING RETURNING msg_key), " +
		"m AS (UPDATE " + table + " AS t SET " + set + " FROM (SELECT * FROM unnest($2::text[]) LIMIT $3) AS u(k) WHERE t.msg_key = u.k) SELECT msg_key FROM c"
	return newFloor(name, true, false, postgresFloorBounds, func(ctx context.Context, ops []floorOp, res []bool, errs []error) error {
		if len(ops) == 1 {
			if ops[0].mark {
				_, err := db.ExecContext(ctx, markOne, ops[0].id)
				return err
			}
			r, err := db.ExecContext(ctx, claimOne, ops[0].id)
			if err != nil {
				return err
			}
			n, err := r.RowsAffected()
			res[0] = n == 1
			return err
		}
		// A key claimed twice in one batch is sent once: its other claims
		// find it claimed (the INSERT could not tell the two apart).
		first := map[string]int{}
		var claims, marks []string
		for i, op := range ops {
			switch _, dup := first[op.id]; {
			case op.mark:
				marks = append(marks, op.id)
			case !dup:
				first[op.id] = i
				claims = append(claims, op.id)
			}
		}
		// One order of keys for every batch, as the store's, so that
		// concurrent batches lock the rows they share in the same order.
		slices.Sort(claims)
		slices.Sort(marks)
		rows, err := db.QueryContext(ctx, many, claims, marks, len(marks))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var key string
			if err := rows.Scan(&key); err != nil {
				return err
			}
			i, ok := first[key]
			if !ok {
				return fmt.Errorf("%s: the claim statement answered key %q, which it was not given", name, key)
			}
			res[i] = true
		}
		return rows.Err()
	})
}
