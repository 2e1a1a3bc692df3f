package redisstore

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores/driver"
)

// Apply implements [driver.Driver]: the batch's operations in one pipeline
// (on Cluster, go-redis's ClusterClient splits it per node), and the claims
// of keys that SET NX found in a second one. See "Batched round trips" in
// the package documentation.
//
// In the first pipeline, a claim is the fast claim (SET NX PX of a fresh
// record and PEXPIRETIME), or a call of opsScript when its caller said the
// key was claimed before (driver.Op.Retry, from inbox.BeginOptions.Retry)
// or gave an order key (driver.Op.OrderKey);
// Complete, Release, Fail and MarkProcessed are a call of opsScript each.
// A key that appears more than once in the batch gets one call of
// opsScript that applies all of its operations in their order, so that no
// two commands of a batch touch one key: a claim sent again in the second
// pipeline is never overtaken by a later operation on its key, and a call
// that fails (NOSCRIPT included) fails for all of them or none.
//
// Errors are per command: a connection that fails fails every command of
// the pipeline, hence every call of the batch; on Cluster, the calls of
// one node only. Calls whose script the server does not hold (NOSCRIPT: a
// restart, a failover, SCRIPT FLUSH) are sent again with EVAL, which loads
// it, in one more pipeline.
func (d *rdb) Apply(ctx context.Context, ops []driver.Op, res []inbox.Claim, errs []error) error {
	seqs := sequences(ops)
	var calls []*scriptCall
	var claims []fastClaim
	p := d.client.Pipeline()
	for i, op := range ops {
		if idx, ok := seqs[op.Key]; ok {
			if idx[0] == i {
				calls = append(calls, d.call(ops, idx))
			}
			continue
		}
		if op.Kind == driver.Claim && !op.Retry && op.OrderKey == "" {
			claims = append(claims, d.queueClaim(ctx, p, i, op))
			continue
		}
		calls = append(calls, d.callOne(ops, i))
	}
	d.queue(ctx, p, opsScript, calls)
	_, _ = p.Exec(ctx) // errors are the commands'
	d.evalNoScript(ctx, opsScript, calls)

	var later []*scriptCall
	for _, fc := range claims {
		op := ops[fc.i]
		ok, err := fc.set.Result()
		if err != nil {
			errs[fc.i] = mapErr(err)
			continue
		}
		// An error of PEXPIRETIME after a SET that wrote, or a negative
		// expiry (the key is gone already), leaves the decision to the
		// script: it finds this lease's record, if any, and renews it.
		if e, err := fc.exp.Result(); ok && err == nil && e >= 0 {
			// SET NX wrote the fresh record: acquired at the time of the
			// SET rounded down to the millisecond, as the scripts read it.
			until := acquiredAt(int64(e/time.Millisecond), fc.ttlMS) + fc.leaseUS
			res[fc.i] = inbox.Claim{Status: inbox.Acquired, LeaseID: op.LeaseID, ExpiresAt: fromMicros(until), Lease: time.Duration(fc.leaseUS) * time.Microsecond, Attempts: 1}
			continue
		}
		later = append(later, d.callOne(ops, fc.i))
	}
	d.results(calls, ops, res, errs)
	if len(later) == 0 {
		return nil
	}
	p = d.client.Pipeline()
	d.queue(ctx, p, opsScript, later)
	_, _ = p.Exec(ctx)
	d.evalNoScript(ctx, opsScript, later)
	d.results(later, ops, res, errs)
	return nil
}

// sequences returns, for each key that appears more than once in ops, the
// indices of its operations in order; nil when every key appears once.
func sequences(ops []driver.Op) map[string][]int {
	if len(ops) < 2 {
		return nil
	}
	first := make(map[string]int, len(ops))
	var seqs map[string][]int
	for i, op := range ops {
		j, seen := first[op.Key]
		if !seen {
			first[op.Key] = i
			continue
		}
		if seqs == nil {
			seqs = make(map[string][]int)
		}
		if _, ok := seqs[op.Key]; !ok {
			seqs[op.Key] = []int{j}
		}
		seqs[op.Key] = append(seqs[op.Key], i)
	}
	return seqs
}

// scriptCall is one call of a script: for opsScript, the operations ops
// (indices into the batch) on key.
type scriptCall struct {
	key  string
	ops  []int
	one  [1]int // ops of a call of one operation
	args []any
	cmd  *redis.Cmd
}

// callOne returns the call of opsScript that applies ops[i] alone.
func (d *rdb) callOne(ops []driver.Op, i int) *scriptCall {
	c := &scriptCall{}
	c.one[0] = i
	return d.fill(c, ops, c.one[:])
}

// call returns the call of opsScript that applies ops[idx...], all on one
// key, in order.
func (d *rdb) call(ops []driver.Op, idx []int) *scriptCall {
	return d.fill(&scriptCall{}, ops, idx)
}

// fill makes c the call of opsScript that applies ops[idx...].
func (d *rdb) fill(c *scriptCall, ops []driver.Op, idx []int) *scriptCall {
	n := 2
	for _, i := range idx {
		n += argCount[ops[i].Kind] + 3 // a K has two more than a C, an O or G three more than a B or F
	}
	args := make([]any, 2, n)
	args[0], args[1] = d.retArgs[0], d.retArgs[1]
	for _, i := range idx {
		op := ops[i]
		switch op.Kind {
		case driver.Claim:
			if op.OrderKey != "" {
				args = append(args, "O", op.LeaseID, strconv.FormatInt(micros(op.Lease), 10), op.Owner, compactHash(op.PayloadHash), d.gateKey(op.OrderKey), d.opts.Prefix, d.gateTTL)
				continue
			}
			args = append(args, "B", op.LeaseID, strconv.FormatInt(micros(op.Lease), 10), op.Owner, compactHash(op.PayloadHash))
		case driver.Complete:
			if fresh, compact, ok := d.completion(op); ok {
				args = append(args, "K", op.LeaseID, fresh, compact)
			} else {
				args = append(args, "C", op.LeaseID)
			}
		case driver.Extend:
			args = append(args, "E", op.LeaseID, strconv.FormatInt(micros(op.Lease), 10))
		case driver.Release:
			args = append(args, "R", op.LeaseID)
		case driver.Fail:
			dead := "0"
			if op.Failure.Dead {
				dead = "1"
			}
			after := strconv.FormatInt(micros(min(op.Failure.RetryAfter, MaxDuration)), 10)
			if op.Failure.OrderKey != "" {
				args = append(args, "G", op.LeaseID, after, dead, op.Failure.Reason, d.gateKey(op.Failure.OrderKey), d.opts.Prefix, d.gateTTL)
				continue
			}
			args = append(args, "F", op.LeaseID, after, dead, op.Failure.Reason)
		case driver.Mark:
			args = append(args, "M")
		}
	}
	c.key, c.ops, c.args = ops[idx[0]].Key, idx, args
	return c
}

// argCount is the number of script arguments of each kind of operation.
var argCount = [...]int{driver.Claim: 5, driver.Complete: 2, driver.Release: 2, driver.Mark: 1, driver.Fail: 5, driver.Extend: 3}

// completion returns, for a Complete that knows its claim (op.ExpiresAt),
// the fresh record the claim wrote (queueClaim) and the compact processed
// record that replaces it (marked), written with ARGV[2]'s TTL.
func (d *rdb) completion(op driver.Op) (fresh, compact []byte, ok bool) {
	if op.ExpiresAt.IsZero() || op.Lease <= 0 {
		return nil, nil, false
	}
	leaseUS := micros(op.Lease)
	ttl := ttlMS(leaseUS + d.retUS)
	acquired := op.ExpiresAt.UnixMicro() - leaseUS
	if acquired%1000 != 0 {
		return nil, nil, false // not a fast claim's: its acquisition is in whole ms
	}
	hash := compactHash(op.PayloadHash)
	fresh = record{Kind: kindFresh, ID: op.LeaseID, Owner: op.Owner, PayloadHash: hash, Lease: leaseUS, TTL: ttl}.encode()
	return fresh, marked(op.LeaseID, hash, acquired, d.retMS).encode(), true
}

// fastClaim is the claim of ops[i] as SET NX PX of a fresh record and
// PEXPIRETIME (see "Record layouts" in doc.go).
type fastClaim struct {
	i              int
	leaseUS, ttlMS int64 // the fresh record's lease and physical TTL
	set            *redis.BoolCmd
	exp            *redis.DurationCmd
}

// queueClaim adds the fast claim of op, ops[i], to p.
func (d *rdb) queueClaim(ctx context.Context, p redis.Pipeliner, i int, op driver.Op) fastClaim {
	leaseUS := micros(op.Lease)
	ttl := ttlMS(leaseUS + d.retUS)
	k := d.opts.Prefix + op.Key
	rec := fresh(op.LeaseID, op.Owner, compactHash(op.PayloadHash), leaseUS, ttl).encode()
	return fastClaim{
		i: i, leaseUS: leaseUS, ttlMS: ttl,
		set: p.SetNX(ctx, k, rec, time.Duration(ttl)*time.Millisecond),
		exp: p.PExpireTime(ctx, k),
	}
}

// queue adds the calls of sc (EVALSHA) to p.
func (d *rdb) queue(ctx context.Context, p redis.Pipeliner, sc *redis.Script, calls []*scriptCall) {
	for _, c := range calls {
		c.cmd = sc.EvalSha(ctx, p, []string{d.opts.Prefix + c.key}, c.args...)
	}
}

// evalNoScript sends again with EVAL, in one pipeline, the calls whose
// EVALSHA found no script: none of their operations was applied.
func (d *rdb) evalNoScript(ctx context.Context, sc *redis.Script, calls []*scriptCall) {
	var redo []*scriptCall
	for _, c := range calls {
		if redis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT") {
			redo = append(redo, c)
		}
	}
	if len(redo) == 0 {
		return
	}
	p := d.client.Pipeline()
	for _, c := range redo {
		c.cmd = sc.Eval(ctx, p, []string{d.opts.Prefix + c.key}, c.args...)
	}
	_, _ = p.Exec(ctx)
}

// results sets the result and error of each operation of calls.
func (d *rdb) results(calls []*scriptCall, ops []driver.Op, res []inbox.Claim, errs []error) {
	for _, c := range calls {
		v, err := c.cmd.Result()
		if err != nil {
			err = mapErr(err)
			for _, i := range c.ops {
				errs[i] = err
			}
			continue
		}
		if len(c.ops) == 1 {
			i := c.ops[0]
			res[i], errs[i] = reply(ops[i], v)
			continue
		}
		a, ok := v.([]any)
		if !ok || len(a) != len(c.ops) {
			for _, i := range c.ops {
				errs[i] = badReply(v)
			}
			continue
		}
		for j, i := range c.ops {
			res[i], errs[i] = reply(ops[i], a[j])
		}
	}
}

// reply decodes opsScript's reply v to op.
func reply(op driver.Op, v any) (inbox.Claim, error) {
	switch op.Kind {
	case driver.Claim:
		return claimReply(op, v)
	case driver.Complete, driver.Release, driver.Fail:
		if v != int64(1) {
			return inbox.Claim{}, holderError(op.LeaseID, v)
		}
	case driver.Extend:
		if until, ok := v.(int64); ok && until > 0 {
			return inbox.Claim{ExpiresAt: fromMicros(until)}, nil
		}
		return inbox.Claim{}, holderError(op.LeaseID, v)
	default:
		if v != int64(1) {
			return inbox.Claim{}, badReply(v)
		}
	}
	return inbox.Claim{}, nil
}

// claimReply decodes the reply of opsScript to a claim (B, O): {status,
// until, lease, now, mismatch, attempts} and, when dead, the reason. Busy
// is status 3 on a live lease, 5 in a backoff; Behind, 6, answers only a
// claim with an order key, until the end of the head's backoff or 0.
func claimReply(op driver.Op, v any) (inbox.Claim, error) {
	a, ok := v.([]any)
	var r [6]int64
	if !ok || len(a) < 6 || ints(a[:6], r[:]) != nil {
		return inbox.Claim{}, badReply(v)
	}
	status, until, granted, now, mismatch, attempts := r[0], r[1], r[2], r[3], r[4], r[5]
	n := 6 // the values of the reply: 7 with a dead key's reason
	if status == 4 {
		n = 7
	}
	if len(a) != n || (mismatch != 0 && mismatch != 1) || attempts < 0 {
		return inbox.Claim{}, badReply(v)
	}
	c := inbox.Claim{PayloadMismatch: mismatch == 1, Attempts: int(attempts)}
	switch status {
	case 1:
		if until <= 0 || granted <= 0 {
			return inbox.Claim{}, badReply(v)
		}
		c.Status, c.LeaseID, c.ExpiresAt, c.Lease = inbox.Acquired, op.LeaseID, fromMicros(until), time.Duration(granted)*time.Microsecond
	case 2:
		c.Status = inbox.Processed
	case 3, 5: // a live lease, a failed attempt's backoff
		c.Status, c.ExpiresAt, c.RetryAfter = inbox.Busy, fromMicros(until), time.Duration(until-now)*time.Microsecond
		c.BackingOff = status == 5
	case 6:
		if op.OrderKey == "" || until < 0 {
			return inbox.Claim{}, badReply(v)
		}
		c.Status = inbox.Behind
		if until > now {
			c.RetryAfter = time.Duration(until-now) * time.Microsecond
		}
	case 4:
		reason, ok := a[6].(string)
		if !ok {
			return inbox.Claim{}, badReply(v)
		}
		c.Status, c.Reason = inbox.Dead, reason
	default:
		return inbox.Claim{}, badReply(v)
	}
	return c, nil
}
