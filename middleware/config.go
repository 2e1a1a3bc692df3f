package inboxmw

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/keying"
)

// Defaults of [Config].
const (
	DefaultMaxBusyWait  = 10 * time.Second
	DefaultStoreTimeout = 5 * time.Second
)

// MissingKeyPolicy says what to do with a message that has no id to key it by.
type MissingKeyPolicy int

const (
	// MissingKeyProcess runs the handler without deduplication, logged and
	// counted (outcome no_key): a message is never dropped in silence. The
	// default.
	MissingKeyProcess MissingKeyPolicy = iota
	// MissingKeyReject returns an error wrapping [inbox.ErrNoKey] without
	// running the handler, meant for a poison queue.
	MissingKeyReject
)

// PayloadHashPolicy says whether the middleware fingerprints message content,
// and what it does when a known key arrives with different content.
type PayloadHashPolicy int

const (
	// PayloadHashOff sends no fingerprint. The default.
	PayloadHashOff PayloadHashPolicy = iota
	// PayloadHashWarn sends the payload's SHA-256; a known key with other
	// content is logged and counted (outcome payload_mismatch), then handled
	// as usual.
	PayloadHashWarn
	// PayloadHashReject is PayloadHashWarn that also refuses such a message
	// with an error wrapping [inbox.ErrPayloadMismatch].
	PayloadHashReject
)

// OrderOnDeadPolicy says what becomes of an order key ([Config.OrderKey])
// when one of its messages goes dead (MaxAttempts, or a permanent error).
type OrderOnDeadPolicy int

const (
	// OrderOnDeadBlock keeps the later messages of the order key waiting
	// behind the dead one until an operator lets them go (inboxctl
	// order-release, [inbox.OrderAdmin]): logged with the order key and
	// counted (outcome order_blocked). The default: no message of the
	// order key runs out of its order.
	OrderOnDeadBlock OrderOnDeadPolicy = iota
	// OrderOnDeadSkip lets the order key go on without the dead message:
	// the next one waiting runs, as if the dead one had been processed
	// (counted, outcome order_skipped). The dead message's key stays dead
	// (inboxctl forget replays it, then out of its order).
	OrderOnDeadSkip
)

// String returns the constant's name.
func (p OrderOnDeadPolicy) String() string {
	switch p {
	case OrderOnDeadBlock:
		return "OrderOnDeadBlock"
	case OrderOnDeadSkip:
		return "OrderOnDeadSkip"
	}
	return fmt.Sprintf("OrderOnDeadPolicy(%d)", int(p))
}

// Config configures [New]. Only Store, Bus and Group are required; every
// other field has a default. docs/middleware.md says which bound limits
// which wait, docs/retries.md how failed attempts are retried.
type Config struct {
	// Store is the inbox store. An [inbox.LeaseStore] (every store of this
	// project) gets the lease flow, a [TxStore] the transactional one. A
	// plain [inbox.Store] gets the ADR's check-then-mark: the lease flow
	// with IsProcessed as its claim and MarkProcessed as its mark, and no
	// lease behind them, so two concurrent deliveries of one message can
	// both run the handler.
	Store inbox.Store

	// Bus names the message bus in keys, e.g. "rabbit" or "kafka-prod".
	Bus string

	// Group names the consumer group or queue in keys: Watermill does not
	// expose it, and two groups must not share keys.
	Group string

	// Alias gives the key's alias segment, the message type. Default
	// [keying.AliasFromHandler]: the router handler's name.
	Alias keying.AliasFunc

	// IDSources are tried in order for the message's id. Default
	// [keying.DefaultIDSources]: the IdempotencyKey metadata field, then the
	// message UUID.
	IDSources []keying.IDSource

	// Lease is how long a claim lasts without renewal. Default
	// [inbox.DefaultLease] (30 s).
	Lease time.Duration

	// HeartbeatInterval is how often the lease of a handler still running
	// is extended. Default Lease/3; shorter than Lease.
	HeartbeatInterval time.Duration

	// MaxBusyWait bounds the in-process wait for a claim: on a key another
	// consumer holds (polled for at most the time its lease has left plus a
	// little), or on a failing store (see FailOpen). Then the message is
	// returned with an error wrapping [inbox.ErrBusy] or
	// [inbox.ErrStoreUnavailable], for the broker to redeliver later.
	// Default 10 s, short enough not to stall a Kafka rebalance; negative
	// means no wait.
	MaxBusyWait time.Duration

	// StoreTimeout bounds each hand-off to Redelivery, and each call to a
	// store that does not bound its calls itself (one not built on
	// stores/driver: every store of this project bounds its own). Default
	// 5 s.
	StoreTimeout time.Duration

	// FailOpen runs the handler without deduplication when the claim fails
	// (logged, and counted as outcome fail_open). Default false: the claims
	// of a failing store are retried with jittered backoff, paced across
	// the Inbox so that an outage costs the store a few calls a second, for
	// at most MaxBusyWait; then the message is nacked.
	FailOpen bool

	// MaxAttempts marks a key dead when its handler fails on the key's
	// MaxAttempts-th attempt or a later one: the middleware returns an
	// [inbox.DeadError] (not transient: route it to a poison queue), and
	// later deliveries get it without the handler until an operator forgets
	// the key (inboxctl forget). An attempt that fails before the last
	// returns an [inbox.AttemptError], transient for [IsTransient]. An
	// attempt is an acquisition of the key's lease ([inbox.Record.Attempts]),
	// whatever ended it (a nacked publish, a crash, a lost lease, a
	// PayloadHashReject refusal), so a key can die after fewer handler
	// failures, never without one. Default 0: unlimited, and a failed
	// attempt returns the handler's error as it is. Refused with a
	// [TxStore] or a plain Store, which count no attempts.
	MaxAttempts int

	// Backoff is how long a key stays unclaimable after its attempt-th
	// attempt failed: the store answers Busy until then, so the message
	// waits in the broker (Redelivery) or in-process (at most MaxBusyWait)
	// instead of spinning. Default [DefaultBackoff]; ExponentialBackoff(0,
	// 0) turns it off.
	Backoff func(attempt int) time.Duration

	// Redelivery hands a failed attempt's message to a delay its broker
	// holds (inboxamqp.Delays, inboxkafka.Retry): the consumer moves on at
	// once, the original is acked once the broker holds the copy, and the
	// copy comes back when the backoff ends. Waits shorter than
	// RedeliveryMinDelay, a message whose topic is unknown and a failed
	// hand-off fall back to returning the message to the broker as an
	// error. Default none.
	Redelivery Redeliverer

	// RedeliveryMinDelay is the shortest wait that Redelivery takes over.
	// Default [DefaultRedeliveryMinDelay] (1 ms).
	RedeliveryMinDelay time.Duration

	// OrderKey gives a message's order key (an aggregate's id; for Kafka's
	// record key, inboxkafka.OrderByRecordKey): the messages of one order
	// key that a queue or partition delivers in order run in that order,
	// also when one of them fails and Redelivery holds its backoff. The
	// later ones then wait behind it (the store answers [inbox.Behind] and
	// keeps their order; each is handed to Redelivery in turn), while
	// messages of other order keys go on. A dead message keeps its order
	// key waiting until an operator lets it go (inboxctl order-release),
	// or not, as OrderOnDead says.
	// "" gives a message no order; an error nacks it. The store must keep
	// order ([inbox.OrderAdmin]); New refuses one that does not, and a
	// TxStore. Default none: no order beyond the broker's.
	OrderKey func(*message.Message) (string, error)

	// OrderOnDead says what becomes of an order key when one of its
	// messages goes dead: it waits for an operator (OrderOnDeadBlock, the
	// default), or goes on without it (OrderOnDeadSkip). Only with
	// OrderKey.
	OrderOnDead OrderOnDeadPolicy

	// Tracer receives each message's claim, store calls and hand-offs.
	// Default none; inboxotel.New(tracerProvider) records them as spans.
	Tracer Tracer

	// MissingKey says what happens to a message without an id. Default
	// MissingKeyProcess.
	MissingKey MissingKeyPolicy

	// PayloadHash turns on content fingerprints. Default PayloadHashOff.
	PayloadHash PayloadHashPolicy

	// KeepOutputIDs leaves the messages the handler returns as they are. By
	// default each one without an IdempotencyKey gets one, and the same
	// UUID, derived from the input's key and its position ([OutputID]), so
	// that a handler that runs again for one input returns the same ids and
	// the next stage's inbox drops the second copies (docs/pipelines.md).
	KeepOutputIDs bool

	// Timestamp reads the time the broker took a message (inboxkafka and
	// inboxamqp have one), for the stale check: a message older than the
	// store's retention ([inbox.RetentionReporter]) less StaleMargin may be
	// a replay whose key has expired; it is logged and counted (outcome
	// stale), and refused under [StaleReject]. Default none: no check.
	Timestamp TimestampFunc

	// Stale says what happens to a stale message. Default StaleWarn.
	Stale StalePolicy

	// StaleMargin is taken off the store's retention before a message's age
	// is compared with it. Default a tenth of the retention.
	StaleMargin time.Duration

	// Owner names this consumer in the store's records. Default
	// [DefaultOwner]: "hostname/pid".
	Owner string

	// Logger receives the middleware's logs, which never hold payloads.
	// Default watermill.NopLogger.
	Logger watermill.LoggerAdapter

	// Metrics receives outcome counts and store call timings. Default none;
	// package inboxmetrics has a Prometheus one.
	Metrics Metrics
}

func (c *Config) setDefaults() {
	if c.Alias == nil {
		c.Alias = keying.AliasFromHandler()
	}
	if len(c.IDSources) == 0 {
		c.IDSources = keying.DefaultIDSources()
	}
	if c.Backoff == nil {
		c.Backoff = DefaultBackoff
	}
	orDefault(&c.Lease, inbox.DefaultLease)
	if c.Lease > 0 {
		orDefault(&c.HeartbeatInterval, c.Lease/3)
	}
	orDefault(&c.MaxBusyWait, DefaultMaxBusyWait)
	orDefault(&c.StoreTimeout, DefaultStoreTimeout)
	orDefault(&c.RedeliveryMinDelay, DefaultRedeliveryMinDelay)
	orDefault(&c.Owner, DefaultOwner())
	orDefault[watermill.LoggerAdapter](&c.Logger, watermill.NopLogger{})
	orDefault[Metrics](&c.Metrics, NopMetrics{})
}

func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// DefaultBackoff is the default of Config.Backoff: full-jitter exponential
// backoff, a duration drawn from [0, min(1 min, 1 s × 2^attempt)).
var DefaultBackoff = ExponentialBackoff(time.Second, time.Minute)

// ExponentialBackoff returns full-jitter exponential backoff for
// Config.Backoff: after the attempt-th failed attempt, a duration drawn
// uniformly from [0, min(limit, base × 2^attempt)). A zero limit or base
// turns backoff off.
func ExponentialBackoff(base, limit time.Duration) func(attempt int) time.Duration {
	return func(attempt int) time.Duration {
		if base <= 0 || limit <= 0 {
			return 0
		}
		d := limit
		if attempt >= 0 && attempt < 62 && base <= limit>>attempt {
			d = base << attempt
		}
		return rand.N(d)
	}
}

// DefaultOwner is the owner recorded with claims when none is configured:
// "hostname/pid", cut to [inbox.MaxOwnerLen] bytes.
func DefaultOwner() string {
	host, _ := os.Hostname()
	owner := host + "/" + strconv.Itoa(os.Getpid())
	return owner[:min(len(owner), inbox.MaxOwnerLen)]
}

// ErrInvalidConfig is wrapped by the errors of [Config.Validate].
var ErrInvalidConfig = fmt.Errorf("%w: invalid middleware config", inbox.ErrInvalidArgument)

// Validate reports every problem of c (after defaults), joined, each wrapping
// [ErrInvalidConfig].
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	_, tx := c.Store.(TxStore)
	_, leased := c.Store.(inbox.LeaseStore)
	if c.Store == nil {
		bad("Store is required")
	}
	if c.Bus == "" {
		bad("Bus is required")
	}
	if c.Group == "" {
		bad("Group is required")
	}
	if c.Bus != "" && c.Group != "" {
		kb := keying.Builder{Bus: c.Bus, Group: c.Group, Alias: c.Alias, IDSources: c.IDSources}
		if err := kb.Validate(); err != nil {
			bad("%v", err)
		}
	}
	if c.Lease < 0 {
		bad("Lease %s is negative", c.Lease)
	}
	// Zero means the default (Lease/3); report only what the user wrote.
	lease := c.Lease
	if lease == 0 {
		lease = inbox.DefaultLease
	}
	if c.HeartbeatInterval < 0 || (lease > 0 && c.HeartbeatInterval >= lease) {
		bad("HeartbeatInterval %s must be positive and shorter than Lease %s", c.HeartbeatInterval, lease)
	}
	if tx && c.FailOpen {
		bad("FailOpen cannot be used with a TxStore: its handler needs the store's transaction")
	}
	if tx && c.PayloadHash != PayloadHashOff {
		bad("PayloadHash is not supported with a TxStore: its claim records no fingerprint")
	}
	if c.StoreTimeout < 0 {
		bad("StoreTimeout %s is negative", c.StoreTimeout)
	}
	if c.RedeliveryMinDelay < 0 {
		bad("RedeliveryMinDelay %s is negative", c.RedeliveryMinDelay)
	}
	if c.MaxAttempts < 0 {
		bad("MaxAttempts %d is negative", c.MaxAttempts)
	} else if c.MaxAttempts > 0 && (tx || !leased) {
		bad("MaxAttempts needs an inbox.LeaseStore: a TxStore or a plain Store counts no attempts")
	}
	if c.MissingKey != MissingKeyProcess && c.MissingKey != MissingKeyReject {
		bad("MissingKey %d is not a MissingKeyPolicy", c.MissingKey)
	}
	if c.Stale != StaleWarn && c.Stale != StaleReject {
		bad("Stale %d is not a StalePolicy", c.Stale)
	}
	if c.StaleMargin < 0 {
		bad("StaleMargin %s is negative", c.StaleMargin)
	}
	if c.OrderOnDead != OrderOnDeadBlock && c.OrderOnDead != OrderOnDeadSkip {
		bad("OrderOnDead %d is not an OrderOnDeadPolicy", int(c.OrderOnDead))
	} else if c.OrderOnDead == OrderOnDeadSkip && c.OrderKey == nil {
		bad("OrderOnDead is OrderOnDeadSkip, and OrderKey is not set: there is no order key to go on")
	}
	if c.PayloadHash < PayloadHashOff || c.PayloadHash > PayloadHashReject {
		bad("PayloadHash %d is not a PayloadHashPolicy", c.PayloadHash)
	}
	if err := (inbox.BeginOptions{Owner: c.Owner}).Validate(); err != nil {
		bad("Owner: %v", err)
	}
	return errors.Join(errs...)
}
