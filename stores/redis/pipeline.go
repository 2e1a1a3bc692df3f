package redisstore

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// MaxCompleteDelay is the longest Options.CompleteDelay.
const MaxCompleteDelay = time.Second

// maxPendingMarks is the batch of Completes that is sent at once, without
// waiting for a TryBegin or for CompleteDelay.
const maxPendingMarks = 128

// pendingMark is a Complete waiting to be sent (Options.CompleteDelay).
type pendingMark struct {
	key, leaseID string
	done         chan error // buffered: a flush never waits for a caller that went away
}

// marks holds the Completes waiting to be sent.
type marks struct {
	mu      sync.Mutex
	pending []*pendingMark
	timer   *time.Timer // flushes CompleteDelay after the first pending mark
}

// take removes and returns the pending marks; call with mu held.
func (m *marks) take() []*pendingMark {
	b := m.pending
	if len(b) > 0 {
		m.pending = nil
		m.timer.Stop()
	}
	return b
}

func (s *Store) takeMarks() []*pendingMark {
	if s.marks == nil {
		return nil
	}
	s.marks.mu.Lock()
	b := s.marks.take()
	s.marks.mu.Unlock()
	return b
}

// completeLater queues a Complete to travel with the next TryBegin, or with
// other Completes when CompleteDelay has passed or the batch is full, and
// waits for its result.
func (s *Store) completeLater(ctx context.Context, key, leaseID string) error {
	const op = "Complete"
	if err := ctx.Err(); err != nil {
		return ctxError(op, key, err, err)
	}
	p := &pendingMark{key: key, leaseID: leaseID, done: make(chan error, 1)}
	m := s.marks
	m.mu.Lock()
	// Under mu, so that Close, which sets closed before it takes the
	// pending marks, either sees this one or is seen.
	if s.closed.Load() {
		m.mu.Unlock()
		return closedError(op, key)
	}
	m.pending = append(m.pending, p)
	var full []*pendingMark
	switch {
	case len(m.pending) >= maxPendingMarks:
		full = m.take()
	case len(m.pending) == 1:
		m.timer.Reset(s.opts.CompleteDelay)
	}
	m.mu.Unlock()
	if full != nil {
		s.pipeline(ctx, full, nil)
	}
	select {
	case err := <-p.done:
		return err
	case <-ctx.Done():
		// The mark may still be sent: a Complete repeated by its lease
		// succeeds, so the caller's retry is safe either way.
		return ctxError(op, key, ctx.Err(), ctx.Err())
	}
}

// fastClaim is a claim of a key that Redis may not hold: SET NX PX of the
// fresh record and PEXPIRETIME of the key, in one round trip (see
// scripts.go).
type fastClaim struct {
	key   string
	rec   []byte // the fresh record
	ttlMS int64  // its physical TTL
	// expiry is, after the round trip, the key's absolute expiry in
	// milliseconds of the Redis clock when SET NX wrote the fresh record;
	// -1 when the key existed (or its expiry could not be read), so the
	// TryBegin script must decide.
	expiry int64
}

// queue adds the claim's commands to p.
func (fc *fastClaim) queue(ctx context.Context, p redis.Pipeliner, prefix string) (*redis.BoolCmd, *redis.DurationCmd) {
	k := prefix + fc.key
	return p.SetNX(ctx, k, fc.rec, time.Duration(fc.ttlMS)*time.Millisecond), p.PExpireTime(ctx, k)
}

// result reads the replies of queue's commands into fc.expiry, or returns
// the error of SET.
func (fc *fastClaim) result(set *redis.BoolCmd, exp *redis.DurationCmd) error {
	fc.expiry = -1
	ok, err := set.Result()
	if err != nil {
		return err
	}
	// An error of PEXPIRETIME after a SET that wrote, or a negative
	// expiry (the key is gone already), leaves the decision to the script:
	// it finds this lease's record, if any, and renews it.
	if e, err := exp.Result(); ok && err == nil && e >= 0 {
		fc.expiry = int64(e / time.Millisecond)
	}
	return nil
}

// tryBeginWith runs the fast claim fc with the pending marks of batch.
func (s *Store) tryBeginWith(ctx context.Context, batch []*pendingMark, fc *fastClaim) error {
	const op = "TryBegin"
	if s.closed.Load() || ctx.Err() != nil {
		s.pipeline(ctx, batch, nil) // the marks go anyway
		if s.closed.Load() {
			return closedError(op, fc.key)
		}
		return ctxError(op, fc.key, ctx.Err(), ctx.Err())
	}
	return s.pipeline(ctx, batch, fc)
}

// flushMarks sends the pending marks on their own: CompleteDelay has passed
// without a TryBegin to carry them, or the store is closing.
func (s *Store) flushMarks() {
	if b := s.takeMarks(); len(b) > 0 {
		s.pipeline(context.Background(), b, nil)
	}
}

// pipeline sends the marks of batch and, when fc is not nil, the fast claim
// fc in one round trip, the marks first, delivers each mark's result to its
// caller and returns the claim's error. It runs under a context detached
// from ctx (bounded by Options.Timeout), so that a caller that goes away
// does not fail the marks of other messages.
func (s *Store) pipeline(ctx context.Context, batch []*pendingMark, fc *fastClaim) error {
	pctx, cancel := context.WithoutCancel(ctx), context.CancelFunc(func() {})
	if s.opts.Timeout > 0 {
		pctx, cancel = context.WithTimeout(pctx, s.opts.Timeout)
	}
	defer cancel()
	cmds := make([]*redis.Cmd, 0, len(batch))
	var set *redis.BoolCmd
	var exp *redis.DurationCmd
	_, _ = s.client.Pipelined(pctx, func(p redis.Pipeliner) error {
		for _, m := range batch {
			cmds = append(cmds, completeScript.EvalSha(pctx, p, []string{s.opts.Prefix + m.key}, m.leaseID, s.retention, s.retTTL))
		}
		if fc != nil {
			set, exp = fc.queue(pctx, p, s.opts.Prefix)
		}
		return nil
	})
	// A server that lost its script cache (a restart, SCRIPT FLUSH) answers
	// NOSCRIPT: run those commands again one by one, which loads the script.
	for i, c := range cmds {
		if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			cmds[i] = completeScript.Run(pctx, s.client, []string{s.opts.Prefix + batch[i].key}, batch[i].leaseID, s.retention, s.retTTL)
		}
	}
	for i, m := range batch {
		v, err := cmds[i].Result()
		if err != nil {
			err = s.fail(pctx, "Complete", m.key, err)
		} else {
			err = completeReply(m.key, m.leaseID, v)
		}
		m.done <- err
	}
	if fc == nil {
		return nil
	}
	if err := fc.result(set, exp); err != nil {
		return s.fail(pctx, "TryBegin", fc.key, err)
	}
	return nil
}

// completeReply maps the reply of the Complete script.
func completeReply(key, leaseID string, v any) error {
	if code, ok := v.(int64); !ok || code != 1 {
		return holderError("Complete", key, leaseID, code, v)
	}
	return nil
}
