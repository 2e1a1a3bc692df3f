package inboxmw

import (
	"context"

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
