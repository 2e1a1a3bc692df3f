package inboxmw

import (
	"context"
	"fmt"
	"time"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/batch"
	"github.com/watermill-inbox/inbox/stores/driver"
)

// plainLeases gives a plain [inbox.Store] (no leases) the methods of an
// [inbox.LeaseStore], so that it goes through the lease flow: TryBegin is
// IsProcessed (Processed, else Acquired with the lease asked for),
// Complete is MarkProcessed, and the rest hold nothing: Release and Fail
// have nothing to give back, Extend nothing to lose (it succeeds, so that
// a long handler is never canceled for a lease that does not exist), Get
// reads IsProcessed. The store counts no attempts (the claim's Attempts is
// 0), holds no backoff and marks nothing dead. Nothing keeps two
// concurrent deliveries of one message apart: both can run the handler.
type plainLeases struct{ inbox.Store }

var _ inbox.LeaseStore = plainLeases{}

func (p plainLeases) TryBegin(ctx context.Context, key string, opts inbox.BeginOptions) (inbox.Claim, error) {
	done, err := p.IsProcessed(ctx, key)
	switch {
	case err != nil:
		return inbox.Claim{}, err
	case done:
		return inbox.Claim{Status: inbox.Processed}, nil
	}
	return inbox.Claim{Status: inbox.Acquired, LeaseID: opts.LeaseID, Lease: opts.Lease}, nil
}

func (p plainLeases) Complete(ctx context.Context, key, _ string) error {
	return p.MarkProcessed(ctx, key)
}

func (plainLeases) Release(context.Context, string, string) error { return nil }

func (plainLeases) Fail(context.Context, string, string, inbox.FailOptions) error { return nil }

func (plainLeases) Extend(_ context.Context, _, _ string, lease time.Duration) (time.Time, error) {
	return time.Now().Add(lease), nil
}

func (p plainLeases) Get(ctx context.Context, key string) (inbox.Record, error) {
	done, err := p.IsProcessed(ctx, key)
	if err != nil || !done {
		return inbox.Record{}, err
	}
	return inbox.Record{State: inbox.StateProcessed}, nil
}

// goer makes a store call without the caller waiting for its answer, which
// goes to then: [driver.Store.Go], which every store of this project has,
// or workers.
type goer interface {
	Go(ctx context.Context, op driver.Op, then func(inbox.Claim, error))
}

// storeWorkers is how many goroutines make the marks, releases and
// Extends of a store without a Go method.
const storeWorkers = 16

// workers is the goer of a store without a Go method (a store of your
// own, a wrapper that hides Go, a plain Store): a fixed set of
// storeWorkers goroutines, started on first use and stopped by Close, each
// making one call at a time, bounded by Config.StoreTimeout (one timer for
// all of them); calls beyond them wait in a bounded queue.
type workers struct {
	b *batch.Batcher[driver.Op, inbox.Claim]
}

func newWorkers(s inbox.LeaseStore, timeout time.Duration) workers {
	apply := func(ctx context.Context, ops []driver.Op, res []inbox.Claim, errs []error) error {
		for i, op := range ops { // one: the batches hold one call each
			switch op.Kind {
			case driver.Complete:
				errs[i] = s.Complete(ctx, op.Key, op.LeaseID)
			case driver.Release:
				errs[i] = s.Release(ctx, op.Key, op.LeaseID)
			case driver.Extend:
				res[i].ExpiresAt, errs[i] = s.Extend(ctx, op.Key, op.LeaseID, op.Lease)
			default:
				errs[i] = fmt.Errorf("%w: operation %v", inbox.ErrNotSupported, op.Kind)
			}
		}
		return nil
	}
	return workers{batch.New(apply, batch.Options{MaxBatch: 1, MaxInFlight: storeWorkers, Timeout: timeout})}
}

func (w workers) Go(ctx context.Context, op driver.Op, then func(inbox.Claim, error)) {
	w.b.Go(ctx, op, then)
}

func (w workers) Close() { w.b.Close() }
