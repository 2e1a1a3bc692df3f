package inboxmw

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
)

// TxStore is a store whose claim is a database transaction that the handler
// runs in, so that the key's mark commits with the handler's own writes, or
// neither does: the SQL transactional mode of package
// github.com/watermill-inbox/inbox/stores/sql/txinbox. Given one as
// [Config.Store], the middleware keeps its flow (keys, outcomes, logs,
// metrics, missing keys, payload-free errors) and the store holds the
// message's transaction from claim to commit. There is no lease: a
// concurrent delivery of the key blocks on the uncommitted claim, so
// Config.Lease, HeartbeatInterval and MaxBusyWait do not apply, and
// Config.FailOpen is refused (the handler needs the transaction).
type TxStore interface {
	inbox.Store

	// BeginTx begins a transaction and claims key in it. The claim's Status
	// is:
	//   - [inbox.Processed]: the key was marked processed; the transaction
	//     is over, and Context and Finish are nil.
	//   - [inbox.Acquired]: the handler runs with Context (the transaction
	//     is in it); Finish ends the transaction.
	// A concurrent claim of key waits for the other transaction to end, for
	// at most the store's lock timeout, then fails with an error wrapping
	// [inbox.ErrBusy]. An empty key begins a transaction without a claim, for
	// a message without an id processed under [MissingKeyProcess].
	BeginTx(ctx context.Context, key string) (TxClaim, error)
}

// TxClaim is the result of [TxStore.BeginTx].
type TxClaim struct {
	Status inbox.Status

	// Context is the handler's context: the message context passed to
	// BeginTx, with the transaction.
	Context context.Context

	// Finish ends the transaction, and is called exactly once. With
	// handlerErr nil it stores out, the messages the handler returned, in
	// the transaction (an outbox: the router gets none to publish after the
	// commit) or refuses them, and commits the handler's writes with the
	// mark; a nil result means the key is processed. With handlerErr set (a
	// handler error, or a panic) it rolls the transaction back and returns
	// handlerErr.
	Finish func(out []*message.Message, handlerErr error) error
}
