package inboxmw

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// handlePlain is the ADR's flow for a store without leases: IsProcessed, run,
// MarkProcessed once the router acks. Two concurrent deliveries of one
// message can both pass IsProcessed and both run the handler.
func (ib *Inbox) handlePlain(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	ctx := msg.Context()
	handler := message.HandlerNameFromCtx(ctx)
	key, _, err := ib.keys.KeyString(msg)
	if err != nil {
		return ib.keyError(h, msg, handler, err)
	}
	if !ib.track() {
		return nil, errClosed
	}
	marking := false
	defer func() {
		if !marking {
			ib.untrack()
		}
	}()
	instantAcked := isClosedChan(msg.Acked())

	cctx, cancel := ib.bounded(ctx)
	start := ib.startCall()
	done, err := ib.cfg.Store.IsProcessed(cctx, key)
	cancel()
	ib.endCall(OpIsProcessed, start, err)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil, err
		}
		ib.m.Outcome(handler, OutcomeStoreError)
		err = storeErr(OpIsProcessed, key, err)
		if !ib.cfg.FailOpen {
			ib.log.Error("Inbox store failed; message nacked for redelivery", err, ib.fields(msg, handler, key))
			return nil, err
		}
		ib.m.Outcome(handler, OutcomeFailOpen)
		ib.log.Error("Inbox store failed; processing WITHOUT deduplication (FailOpen)", err, ib.fields(msg, handler, key))
	}
	if done {
		ib.m.Outcome(handler, OutcomeDuplicate)
		ib.log.Debug("Duplicate message skipped: key already processed", ib.fields(msg, handler, key))
		return nil, nil
	}

	out, err := h(msg)
	if err != nil {
		return out, err
	}
	marking = true
	go ib.markPlain(msg, ctx, handler, key, instantAcked || isClosedChan(msg.Acked()))
	return out, nil
}

// markPlain waits for the router's ack, then marks the key, retrying for up
// to the configured lease length.
func (ib *Inbox) markPlain(msg *message.Message, parent context.Context, handler, key string, acked bool) {
	defer ib.untrack()
	if !acked {
		select {
		case <-msg.Acked():
		case <-msg.Nacked():
			ib.m.Outcome(handler, OutcomeReleased)
			return
		case <-ib.abandon:
			return
		}
	}
	f := watermill.LogFields{"message_uuid": msg.UUID, "handler_name": handler, "inbox_key": key}
	giveUp := time.Now().Add(ib.cfg.Lease)
	backoff := 50 * time.Millisecond
	for {
		ctx, cancel := ib.detached(parent)
		start := ib.startCall()
		err := ib.cfg.Store.MarkProcessed(ctx, key)
		cancel()
		ib.endCall(OpMarkProcessed, start, err)
		if err == nil {
			ib.m.Outcome(handler, OutcomeProcessed)
			return
		}
		ib.m.Outcome(handler, OutcomeStoreError)
		if time.Now().After(giveUp) {
			ib.m.Outcome(handler, OutcomeCompleteFailed)
			ib.log.Error("Inbox mark failed for the whole retry window: a redelivery will run the handler again", err, f)
			return
		}
		ib.m.Outcome(handler, OutcomeCompleteRetry)
		ib.log.Info("Inbox mark failed after a successful handler; retrying in the background", f.Add(watermill.LogFields{"error": err.Error()}))
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ib.abandon:
			t.Stop()
			return
		}
		backoff = min(2*backoff, time.Second)
	}
}
