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
		s.pipeline(ctx, full, "", nil)
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

// tryBeginWith runs a TryBegin that carries the pending marks of batch.
func (s *Store) tryBeginWith(ctx context.Context, batch []*pendingMark, key string, args []any) (any, error) {
	const op = "TryBegin"
	if s.closed.Load() || ctx.Err() != nil {
		s.pipeline(ctx, batch, "", nil) // the marks go anyway
		if s.closed.Load() {
			return nil, closedError(op, key)
		}
		return nil, ctxError(op, key, ctx.Err(), ctx.Err())
	}
	return s.pipeline(ctx, batch, key, args)
}

// flushMarks sends the pending marks on their own: CompleteDelay has passed
// without a TryBegin to carry them, or the store is closing.
func (s *Store) flushMarks() {
	if b := s.takeMarks(); len(b) > 0 {
		s.pipeline(context.Background(), b, "", nil)
	}
}

// pipeline sends the marks of batch and, when args is not nil, the TryBegin
// of key in one round trip, the marks first, delivers each mark's result to
// its caller and returns the TryBegin's reply. It runs under a context
// detached from ctx (bounded by Options.Timeout), so that a caller that goes
// away does not fail the marks of other messages.
func (s *Store) pipeline(ctx context.Context, batch []*pendingMark, key string, args []any) (any, error) {
	pctx, cancel := context.WithoutCancel(ctx), context.CancelFunc(func() {})
	if s.opts.Timeout > 0 {
		pctx, cancel = context.WithTimeout(pctx, s.opts.Timeout)
	}
	defer cancel()
	cmds := make([]*redis.Cmd, 0, len(batch)+1)
	_, _ = s.client.Pipelined(pctx, func(p redis.Pipeliner) error {
		for _, m := range batch {
			cmds = append(cmds, completeScript.EvalSha(pctx, p, []string{s.opts.Prefix + m.key}, m.leaseID, s.retention, s.retTTL))
		}
		if args != nil {
			cmds = append(cmds, tryBeginScript.EvalSha(pctx, p, []string{s.opts.Prefix + key}, args...))
		}
		return nil
	})
	// A server that lost its script cache (a restart, SCRIPT FLUSH) answers
	// NOSCRIPT: run those commands again one by one, which loads the script.
	for i, c := range cmds {
		if !redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			continue
		}
		if i < len(batch) {
			cmds[i] = completeScript.Run(pctx, s.client, []string{s.opts.Prefix + batch[i].key}, batch[i].leaseID, s.retention, s.retTTL)
		} else {
			cmds[i] = tryBeginScript.Run(pctx, s.client, []string{s.opts.Prefix + key}, args...)
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
	if args == nil {
		return nil, nil
	}
	v, err := cmds[len(batch)].Result()
	if err != nil {
		return nil, s.fail(pctx, "TryBegin", key, err)
	}
	return v, nil
}

// completeReply maps the reply of the Complete script.
func completeReply(key, leaseID string, v any) error {
	if code, ok := v.(int64); !ok || code != 1 {
		return holderError("Complete", key, leaseID, code, v)
	}
	return nil
}
