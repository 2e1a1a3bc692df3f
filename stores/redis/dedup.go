package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-inbox/inbox"
)

// DefaultDedupPrefix is the key prefix of an [ExpiringKeyRepository] when
// ExpiringKeyRepositoryOptions.Prefix is empty.
const DefaultDedupPrefix = "watermill-dedup:"

// DefaultDedupWindow is the window of an [ExpiringKeyRepository] when
// ExpiringKeyRepositoryOptions.Window is zero: one minute, the window of the
// in-memory repository that Watermill's Deduplicator uses by default.
const DefaultDedupWindow = time.Minute

// ExpiringKeyRepositoryOptions configure an [ExpiringKeyRepository]. The
// zero value is usable.
type ExpiringKeyRepositoryOptions struct {
	// Prefix is prepended to every key. Optional; default
	// [DefaultDedupPrefix]. Keep it apart from the prefix of a [Store] on the
	// same Redis.
	Prefix string

	// Window is how long a key is remembered. Optional; default
	// [DefaultDedupWindow]; at least a millisecond.
	Window time.Duration
}

// Validate reports whether o is usable once defaults are applied. Errors
// wrap [inbox.ErrInvalidArgument].
func (o ExpiringKeyRepositoryOptions) Validate() error {
	if len(o.Prefix) > MaxPrefixLen {
		return fmt.Errorf("%w: redis dedup repository: Prefix is %d bytes, longer than the limit of %d", inbox.ErrInvalidArgument, len(o.Prefix), MaxPrefixLen)
	}
	if o.Window != 0 && (o.Window < time.Millisecond || o.Window > MaxDuration) {
		return fmt.Errorf("%w: redis dedup repository: Window %s is outside [1ms, %s]", inbox.ErrInvalidArgument, o.Window, MaxDuration)
	}
	return nil
}

// ExpiringKeyRepository implements Watermill's
// [middleware.ExpiringKeyRepository] on Redis, so that the Deduplicator of
// Watermill's router shares what it has seen between consumers and across
// restarts (watermill#626 asks for this). It is here for applications that
// already use the Deduplicator; new code should use this project's inbox
// middleware with a [Store] instead, which is safer:
//
//   - The Deduplicator records a key before the handler runs and never
//     removes it. When the handler fails, the broker redelivers the message,
//     the Deduplicator finds the key, calls it a duplicate and acks it: the
//     message is lost. The inbox marks a key processed only after its
//     handler succeeded and the message was acked, and a failed handler's
//     key is released for the redelivery.
//   - The Deduplicator has no leases: while the first delivery is still in
//     its handler, a second one is dropped as a duplicate even if the first
//     then fails; with the inbox the second waits or is redelivered.
//   - The Deduplicator's key is a hash of the payload (Adler-32 by default,
//     which collides), not the message's id, and it is not scoped by
//     consumer group: two groups that must both process a message share one
//     key unless each gets a repository with its own Prefix. The inbox key
//     is bus:group:alias:id.
//
// IsDuplicate is one SET key 1 NX PX window: atomic, so of concurrent calls
// for one key exactly one reports false.
type ExpiringKeyRepository struct {
	client redis.UniversalClient
	prefix string
	window time.Duration
}

var _ middleware.ExpiringKeyRepository = (*ExpiringKeyRepository)(nil)

// NewExpiringKeyRepository returns a repository over client, which it does
// not close.
func NewExpiringKeyRepository(client redis.UniversalClient, opts ExpiringKeyRepositoryOptions) (*ExpiringKeyRepository, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: redis dedup repository: client is nil", inbox.ErrInvalidArgument)
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultDedupPrefix
	}
	if opts.Window == 0 {
		opts.Window = DefaultDedupWindow
	}
	return &ExpiringKeyRepository{client: client, prefix: opts.Prefix, window: opts.Window}, nil
}

// IsDuplicate reports whether key was seen within the window, and records
// it when it was not. Errors wrap [inbox.ErrStoreUnavailable] (or the
// context's error), so the Deduplicator returns them and the message is
// nacked.
func (r *ExpiringKeyRepository) IsDuplicate(ctx context.Context, key string) (bool, error) {
	err := r.client.SetArgs(ctx, r.prefix+key, "1", redis.SetArgs{Mode: "NX", TTL: r.window}).Err()
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, redis.Nil):
		return true, nil
	case errors.Is(err, context.Canceled):
		return false, fmt.Errorf("redis dedup repository: IsDuplicate %q: %w", key, err)
	}
	return false, fmt.Errorf("redis dedup repository: IsDuplicate %q: %w: %w", key, inbox.ErrStoreUnavailable, err)
}
