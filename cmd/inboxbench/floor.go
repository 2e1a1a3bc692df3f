package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox/internal/batch"
	"github.com/watermill-inbox/inbox/stores/driver"
)

// The Redis store's batching (stores/redis: maxBatch, maxQueue,
// maxInFlight), which the floor copies so that both group their calls
// alike.
const (
	floorMaxBatch    = 128
	floorMaxQueue    = 4096
	floorMaxInFlight = 2
)

// floor is the least any claim on Redis can cost: one bare
// SET <prefix><uuid> 1 NX PX <lease> per message, nothing after the handler
// (no mark, no release, no lease renewal), sent through the group commit the
// stores use (internal/batch, with the Redis store's bounds): concurrent
// claims travel together, one pipeline per batch. A message whose key is
// already set is a duplicate and is acked without running the handler; a
// failed SET nacks the message.
type floor struct {
	c      *redis.Client
	prefix string
	px     string
	b      *batch.Batcher[string, bool]
	// counter counts the round trips as a driver.Store counts its own.
	counter driver.BatchCounter
}

func newFloor(c *redis.Client, prefix string, lease time.Duration) *floor {
	f := &floor{c: c, prefix: prefix, px: strconv.FormatInt(lease.Milliseconds(), 10)}
	f.b = batch.New(f.apply, batch.Options{MaxBatch: floorMaxBatch, MaxQueue: floorMaxQueue, MaxInFlight: floorMaxInFlight})
	return f
}

// apply is one round trip: a pipeline of one SET NX PX per message id.
// Errors are per command (a broken connection fails every command of the
// pipeline); res[i] tells whether SET wrote, that is claimed, ids[i].
func (f *floor) apply(ctx context.Context, ids []string, res []bool, errs []error) error {
	f.counter.Add(len(ids))
	p := f.c.Pipeline()
	cmds := make([]*redis.Cmd, len(ids))
	for i, id := range ids {
		// Do, not SetNX: SetNX sends EX for whole seconds.
		cmds[i] = p.Do(ctx, "set", f.prefix+id, "1", "nx", "px", f.px)
	}
	_, _ = p.Exec(ctx) // errors are the commands'
	for i, cmd := range cmds {
		switch err := cmd.Err(); {
		case err == nil:
			res[i] = true
		case errors.Is(err, redis.Nil): // the key was set: claimed before
		default:
			errs[i] = err
		}
	}
	return nil
}

// BatchStats counts the floor's round trips as [driver.Store.BatchStats]
// counts a store's.
func (f *floor) BatchStats() driver.BatchStats { return f.counter.Stats() }

// middleware claims each message by its UUID before the handler.
func (f *floor) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		claimed, err := f.b.Do(msg.Context(), msg.UUID)
		if err != nil {
			return nil, fmt.Errorf("floor-redis claim: %w", err)
		}
		if !claimed {
			return nil, nil // claimed before: a duplicate, acked
		}
		return h(msg)
	}
}
