package inboxmw

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
)

// TxStore is a store whose claim is a database transaction that the handler
// runs in, so that the key's mark commits with the handler's own writes or
// not at all: the SQL transactional mode of package
// github.com/watermill-inbox/inbox/stores/sql/txinbox. There is no lease:
// a concurrent delivery of the key waits on the uncommitted claim, for at
// most the store's lock timeout, so Config.Lease and HeartbeatInterval do
// not apply. Nor does StoreTimeout: BeginTx runs under the message's
// context, as its transaction lives on in the handler, and the commit
// (TxClaim.Finish) takes no context. MaxBusyWait does not bound the wait on
// a concurrent claim (the lock timeout does); it bounds the retries of a
// BeginTx that fails (the database down): they are paced as a LeaseStore's
// claims are, for at most MaxBusyWait, then the message is nacked with
// [inbox.ErrStoreUnavailable]. FailOpen, PayloadHash and MaxAttempts are
// refused.
type TxStore interface {
	inbox.Store

	// BeginTx begins a transaction and claims key in it: Status
	// [inbox.Processed] when the key is processed (the transaction is then
	// over), else [inbox.Acquired]. A concurrent claim waits for the other
	// transaction to end, for at most the store's lock timeout, then fails
	// with an error wrapping [inbox.ErrBusy]. An empty key begins a
	// transaction without a claim, for a message without an id.
	BeginTx(ctx context.Context, key string) (TxClaim, error)
}

// TxClaim is an acquired claim of [TxStore.BeginTx].
type TxClaim struct {
	Status inbox.Status

	// Context is the handler's: BeginTx's, with the transaction in it.
	Context context.Context

	// Finish ends the transaction; the middleware calls it exactly once.
	// With handlerErr nil it stores out, the messages the handler returned,
	// in the transaction (or refuses them) and commits the handler's writes
	// with the mark: nil means the key is processed. Otherwise it rolls back
	// and returns handlerErr.
	Finish func(out []*message.Message, handlerErr error) error
}

// ---- The transactional flow (a TxStore) -----------------------------------

// handleTx claims the key in a transaction of the store's, which the
// handler runs in, and commits the mark with the handler's writes. Without
// a key, the transaction holds no claim.
func (m *msgCall) handleTx() ([]*message.Message, error) {
	// The store bounds the wait on a concurrent claim by its lock timeout,
	// and the transaction lives on in the handler: it is begun with the
	// message context.
	var claim TxClaim
	err := m.paced(m.msg.Context(), time.Now().Add(m.ib.cfg.MaxBusyWait), OpTryBegin, func(context.Context) (err error) {
		claim, err = m.ib.txs.BeginTx(m.msg.Context(), m.key)
		return err
	})
	var be *inbox.BusyError
	switch {
	case errors.As(err, &be):
		return nil, m.busy(be.RetryAfter, be.BackingOff)
	case errors.Is(err, inbox.ErrBusy):
		return nil, m.busy(0, false)
	case err != nil:
		return nil, m.claimFailed(OpTryBegin, err)
	case claim.Status == inbox.Processed:
		return m.duplicate()
	}
	return m.runTx(claim)
}

// runTx runs the handler in the claim's transaction and ends it. Processed
// and released are counted only for a claimed key (a message without a key
// was counted as no_key).
func (m *msgCall) runTx(claim TxClaim) ([]*message.Message, error) {
	claimed := m.key != ""
	if claimed {
		m.trace(OutcomeAcquired)
	}
	count := func(o Outcome) {
		if claimed || o == OutcomeStoreError {
			m.ib.m.Outcome(m.handler, o)
		}
	}
	out, err := m.runHandler(claim.Context, func(why string) {
		_ = claim.Finish(nil, errors.New("inbox: "+why))
		count(OutcomeReleased)
	})
	if err != nil {
		count(OutcomeReleased)
		err = claim.Finish(nil, err)
		// The store counts no attempts: the copies do (MetadataAttempts).
		if n := attemptsOf(m.msg) + 1; claimed && !errors.Is(err, inbox.ErrPermanent) && m.ib.cfg.Redelivery != nil {
			if d := m.ib.cfg.Backoff(n); m.redeliverable(d) && m.redeliver(d, n, err) == nil {
				return nil, nil // rolled back; the broker holds a copy until the backoff ends
			}
		}
		return nil, err
	}
	// The commit, timed and traced as a store call; Finish takes no context.
	err = m.storeCall(m.msg.Context(), OpComplete, func(context.Context) error { return claim.Finish(out, nil) })
	switch {
	case err == nil:
		count(OutcomeProcessed)
	case errors.Is(err, inbox.ErrStoreUnavailable):
		count(OutcomeStoreError)
	default:
		count(OutcomeReleased)
	}
	return nil, err
}
