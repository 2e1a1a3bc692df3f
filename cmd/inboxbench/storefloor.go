package main

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	inboxmw "github.com/watermill-inbox/inbox/middleware"
	"github.com/watermill-inbox/inbox/stores/driver"
)

// storeFloor is store-redis: the inbox's own Redis store under the floors'
// shallow middleware. It claims each message (the store's TryBegin with a
// lease id, as the inbox does) before the handler and, once the router
// acked the message, marks it with the Complete that the middleware sends
// (through the store's Go, carrying what the claim wrote), as
// floor2f-redis marks in a goroutine that waits for the ack. It has no key
// building, lease keeping, handler context, metrics or logs: between
// floor2f-redis and it lies what the store's record and claim cost (the
// record's fields, PEXPIRETIME, the mark's arguments), between it and
// inbox-redis what the middleware's own path costs.
type storeFloor struct {
	s      *driver.Store
	prefix string // the key before the message UUID
	owner  string // as the middleware's default
	tally  markTally
}

func (f *storeFloor) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		key := f.prefix + msg.UUID
		opts := inbox.BeginOptions{Owner: f.owner, Lease: inbox.DefaultLease, LeaseID: inbox.NewLeaseID()}
		c, err := f.s.TryBegin(msg.Context(), key, opts)
		if err != nil {
			return nil, fmt.Errorf("store-redis claim of %s: %w", key, err)
		}
		if c.Status != inbox.Acquired {
			return nil, nil // claimed or processed before: a duplicate, acked
		}
		out, err := h(msg)
		if err != nil {
			return out, err
		}
		f.tally.pending.Add(1)
		go f.markAfterAck(msg, driver.Op{Kind: driver.Complete, Key: key, LeaseID: c.LeaseID, Owner: f.owner, Lease: c.Lease, ExpiresAt: c.ExpiresAt})
		return out, nil
	}
}

// markAfterAck marks op.Key once the router acked msg (nothing if it nacked
// it), bounded by the inbox's store timeout, as the floors do.
func (f *storeFloor) markAfterAck(msg *message.Message, op driver.Op) {
	select {
	case <-msg.Acked():
	case <-msg.Nacked():
		f.tally.pending.Done()
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), inboxmw.DefaultStoreTimeout)
	f.s.Go(ctx, op, func(_ inbox.Claim, err error) {
		cancel()
		if err != nil {
			f.tally.failed(fmt.Errorf("mark of %s: %w", op.Key, err))
		}
		f.tally.pending.Done()
	})
}

// drain waits for the marks of the messages handled so far, as
// floor.drain does.
func (f *storeFloor) drain(ctx context.Context) error { return f.tally.drain(ctx, "store-redis") }
